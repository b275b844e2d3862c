"""The earliest start a pool's timeline allows a request: when enough GPUs are free for its whole duration.

The timeline is the pool's GPUs now free, each live lease's GPUs coming back at its end, and `holds`: GPUs the
pool has promised over a future window (a `Hold` each: a reservation on the calendar takes its GPUs from its start
to its end). Whatever decides future holds adds them to the list it passes; the computation counts every hold the
same way, so the calendar needs no change here. Ends are promises, not facts (a lease may be extended, released
early or reclaimed idle): the answer is "no earlier than", and `/gpu why` says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Release:
    """GPUs a live lease gives back at its end."""

    at: datetime
    gpus: int


@dataclass(frozen=True)
class Hold:
    """GPUs the pool has promised from `start` to `end` (a reservation on the calendar)."""

    start: datetime
    end: datetime
    gpus: int


def earliest_start(  # noqa: PLR0917 - the timeline's parts, each a plain value
    now: datetime,
    free_now: int,
    need: int,
    duration: timedelta,
    releases: Iterable[Release],
    holds: Iterable[Hold] = (),
) -> datetime | None:
    """The first moment from `now` at which `need` GPUs stay free for `duration`, or None when the timeline never
    frees enough (the request is bigger than what the pool's known ends give back)."""
    steps: dict[datetime, int] = {}
    for release in releases:
        at = max(release.at, now)
        steps[at] = steps.get(at, 0) + release.gpus
    for hold in holds:
        if hold.end <= now or hold.gpus <= 0:
            continue
        start = max(hold.start, now)
        steps[start] = steps.get(start, 0) - hold.gpus
        steps[hold.end] = steps.get(hold.end, 0) + hold.gpus
    times = sorted(steps)
    levels = _levels(free_now, times, steps, now)
    for index, (at, level) in enumerate(levels):
        if level >= need and _stays(levels, index, at + duration, need):
            return at
    return None


def _levels(
    free_now: int, times: Sequence[datetime], steps: dict[datetime, int], now: datetime
) -> list[tuple[datetime, int]]:
    """The free GPUs from each breakpoint on: (now, free_now after the changes at now), then one per later time."""
    level = free_now + steps.get(now, 0)
    out = [(now, level)]
    for at in times:
        if at == now:
            continue
        level += steps[at]
        out.append((at, level))
    return out


def _stays(levels: Sequence[tuple[datetime, int]], index: int, until: datetime, need: int) -> bool:
    """True when the free GPUs stay at `need` or more from levels[index] until `until`."""
    for at, level in levels[index + 1 :]:
        if at >= until:
            return True
        if level < need:
            return False
    return True
