"""An inventory source the sync skipped, told as one Datadog event per source each sync, grouped in the event
stream by source, its error named by class and never by a secret."""

from __future__ import annotations

import re

from gpufarm.core.inventory.sources import Ledger, log
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ports import (
    Event,
    EventSink,
    SourceError,
)

EVENT_SOURCE_TAG = "gpufarm:inventory"


MAX_EVENT_PARTS = 20


# An error's class as the sources write it: an exception or an API error code, with an HTTP status at most.
_CLASS_RE = re.compile(r"^[A-Z][A-Za-z0-9_.]{0,79}(?: [0-9]{3})?$")


def error_class(error: SourceError) -> str:
    """What kind of failure a source error was (`RequestLimitExceeded`, `HttpResponseError 429`, `Timeout`).

    Read from the message's leading parts (`<step>: <class>: <text>` or `<class>: <text>`), never its free text,
    which is the source's to write and is left out of events.
    """
    for part in error.message.split(": ")[:2]:
        if _CLASS_RE.match(part):
            return part
    return "Timeout" if error.message.startswith("no answer within") else "Error"


def source_events(ledger: Ledger, timestamp: int) -> list[Event]:
    """One event per source this sync skipped (a part of it or all): title, source, error classes, where.

    The parts are named (regions, subscriptions, pools) with their error class only; messages are not carried,
    so nothing a source's answer held (a URL, a request) reaches the event stream. Events of one source share an
    aggregation key, so a source failing sync after sync is one group in the stream.
    """
    by_source: dict[str, list[SourceError]] = {}
    for error in ledger.errors:
        by_source.setdefault(error.source, []).append(error)
    events: list[Event] = []
    for source, errors in sorted(by_source.items()):
        classes = sorted({error_class(e) for e in errors})
        throttled = all(e.throttled for e in errors)
        lines = [
            f"- {e.where}: {error_class(e)}{' (throttled)' if e.throttled else ''}" for e in errors[:MAX_EVENT_PARTS]
        ]
        if len(errors) > MAX_EVENT_PARTS:
            lines.append(f"- and {len(errors) - MAX_EVENT_PARTS} more")
        text = (
            f"The inventory sync could not read {len(errors)} part(s) of source {source} and skipped them: their "
            "nodes and quotas were not counted this sync, and nothing was marked down or untagged because of it.\n"
            + "\n".join(lines)
        )
        tags = (
            EVENT_SOURCE_TAG,
            normalize_tag(f"source:{source}"),
            *(normalize_tag(f"error_class:{c}") for c in classes[:5]),
        )
        events.append(
            Event(
                title=f"gpufarm inventory source {source} skipped: {', '.join(classes[:3])}"[:200],
                text=text[:4000],
                tags=tags,
                aggregation_key=f"gpufarm-inventory-source-{source}"[:100],
                alert_type="warning" if throttled else "error",
                date_happened=timestamp,
            )
        )
    return events


def post_source_events(sink: EventSink | None, ledger: Ledger, timestamp: int) -> int:
    """Post source_events through the sink; returns how many were posted. A failed post is logged, never raised:
    the sync's report, gauges and logs still say what was skipped."""
    if sink is None:
        return 0
    posted = 0
    for event in source_events(ledger, timestamp):
        try:
            sink.post_event(event)
            posted += 1
        except GpufarmError as exc:
            log.warning("inventory source event not posted (%s): %s", event.title, exc)
    return posted
