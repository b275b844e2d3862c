"""A stored monitor and the state of each of its groups (OK / Warn / Alert / No Data), which the Monitor API shows
and the evaluator changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpufarm_sandbox.emulator.monitor_validation import MonitorQuery

OK, WARN, ALERT, NO_DATA = "OK", "Warn", "Alert", "No Data"
_SEVERITY = {ALERT: 3, WARN: 2, NO_DATA: 1, OK: 0}
ORG_ID = 1


@dataclass
class GroupState:
    """One group of a monitor (one combination of its `by {...}` tags) as last evaluated."""

    status: str
    first_seen: float
    last_triggered_ts: int = 0
    last_notified_ts: int = 0
    last_resolved_ts: int = 0
    last_nodata_ts: int = 0
    cycle_key: str | None = None
    cycle_alerted: bool = False
    value: float | None = None
    last_data: float = 0.0  # sandbox time of the last evaluation that had data for this group


@dataclass
class StoredMonitor:
    """A monitor's stored body (as the API answers it) and, for an evaluated type, its parsed query and groups."""

    body: dict[str, Any]
    parsed: MonitorQuery | None
    groups: dict[tuple[str, ...], GroupState] = field(default_factory=dict)
    # Groups seen in data but still inside new_group_delay: when their first point was.
    pending: dict[tuple[str, ...], float] = field(default_factory=dict)


def update_overall(mon: StoredMonitor, now: float) -> None:
    """The monitor's overall state is its worst group's (No Data without groups); stamped when it changes."""
    states = [g.status for g in mon.groups.values() if g.status]
    overall = max(states, key=_SEVERITY.__getitem__) if states else NO_DATA
    if overall != mon.body["overall_state"]:
        mon.body["overall_state"] = overall
        mon.body["overall_state_modified"] = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
