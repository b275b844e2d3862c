"""Unmet demand per pool and model over a period: GPU-hours requests spent waiting for hosts, and the requests
refused or withdrawn, by reason code (gpufarm.core.kernel.reasons); pure.

**Waiting GPU-hours.** A request waits for hosts from the moment it joined its pool's queue (its `waiting_since`
field while it waits; that field is cleared at allocation, so afterwards the first `waiting` step of its history)
until its first allocation, or its end (withdrawn, cancelled, released) when it never got hosts, or now while it
still waits; its GPUs times the hours of that wait inside the period are the waiting GPU-hours. A request whose
history lost its `waiting` step (folded) and no longer waits is not counted: nothing says when it waited.
Requests waiting for an operator's decision wait for a person, not for capacity, and are not counted here.

**Refused and withdrawn.** Every reason entry of a history whose code refuses a request (the policy, an operator, a
reservation that does not fit) or withdraws it (its waiting limit passed, no operator could approve it) and whose
time falls in the period counts once under its code, with the GPUs asked; a lease whose history lost that line
counts by its `gpufarm_reason` field when it ended in the period (as gpufarm.reporting.reasons counts). The codes
that kept waiting requests waiting (queued for capacity, behind fair share, behind a reservation) are counted
beside, to say why the waits were. A request refused before any incident was made (a typo past the hard limit) is
in no incident and so in no count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.reasons import ReasonCode

NONE = "(none)"
REFUSED: frozenset[ReasonCode] = frozenset(
    {
        ReasonCode.REFUSED_POLICY,
        ReasonCode.REJECTED_OPERATOR,
        ReasonCode.RESERVATION_NO_CAPACITY,
        ReasonCode.RESERVATION_OVER_QUOTA,
        ReasonCode.RESERVATION_BEYOND_HORIZON,
        ReasonCode.RESERVATION_TOO_LONG,
        ReasonCode.RESERVATION_IN_PAST,
    }
)
WITHDRAWN: frozenset[ReasonCode] = frozenset({ReasonCode.WITHDRAWN_WAIT_LIMIT, ReasonCode.WITHDRAWN_UNAPPROVABLE})
WAITED: frozenset[ReasonCode] = frozenset(
    {
        ReasonCode.QUEUED_CAPACITY,
        ReasonCode.QUEUED_FAIR_SHARE,
        ReasonCode.QUEUED_PREEMPTION,
        ReasonCode.QUEUED_PROTECTED,
        ReasonCode.RESERVED_CAPACITY,
    }
)
# The steps that end a wait: the request got hosts, or it ended without them.
_STOPS = frozenset(
    {
        Step.ALLOCATED.value,
        Step.RELEASED.value,
        Step.RECLAIMED.value,
        Step.CANCELLED.value,
        Step.WITHDRAWN.value,
        Step.REJECTED.value,
    }
)


@dataclass
class Demand:
    """One pool and model's unmet demand over a period."""

    environment: str
    gpu_model: str
    waiting_gpu_hours: float = 0.0
    # Requests whose wait for hosts overlapped the period, and the codes that kept them waiting.
    waited: int = 0
    waited_why: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    withdrawn: Counter[str] = field(default_factory=Counter)
    # GPUs the refused and withdrawn requests asked for.
    unmet_gpus: int = 0

    @property
    def unmet_requests(self) -> int:
        """Requests refused or withdrawn in the period."""
        return sum(self.refused.values()) + sum(self.withdrawn.values())

    @property
    def weight(self) -> tuple[float, int]:
        """What "most unmet demand" orders by: waiting GPU-hours, then GPUs refused or withdrawn."""
        return (self.waiting_gpu_hours, self.unmet_gpus)


def _hours(start: datetime, end: datetime, low: datetime, high: datetime) -> float:
    """Hours [start, end) shares with [low, high)."""
    first, last = max(start, low), min(end, high)
    return max(0.0, (last - first).total_seconds() / 3600)


def wait_span(lease: LeaseFacts, now: datetime) -> tuple[datetime, datetime] | None:
    """When the request waited for hosts (see the module docstring), or None when it never did (or nothing says)."""
    entries = [e for e in (history.parse(line) for line in lease.history) if e is not None]
    start = lease.waiting_since if lease.phase is Phase.WAITING and lease.state is not State.RESOLVED else None
    if start is None:
        start = next((e.at for e in entries if e.step == Step.WAITING.value), None)
    if start is None:
        return None
    end = next((e.at for e in entries if e.at >= start and e.step in _STOPS), None)
    return (start, max(start, end if end is not None else _wait_end(lease, start, now)))


def _wait_end(lease: LeaseFacts, start: datetime, now: datetime) -> datetime:
    """Where a wait no history step closes ended: at the allocation, the request's end, or still going."""
    if lease.allocated_at is not None and lease.allocated_at >= start:
        return lease.allocated_at
    if lease.state is State.RESOLVED:
        return lease.hours_until or lease.modified or start
    return now


def _codes_in(lease: LeaseFacts, low: datetime, high: datetime) -> list[ReasonCode]:
    """The reason codes the lease's history gives inside [low, high), its field's when the history holds none."""
    found: list[ReasonCode] = []
    any_line = False
    for line in lease.history:
        code = reason_trail.code_of(line)
        entry = history.parse(line) if code is not None else None
        if code is None or entry is None:
            continue
        any_line = True
        if low <= entry.at < high:
            found.append(code)
    if not any_line and lease.reason and lease.state is State.RESOLVED:
        moment = lease.hours_until or lease.modified
        try:
            code = ReasonCode(lease.reason)
        except ValueError:
            return found
        if moment is not None and low <= moment < high:
            found.append(code)
    return found


def unmet_demand(leases: Iterable[LeaseFacts], start: datetime, end: datetime, now: datetime) -> list[Demand]:
    """Each pool and model with unmet demand in [start, end), the most first (waiting GPU-hours, then GPUs
    refused or withdrawn); pools with none are left out."""
    out: dict[tuple[str, str], Demand] = {}
    for lease in leases:
        if lease.is_quota_override:
            continue
        key = (lease.environment or NONE, (lease.gpu_model or NONE).upper())
        span = wait_span(lease, now)
        waited = _hours(span[0], span[1], start, end) if span is not None else 0.0
        codes = _codes_in(lease, start, end)
        unmet = [c for c in codes if c in REFUSED or c in WITHDRAWN]
        why = [c for c in codes if c in WAITED]
        if waited <= 0 and not unmet and not why:
            continue
        _count(out.setdefault(key, Demand(*key)), lease.gpu_count, waited, unmet, why)
    return sorted(out.values(), key=lambda d: (-d.weight[0], -d.weight[1], d.environment, d.gpu_model))


def _count(demand: Demand, gpus: int, waited: float, unmet: list[ReasonCode], why: list[ReasonCode]) -> None:
    """Add one request's wait, refusals and withdrawals to its pool's demand."""
    if waited > 0:
        demand.waiting_gpu_hours += gpus * waited
        demand.waited += 1
    demand.waited_why.update(c.value for c in why)
    for code in unmet:
        (demand.refused if code in REFUSED else demand.withdrawn)[code.value] += 1
    # A request refused twice (asked again in one incident) asked its GPUs once.
    demand.unmet_gpus += gpus if unmet else 0
