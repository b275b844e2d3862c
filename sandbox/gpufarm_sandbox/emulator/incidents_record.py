"""One incident as the sandbox stores it, and how its state and impact are kept over time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufarm_sandbox.emulator.incidents_config import ENDED_STATES

FieldValue = str | list[str] | None


@dataclass
class StoredIncident:
    """One incident as the sandbox stores it; `fields` holds only values that were set."""

    id: str
    public_id: int
    title: str
    incident_type_id: str
    created: datetime
    modified: datetime
    customer_impacted: bool = False
    customer_impact_scope: str | None = None
    customer_impact_start: datetime | None = None
    customer_impact_end: datetime | None = None
    detected: datetime | None = None
    resolved: datetime | None = None
    is_test: bool = False
    notification_handles: list[dict[str, str]] | None = None
    initial_cells: list[dict[str, Any]] = field(default_factory=list)
    commander_id: str | None = None
    responders: list[str] = field(default_factory=list)
    fields: dict[str, FieldValue] = field(default_factory=dict)
    # (state, start epoch, end epoch or None): the field_analytics search answers carry.
    state_spans: list[list[Any]] = field(default_factory=list)

    @property
    def state(self) -> str:
        """Current state (mirrors fields.state)."""
        return str(self.fields.get("state") or "active")

    @property
    def severity(self) -> str:
        """Current severity (mirrors fields.severity)."""
        return str(self.fields.get("severity") or "UNKNOWN")

    @property
    def slug(self) -> str:
        """`IR-<public_id>`."""
        return f"IR-{self.public_id}"


def impact_duration(incident: StoredIncident) -> int:
    if incident.customer_impact_start is None or incident.customer_impact_end is None:
        return 0
    return max(0, int((incident.customer_impact_end - incident.customer_impact_start).total_seconds()))


def field_analytics(incident: StoredIncident, now: float) -> dict[str, Any]:
    states: dict[str, dict[str, Any]] = {}
    for state, start, end in incident.state_spans:
        entry = states.setdefault(state, {"duration": 0, "spans": []})
        entry["spans"].append({"start": int(start), "end": int(end) if end is not None else None})
        entry["duration"] += int((end if end is not None else now) - start)
    return {"state": states}


def state_changed(incident: StoredIncident, old_state: str, now: datetime) -> None:
    """Close the span of the state left, open the new one, and set or clear the resolved time."""
    if incident.state_spans and incident.state_spans[-1][2] is None:
        incident.state_spans[-1][2] = now.timestamp()
    incident.state_spans.append([incident.state, now.timestamp(), None])
    if incident.state in ENDED_STATES:
        if old_state not in ENDED_STATES or incident.resolved is None:
            incident.resolved = now
    else:
        incident.resolved = None
