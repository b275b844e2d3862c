"""Free capacity ahead per pool and model, week by week (or day by day): what the inventory holds, less what live
leases hold until their expected ends and what reservations hold over their windows; pure.

The holds are the calendar's (gpufarm.core.calendar.booking.holds: a lease from now until its `expires_at`, for
ever when it has none; a booked reservation over its window), swept once into step functions
(gpufarm.core.calendar.booking.use). Each slot shows its busiest moment: the most GPUs leases hold, the most
reserved, and the fewest free, so a week reads "free" only when that many are free all week long. Free is
negative when leases and reservations hold more than the inventory now has (hosts down or gone): the pool is
over-committed then, which is what "capacity runs out" means here. The first slot starts now and ends at the
UTC midnight that closes it; the others are whole slots after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufarm.core.calendar.booking import Holder, holds, use
from gpufarm.core.kernel.hosts import GpuHost

WEEKS = 4
WEEK_DAYS = 7


@dataclass(frozen=True, slots=True)
class Slot:
    """One week (or day) ahead of a pool's model: its busiest moment."""

    start: datetime
    end: datetime
    capacity: int
    leased: int
    reserved: int
    free: int

    @property
    def runs_out(self) -> bool:
        """True when nothing is free at some moment of the slot."""
        return self.free <= 0


@dataclass(frozen=True, slots=True)
class PoolOutlook:
    """One pool and model: its capacity and the slots ahead."""

    environment: str
    gpu_model: str
    capacity: int
    slots: tuple[Slot, ...]

    def first_short(self) -> Slot | None:
        """The first slot in which capacity runs out, or None."""
        return next((s for s in self.slots if s.runs_out), None)


def slot_bounds(now: datetime, count: int = WEEKS, days: int = WEEK_DAYS) -> list[tuple[datetime, datetime]]:
    """The `count` slots of `days` days from now: the first ends at the UTC midnight `days` after today's."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    out = []
    for index in range(count):
        low = max(midnight + timedelta(days=days * index), now)
        out.append((low, midnight + timedelta(days=days * (index + 1))))
    return out


def pool_capacity(
    pools: Mapping[str, tuple[str, ...]], hosts: Iterable[GpuHost], shared: Iterable[str] = ()
) -> dict[tuple[str, str], int]:
    """GPUs (units on a shared pool: GPUs and MIG slices) per pool and offered model, from the inventory's hosts, as
    the sync's inventory summary counts its totals (gpufarm.core.context.lease_context.inventory_summary)."""
    by_units = set(shared)
    out = {(env, model.upper()): 0 for env, models in pools.items() for model in models}
    for host in hosts:
        key = (host.environment, host.gpu_model)
        if key in out:
            out[key] += len(host.units) if host.environment in by_units else host.gpu_count
    return out


def outlook(
    live: Iterable[Holder],
    capacity: Mapping[tuple[str, str], int],
    now: datetime,
    *,
    count: int = WEEKS,
    days: int = WEEK_DAYS,
) -> list[PoolOutlook]:
    """Every pool and model of `capacity`, its slots ahead (see the module docstring), by pool then model."""
    leases = list(live)
    bounds = slot_bounds(now, count, days)
    out: list[PoolOutlook] = []
    for (env, model), total in sorted(capacity.items()):
        found = holds(leases, env, model, now)
        leased, booked, held = use([h for h in found if not h.reserved]), use(found, reserved_only=True), use(found)
        slots = tuple(
            Slot(low, high, total, leased.peak(low, high), booked.peak(low, high), total - held.peak(low, high))
            for low, high in bounds
        )
        out.append(PoolOutlook(env, model, total, slots))
    return out


def first_short(pools: Iterable[PoolOutlook]) -> tuple[PoolOutlook, Slot] | None:
    """The pool and slot where capacity runs out first (ties: by pool and model), or None when it never does."""
    found = [(p.first_short(), p) for p in pools]
    short = [(slot, pool) for slot, pool in found if slot is not None]
    if not short:
        return None
    slot, pool = min(short, key=lambda sp: (sp[0].start, sp[1].environment, sp[1].gpu_model))
    return pool, slot
