"""`/gpu calendar [env] [model]`: a pool's next weeks, one line per day: capacity, held by leases, reserved, free.

Each day shows the busiest moment of it (UTC): the most GPUs live leases hold (until their expected ends), the most
reserved, and the fewest free, so a day reads "free" only when that many are free all day long.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufarm.core.calendar.booking import Hold, Steps, use
from gpufarm.core.calendar.reservations import holds, limits
from gpufarm.core.chat.block_kit import Message, context, section
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.errors import ValidationFailed

DAYS = 14
MAX_POOLS = 6


@dataclass(frozen=True, slots=True)
class Day:
    """One day of a pool's calendar for one model."""

    day: datetime
    capacity: int
    held: int
    reserved: int
    free: int


def days(found: list[Hold], capacity: int, start: datetime, count: int = DAYS) -> list[Day]:
    """The next `count` days from `start`'s day (UTC midnight), each at its busiest moment."""
    leases = use([h for h in found if not h.reserved])
    booked = use(found, reserved_only=True)
    total = use(found)
    first = start.replace(hour=0, minute=0, second=0, microsecond=0)
    out: list[Day] = []
    for index in range(count):
        low = max(first + timedelta(days=index), start)
        high = first + timedelta(days=index + 1)
        out.append(
            Day(low, capacity, _peak(leases, low, high), _peak(booked, low, high), capacity - _peak(total, low, high))
        )
    return out


def _peak(steps: Steps, low: datetime, high: datetime) -> int:
    return steps.peak(low, high)


def render(environment: str, gpu_model: str, rows: list[Day]) -> str:
    """The table as Slack shows it in a code block."""
    head = f"{environment} {gpu_model}: day (UTC)   capacity  leases  reserved  free"
    lines = [
        f"{row.day:%a %Y-%m-%d}     {row.capacity:>8}  {row.held:>6}  {row.reserved:>8}  {max(row.free, 0):>4}"
        for row in rows
    ]
    return "\n".join([head, *lines])


def calendar_answer(ctx: LeaseContext, environment: str | None, gpu_model: str | None) -> Message:
    """The calendar of a pool (every pool when none is named), each model or the one named."""
    farm = ctx.farm
    if environment is not None and environment not in farm.environments:
        raise ValidationFailed(
            "environment", f"there is no pool {environment}; pools: {', '.join(sorted(farm.environments))}"
        )
    pools = [environment] if environment else sorted(farm.environments)[:MAX_POOLS]
    model = gpu_model.upper() if gpu_model else None
    if model is not None and not any(model in farm.environments[p].gpu_models for p in pools):
        raise ValidationFailed("gpu_model", f"{', '.join(pools)} offer no {model}")
    now = ctx.now()
    tables: list[str] = []
    for pool in pools:
        live = ctx.live(pool)
        for offered in farm.environments[pool].gpu_models:
            if model is not None and offered != model:
                continue
            capacity = limits(ctx, pool, offered, "").capacity
            tables.append(render(pool, offered, days(holds(live, pool, offered, now), capacity, now)))
    head = f":calendar: The next {DAYS} days, each at its busiest moment"
    blocks = [section(head), *(section(f"```{t}```") for t in tables)]
    blocks.append(context("Book a window: `/gpu reserve 8 H100 env=<pool> project=<p> from 2026-12-10 09:00 for 3d`"))
    return Message(head + "\n" + "\n\n".join(tables), blocks)
