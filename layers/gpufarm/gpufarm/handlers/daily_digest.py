"""The operators' daily digest (scheduled every 15 minutes; posts once a day at the farm file's digest time).

A ScheduleV2 delivers its Input as-is: `{"job": "daily_digest", "scheduled_time": "<aws.scheduler.scheduled-time>"}`,
the placeholder filled in by EventBridge Scheduler with the run's own time, so a retried run decides as the first
did (gpufarm.core.digest.run). `{"force": true}` posts the digest now, whatever the time (an operator invoking the
function by hand). A malformed event is refused with the reason and changes nothing; a failed Slack post raises, so
the scheduler retries the run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from gpufarm.core.digest import run
from gpufarm.core.kernel.model import parse_time
from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)

JOB = "daily_digest"
KNOWN_KEYS = frozenset({"job", "scheduled_time", "force"})
MAX_TIME_CHARS = 40
# A schedule time further than this from the clock is not this run's: the clock decides instead.
MAX_SKEW = timedelta(hours=1)


class BadEvent(ValueError):
    """The event is not a digest run; the message says why."""


def parse_event(event: Mapping[str, Any] | None) -> tuple[str | None, bool]:
    """The event's schedule time (text, None when absent) and force flag; BadEvent when malformed."""
    if event is None:
        return None, False
    if not isinstance(event, Mapping):
        raise BadEvent("the event must be a JSON object")
    unknown = sorted(str(k)[:40] for k in event if k not in KNOWN_KEYS)
    if unknown:
        raise BadEvent(f"unknown keys: {', '.join(unknown[:5])}")
    job = event.get("job", JOB)
    if job != JOB:
        raise BadEvent(f"job must be {JOB!r}")
    force = event.get("force", False)
    if not isinstance(force, bool):
        raise BadEvent("force must be true or false")
    scheduled = event.get("scheduled_time")
    if scheduled is not None and (not isinstance(scheduled, str) or len(scheduled) > MAX_TIME_CHARS):
        raise BadEvent("scheduled_time must be an ISO 8601 time")
    return scheduled, force


def run_time(scheduled: str | None, now: datetime) -> datetime:
    """The run's moment: the schedule's time when it is one and near the clock, else now."""
    at = parse_time(scheduled) if scheduled else None
    if at is None or abs(at - now) > MAX_SKEW:
        if scheduled:
            log.warning("scheduled_time %r is not usable; deciding on the clock", scheduled[:MAX_TIME_CHARS])
        return now
    return at


def handle(event: Mapping[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    """Run one digest tick; returns what it did (raises on upstream failure so the scheduler retries)."""
    try:
        scheduled, force = parse_event(event)
    except BadEvent as exc:
        log.warning("daily digest: refused event: %s", exc)
        return {"posted": False, "error": str(exc)}
    try:
        svc = rt.current().service()
    except rt.ConfigurationError as exc:
        raise rt.misconfigured("daily digest", exc) from None
    result = run.run(svc.context, at=run_time(scheduled, svc.context.now()), force=force)
    summary = result.summary()
    log.info("daily digest: %s", summary)
    return summary
