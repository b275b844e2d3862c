"""A lease's GPU-hours inside a report's period, from what its incident accrued (gpufarm.core.accounting.accrued).

An incident records its held GPU-hours per calendar month (`gpu_hours_by_month`) and its busy, idle and unmeasured
GPU-hours as totals. A period that covers whole months takes those months' held hours as they are; a period that
cuts a month takes the share of that month's hours the lease held inside the period, counting the lease as holding
evenly between its allocation (or the month's start) and its last accrual (or the month's end). Busy, idle and
unmeasured follow the held hours in the same proportion as over the lease's life. The stretch a live lease has held
since its last accrual was measured by nothing written yet, so it is **unmeasured**, never idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from gpufarm.core.accounting import accrued
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.reporting.query import Period


@dataclass(frozen=True)
class WindowHours:
    """GPU-hours of one lease inside a period: held, and of those busy, idle and unmeasured."""

    held: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    unmeasured: float = 0.0


def _month_bounds(month: str) -> tuple[datetime, datetime]:
    year, number = int(month[:4]), int(month[5:])
    start = datetime(year, number, 1, tzinfo=UTC)
    return start, datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)


def _overlap(a: tuple[datetime, datetime], b: tuple[datetime, datetime]) -> float:
    """Hours two intervals share."""
    start, end = max(a[0], b[0]), min(a[1], b[1])
    return max(0.0, (end - start).total_seconds() / 3600)


def accrued_in(alloc: LeaseFacts, period: Period) -> float:
    """Held GPU-hours the incident accrued inside the period (see the module docstring)."""
    window = (period.start, period.end)
    total = 0.0
    for month, hours in accrued.by_month(alloc).items():
        if hours <= 0:
            continue
        bounds = _month_bounds(month)
        if period.start <= bounds[0] and bounds[1] <= period.end:
            total += hours
            continue
        held_from = max(bounds[0], alloc.allocated_at) if alloc.allocated_at else bounds[0]
        held_to = min(bounds[1], alloc.hours_until) if alloc.hours_until else bounds[1]
        span = _overlap((held_from, held_to), bounds)
        if span > 0:
            total += hours * _overlap((held_from, held_to), window) / span
    return total


def unaccrued_in(alloc: LeaseFacts, period: Period, now: datetime) -> float:
    """GPU-hours a lease holding now has held inside the period since its last accrual (unmeasured)."""
    start = accrued.accrued_since(alloc)
    if alloc.phase not in HOLDING or start is None or now <= start:
        return 0.0
    gpus = sum(accrued.held_by_host(alloc).values())
    return gpus * _overlap((start, now), (period.start, period.end))


def lease_hours(alloc: LeaseFacts, period: Period, now: datetime) -> WindowHours:
    """The lease's held, busy, idle and unmeasured GPU-hours inside the period."""
    accrued = accrued_in(alloc, period)
    stretch = unaccrued_in(alloc, period, now)
    share = min(1.0, accrued / alloc.hours_held) if alloc.hours_held > 0 else 0.0
    return WindowHours(
        held=accrued + stretch,
        busy=alloc.hours_busy * share,
        idle=alloc.hours_idle * share,
        unmeasured=alloc.hours_unmeasured * share + stretch,
    )
