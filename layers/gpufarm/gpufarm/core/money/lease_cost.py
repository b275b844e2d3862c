"""What a lease cost in a period: its GPU-hours inside the period by kind, times its GPU-hour price.

**Hours.** An incident records its held GPU-hours per calendar month (`gpu_hours_by_month`) and its busy, idle,
idle-held and unmeasured GPU-hours as totals (gpufarm.core.kernel.accrued). A period that covers whole months takes
those months' held hours as they are; a period that cuts a month takes the share of that month's hours the lease
held inside the period, counting the lease as holding evenly between its allocation (or the month's start) and its
last accrual (or the month's end). Busy, idle, idle-held and unmeasured follow the held hours in the same
proportion as over the lease's life. The stretch a live lease has held since its last accrual was measured by
nothing written yet, so it is **unmeasured**, never idle. The ledger counts idle-held hours among the idle ones;
here the kinds are apart: `idle` is idle with no process, `idle_held` idle with memory held and no work.

**Money.** Each kind's hours times the lease's rate (gpufarm.core.money.lease_rate: its pool's price of its model,
MIG shares applied), in the card's currency, unrounded (`round_cents` when shown or written). A lease whose pool or
model has no rate is unpriced: every amount None, never zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol

from gpufarm.core.kernel import accrued
from gpufarm.core.kernel.accrued import HeldLease
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.money.card import Rate, RateCard
from gpufarm.core.money.lease_rate import lease_rate

# The kinds a lease's held GPU-hours split into (a pool's unallocated capacity is the fifth, counted per pool).
BUSY, IDLE, IDLE_HELD, UNMEASURED = "busy", "idle", "idle_held", "unmeasured"
KINDS = (BUSY, IDLE, IDLE_HELD, UNMEASURED)


class CostedLease(HeldLease, Protocol):
    """What pricing a lease reads (gpufarm.core.kernel.lease_facts.LeaseFacts and Allocation both have it)."""

    @property
    def environment(self) -> str | None: ...
    @property
    def gpu_model(self) -> str | None: ...
    @property
    def devices(self) -> Sequence[str]: ...
    @property
    def hours_held(self) -> float: ...
    @property
    def hours_busy(self) -> float: ...
    @property
    def hours_idle(self) -> float: ...
    @property
    def hours_idle_held(self) -> float: ...
    @property
    def hours_unmeasured(self) -> float: ...


@dataclass(frozen=True, slots=True)
class HoursByKind:
    """GPU-hours of one lease inside a period: held, and of those busy, idle (no process), idle-held, unmeasured."""

    held: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    idle_held: float = 0.0
    unmeasured: float = 0.0

    def of(self, kind: str) -> float:
        """The hours of one of KINDS."""
        value: float = getattr(self, kind)
        return value


@dataclass(frozen=True, slots=True)
class Cost:
    """What a lease's hours cost: held in all (`amount`) and by kind; None where unpriced, never zero."""

    amount: Decimal | None
    currency: str
    by_kind: dict[str, Decimal | None] = field(default_factory=dict)
    # The GPU-hour price applied (None: unpriced); `rate.stale` when a list price was the last known one.
    rate: Rate | None = None

    @property
    def priced(self) -> bool:
        """True when a rate priced the lease."""
        return self.amount is not None


def _month_bounds(month: str) -> tuple[datetime, datetime]:
    year, number = int(month[:4]), int(month[5:])
    start = datetime(year, number, 1, tzinfo=UTC)
    return start, datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)


def _overlap(a: tuple[datetime, datetime], b: tuple[datetime, datetime]) -> float:
    """Hours two intervals share."""
    start, end = max(a[0], b[0]), min(a[1], b[1])
    return max(0.0, (end - start).total_seconds() / 3600)


def accrued_in(lease: CostedLease, start: datetime, end: datetime) -> float:
    """Held GPU-hours the incident accrued inside [start, end) (see the module docstring)."""
    window = (start, end)
    total = 0.0
    for month, hours in accrued.by_month(lease).items():
        if hours <= 0:
            continue
        bounds = _month_bounds(month)
        if start <= bounds[0] and bounds[1] <= end:
            total += hours
            continue
        held_from = max(bounds[0], lease.allocated_at) if lease.allocated_at else bounds[0]
        held_to = min(bounds[1], lease.hours_until) if lease.hours_until else bounds[1]
        span = _overlap((held_from, held_to), bounds)
        if span > 0:
            total += hours * _overlap((held_from, held_to), window) / span
    return total


def unaccrued_in(lease: CostedLease, start: datetime, end: datetime, now: datetime) -> float:
    """GPU-hours a lease holding now has held inside [start, end) since its last accrual (unmeasured)."""
    since = accrued.accrued_since(lease)
    if lease.phase not in HOLDING or since is None or now <= since:
        return 0.0
    gpus = sum(accrued.held_by_host(lease).values())
    return gpus * _overlap((since, now), (start, end))


def lease_hours(lease: CostedLease, start: datetime, end: datetime, now: datetime) -> HoursByKind:
    """The lease's GPU-hours inside [start, end) by kind (see the module docstring)."""
    held = accrued_in(lease, start, end)
    stretch = unaccrued_in(lease, start, end, now)
    share = min(1.0, held / lease.hours_held) if lease.hours_held > 0 else 0.0
    idle_all = lease.hours_idle * share
    idle_held = min(lease.hours_idle_held * share, idle_all)
    return HoursByKind(
        held=held + stretch,
        busy=lease.hours_busy * share,
        idle=idle_all - idle_held,
        idle_held=idle_held,
        unmeasured=lease.hours_unmeasured * share + stretch,
    )


def lease_cost(card: RateCard, lease: CostedLease, hours: HoursByKind) -> Cost:
    """What these hours of the lease cost at its rate; every amount None when its pool's model is unpriced."""
    rate = lease_rate(card, lease.environment, lease.gpu_model, lease.devices)
    if rate is None:
        return Cost(None, card.currency, dict.fromkeys(KINDS))
    price = rate.per_gpu_hour
    return Cost(
        price * Decimal(repr(hours.held)),
        card.currency,
        {kind: price * Decimal(repr(hours.of(kind))) for kind in KINDS},
        rate,
    )
