"""The pool's calendar as a pure interval computation: what is held when, and the nearest window that fits.

Every live lease of a pool and model holds its GPUs from now until its expected end (`expires_at`), every
reservation over its window; each is a `Hold`. One sweep over their start and end events gives the pool's use as a
step function of time, and a team's use beside it; what a new booking may take at any moment is the smaller of
the pool's free GPUs and the team's quota left. Admission asks whether that stays at or above the ask over the
whole window; a refusal searches the candidate starts (now, the asked start, every moment a hold ends, every
moment a window would end as a hold begins) for the one nearest the asked start. O(n log n) in the holds.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.pool_record import PoolRecord

# An open-ended hold (a lease with no known end) runs to here: beyond any horizon.
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs one lease or reservation holds over [start, end), and whose team's quota they count in."""

    start: datetime
    end: datetime
    gpus: int
    team: str
    reserved: bool = False


class Holder(PoolRecord, Protocol):
    """What the calendar reads of a lease or reservation: the lifecycle's Allocation, or a report's LeaseFacts."""

    @property
    def gpu_count(self) -> int: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def reserved_from(self) -> datetime | None: ...
    @property
    def reserved_until(self) -> datetime | None: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds a booking: the pool's GPUs of the model and the team's quota there."""

    capacity: int
    quota: int


@dataclass(frozen=True, slots=True)
class Steps:
    """A step function: `values[i]` holds on [times[i], times[i+1]) (the last one for ever); 0 before times[0]."""

    times: tuple[datetime, ...]
    values: tuple[int, ...]

    def at(self, moment: datetime) -> int:
        """The value at one moment."""
        index = bisect_right(self.times, moment) - 1
        return self.values[index] if index >= 0 else 0

    def peak(self, start: datetime, end: datetime) -> int:
        """The largest value over [start, end)."""
        if end <= start:
            return 0
        first = bisect_right(self.times, start) - 1
        last = bisect_left(self.times, end)
        best = self.values[first] if first >= 0 else 0
        for index in range(max(first + 1, 0), last):
            best = max(best, self.values[index])
        return best


def use(holds: Iterable[Hold], *, team: str | None = None, reserved_only: bool = False) -> Steps:
    """GPUs held over time by every hold (or one team's, or the reservations'), as one sweep over their events."""
    delta: dict[datetime, int] = {}
    for hold in holds:
        if hold.gpus <= 0 or hold.end <= hold.start:
            continue
        if (team is not None and hold.team != team) or (reserved_only and not hold.reserved):
            continue
        delta[hold.start] = delta.get(hold.start, 0) + hold.gpus
        delta[hold.end] = delta.get(hold.end, 0) - hold.gpus
    times = sorted(delta)
    values: list[int] = []
    running = 0
    for moment in times:
        running += delta[moment]
        values.append(running)
    return Steps(tuple(times), tuple(values))


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a window does not fit: the tightest moment, and whether the pool or the team's quota binds there."""

    at: datetime
    pool_free: int
    quota_left: int

    @property
    def quota_binds(self) -> bool:
        """True when the team's quota, not the pool, is what runs out."""
        return self.quota_left < self.pool_free


class Calendar:
    """One pool and model's holds, swept once, asked many times (admission, the nearest window, the days)."""

    def __init__(self, holds: Sequence[Hold], limits: Limits, team: str) -> None:
        self.limits = limits
        self.pool = use(holds)
        self.team = use(holds, team=team)
        # What a booking of `team` may take, as one step function over the merged breakpoints of both.
        times = sorted(set(self.pool.times) | set(self.team.times))
        room = [min(limits.capacity - self.pool.at(t), limits.quota - self.team.at(t)) for t in times]
        self._times = tuple(times)
        self._room_before = min(limits.capacity, limits.quota)
        self._table = _min_table(room)

    def room(self, start: datetime, end: datetime) -> int:
        """The fewest GPUs a booking of the team may take at any moment of [start, end)."""
        first = bisect_right(self._times, start) - 1
        last = max(bisect_left(self._times, end) - 1, first)
        best = self._room_before if first < 0 else self._range_min(first, last)
        if first < 0 and last >= 0:
            best = min(best, self._range_min(0, last))
        return best

    def _range_min(self, low: int, high: int) -> int:
        """The smallest room among segments low..high (inclusive), in O(1) from the sparse table."""
        level = (high - low + 1).bit_length() - 1
        row = self._table[level]
        return min(row[low], row[high - (1 << level) + 1])

    def shortfall(self, start: datetime, end: datetime, need: int) -> Shortfall | None:
        """The first moment of [start, end) where `need` does not fit, or None when it fits throughout."""
        moments = [start, *self._times[bisect_right(self._times, start) : bisect_left(self._times, end)]]
        for moment in moments:
            pool_free = self.limits.capacity - self.pool.at(moment)
            quota_left = self.limits.quota - self.team.at(moment)
            if min(pool_free, quota_left) < need:
                return Shortfall(moment, pool_free, quota_left)
        return None

    def nearest(
        self, asked: datetime, length: timedelta, need: int, earliest: datetime, latest_end: datetime
    ) -> datetime | None:
        """The start nearest `asked` (ties: the earlier) of a window of `length` that fits `need`, starting no
        sooner than `earliest` and ending by `latest_end`; None when no such window exists."""
        if need > self._room_before:
            return None
        latest_start = latest_end - length
        candidates = {earliest, asked}
        for moment in self._times:
            candidates.add(moment)
            candidates.add(moment - length)
        fitting = [c for c in candidates if earliest <= c <= latest_start and self.room(c, c + length) >= need]
        if not fitting:
            return None
        return min(fitting, key=lambda c: (abs(c - asked), c))


def _min_table(values: Sequence[int]) -> list[list[int]]:
    """Sparse table of range minima: row k holds the minimum of each run of 2**k values."""
    table = [list(values)]
    width = 1
    while width * 2 <= len(values):
        prev = table[-1]
        table.append([min(prev[i], prev[i + width]) for i in range(len(prev) - width)])
        width *= 2
    return table


def holds(live: Iterable[Holder], environment: str, gpu_model: str, now: datetime, *, skip: int = 0) -> list[Hold]:
    """What the pool's live leases and reservations of a model hold from now: a lease until its expected end (for
    ever when it has none), a reservation over its window; `skip` (the one being decided) left out."""
    model = gpu_model.upper()
    out: list[Hold] = []
    for alloc in live:
        if alloc.ir == skip or alloc.state is State.RESOLVED or alloc.environment != environment:
            continue
        if (alloc.gpu_model or "").upper() != model:
            continue
        team = alloc.team or ""
        if alloc.phase in HOLDING:
            out.append(Hold(now, alloc.expires_at or FOREVER, alloc.gpu_count, team))
        elif (
            alloc.reserved_from is not None and alloc.reserved_until is not None and alloc.phase is not Phase.REQUESTED
        ):
            # Booked, or at its start waiting for a host: its window is spoken for.
            out.append(Hold(max(alloc.reserved_from, now), alloc.reserved_until, alloc.gpu_count, team, reserved=True))
    return out
