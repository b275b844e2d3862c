"""How the enforcers tell operators what they did: Datadog gauges and events, best effort.

The Slurm enforcer's runs, the Kubernetes step's patches and its evictions each report through a `Reporter`
(gpufarm_node.enforce.datadog_io.DatadogIO). A report that fails is logged and dropped, never the end of a run: the
next run or step sends its gauges again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """Where operators hear of the enforcers (Datadog gauges and events)."""

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None: ...

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None: ...


def send_gauges(
    reporter: Reporter | None, values: dict[str, float], tags: Sequence[str], now: float, what: str
) -> None:
    """Send `what`'s gauges; a failure is logged (the next run sends again)."""
    if reporter is None:
        return
    try:
        reporter.gauges(values, tags, now)
    except Exception as exc:  # noqa: BLE001 - reporting is best effort
        log.warning("could not send the %s gauges: %s", what, exc)


def post_event(  # noqa: PLR0917 - the reporter, the event and whose it is
    reporter: Reporter | None, title: str, text: str, tags: Sequence[str], alert: str, what: str
) -> None:
    """Post one of `what`'s events; a failure is logged."""
    if reporter is None:
        return
    try:
        reporter.event(title, text, tags, alert=alert)
    except Exception as exc:  # noqa: BLE001 - reporting is best effort
        log.warning("could not post the %s event: %s", what, exc)
