"""The calendar's gauges, sent with the ledger's by the sync: GPU-hours reserved ahead, and each pool's next days.

`gpufarm.ledger.gpu_hours.reserved` is the reserved column of the ledger: per team, project, pool and model, the
GPU-hours of reservations booked and not yet begun (GPUs x their window). A reservation that starts moves to the
held columns (its lease accrues as any lease), and one released, cancelled or refused stops counting at once.
`gpufarm.calendar.gpus.reserved` is the pools' calendar for the dashboards: per pool, model and day ahead (0 is
today, UTC), the most GPUs reserved at any moment of the day, as `/gpu calendar` shows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from gpufarm.core.calendar.booking import use
from gpufarm.core.calendar.reservations import holds
from gpufarm.core.calendar.view import DAYS
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries

RESERVED_HOURS = "gpufarm.ledger.gpu_hours.reserved"
RESERVED_DAYS = "gpufarm.calendar.gpus.reserved"
HOURS_DIGITS = 3


def booked(alloc: Allocation) -> bool:
    """A reservation booked and not begun: what the reserved column counts."""
    return alloc.phase is Phase.RESERVED and alloc.state is not State.RESOLVED and alloc.reserved_until is not None


def reserved_hours(alloc: Allocation, now: datetime) -> float:
    """GPU-hours a booked reservation holds ahead of `now` (0 for anything else)."""
    if not booked(alloc) or alloc.reserved_from is None or alloc.reserved_until is None:
        return 0.0
    start = max(alloc.reserved_from, now)
    hours = max((alloc.reserved_until - start).total_seconds(), 0.0) / 3600
    return round(alloc.gpu_count * hours, HOURS_DIGITS)


def calendar_series(live: Iterable[Allocation], pools: dict[str, tuple[str, ...]], now: datetime) -> list[MetricSeries]:
    """The reserved column per team, project, pool and model, and every pool's reserved GPUs per day ahead."""
    ts = int(now.timestamp())
    out: list[MetricSeries] = []

    def gauge(name: str, value: float, **tags: object) -> None:
        tag_list = tuple(normalize_tag(f"{k}:{v}") for k, v in tags.items())
        out.append(MetricSeries(name, (MetricPoint(ts, float(value)),), tag_list, type=3))

    leases = list(live)
    column: dict[tuple[str, str, str, str], float] = {}
    for alloc in leases:
        hours = reserved_hours(alloc, now)
        if hours > 0:
            key = (
                alloc.team or "none",
                alloc.project or "none",
                alloc.environment or "",
                (alloc.gpu_model or "").upper(),
            )
            column[key] = column.get(key, 0.0) + hours
    for (team, project, env, model), hours in sorted(column.items()):
        gauge(RESERVED_HOURS, round(hours, HOURS_DIGITS), team=team, project=project, environment=env, gpu_model=model)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    for env, models in sorted(pools.items()):
        for model in models:
            steps = use(holds(leases, env, model, now), reserved_only=True)
            for day in range(DAYS):
                low = max(midnight + timedelta(days=day), now)
                gauge(
                    RESERVED_DAYS,
                    steps.peak(low, midnight + timedelta(days=day + 1)),
                    environment=env,
                    gpu_model=model,
                    day=f"{day:02d}",
                )
    return out
