"""What happened to a lease inside a report's period, read from its history (`gpufarm_history`).

The history is the audit trail gpufarm writes with every change (docs/design.md, "The audit trail"): one
`<time> <actor> <step>: <details>` line per step. A report counts the idle warnings, keeps and exemptions whose
time falls in the period (a folded `summary` entry's counts are taken at the summary's time), the lease's end and
its reclaim reason when it ended in the period, and its waiting time (request -> allocation) when its GPUs were
allocated in the period.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import State
from gpufarm.reporting.query import Period

# The squatter steps (gpufarm.reporting.squatting) are counted too.
COUNTED = (Step.WARNED.value, Step.KEPT.value, Step.EXEMPTED.value, Step.SQUATTED.value, Step.SQUATTER_STOPPED.value)
# The steps that end a lease: the time of the last one is when it ended.
ENDINGS = frozenset(
    {Step.RELEASED.value, Step.RECLAIMED.value, Step.CANCELLED.value, Step.WITHDRAWN.value, Step.REJECTED.value}
)
# The step names the loops below compare with, read once (an enum member's value is a property lookup each time).
_REQUESTED, _ALLOCATED, _SUMMARY = Step.REQUESTED.value, Step.ALLOCATED.value, Step.SUMMARY.value
_SUMMARY_RE = re.compile(r"^[0-9]{1,6} earlier entries to \S+: (.*)$")
_COUNT_RE = re.compile(r"^([a-z-]{2,30}) ([0-9]{1,6})$")


@dataclass(frozen=True)
class LeaseEvents:
    """One lease's steps inside a period."""

    counts: Counter[str] = field(default_factory=Counter)
    # The reclaim reason when the lease ended inside the period ("released", "idle", "expired", ...).
    ended: str | None = None
    # Hours from the request to the allocation, when the lease was allocated inside the period.
    waited_hours: float | None = None


def _in(moment: datetime, period: Period) -> bool:
    return period.start <= moment < period.end


def _folded(details: str) -> Counter[str]:
    """The step counts a `summary` entry holds."""
    out: Counter[str] = Counter()
    match = _SUMMARY_RE.match(details)
    for part in (match.group(1) if match else "").split(", "):
        found = _COUNT_RE.match(part.strip())
        if found:
            out[found.group(1)] += int(found.group(2))
    return out


def lease_events(alloc: LeaseFacts, period: Period) -> LeaseEvents:
    """Count the lease's warnings, keeps and exemptions, and find its end and waiting time, inside the period."""
    entries = [e for e in (history.parse(line) for line in alloc.history) if e is not None]
    requested, allocated, ended_at = _milestones(entries)
    allocated = allocated or alloc.allocated_at
    waited = None
    if requested is not None and allocated is not None and _in(allocated, period) and allocated >= requested:
        waited = (allocated - requested).total_seconds() / 3600
    return LeaseEvents(_counted(entries, period), _ended(alloc, ended_at, period), waited)


def _milestones(entries: list[history.Entry]) -> tuple[datetime | None, datetime | None, datetime | None]:
    """When the lease was first requested, first allocated, and last ended (None where the history has no step)."""
    requested: datetime | None = None
    allocated: datetime | None = None
    ended_at: datetime | None = None
    for entry in entries:
        if entry.step == _REQUESTED and requested is None:
            requested = entry.at
        elif entry.step == _ALLOCATED and allocated is None:
            allocated = entry.at
        elif entry.step in ENDINGS:
            ended_at = entry.at
    return requested, allocated, ended_at


def _counted(entries: list[history.Entry], period: Period) -> Counter[str]:
    """The warnings, keeps and exemptions inside the period, those a folded summary holds included."""
    counts: Counter[str] = Counter()
    for entry in entries:
        if not _in(entry.at, period):
            continue
        if entry.step in COUNTED:
            counts[entry.step] += 1
        elif entry.step == _SUMMARY:
            counts.update({k: v for k, v in _folded(entry.details).items() if k in COUNTED})
    return counts


def _ended(alloc: LeaseFacts, ended_at: datetime | None, period: Period) -> str | None:
    """The lease's reclaim reason (its phase without one) when it ended inside the period."""
    if alloc.state is not State.RESOLVED:
        return None
    moment = ended_at or alloc.hours_until or alloc.modified
    if moment is not None and _in(moment, period):
        return alloc.reclaim_reason.value if alloc.reclaim_reason else alloc.phase.value
    return None
