"""Fair share: each team's GPU-hours held in a pool over the usage window, against its share of the pool.

**Used** comes from the leases' accrued GPU-hours (gpufarm.core.accounting.gpu_hours): a live lease's held hours up
to now (its last accrual plus the stretch since, as its end would write them), an ended lease's final hours; the
part of them inside the window is taken in proportion to the time the lease held its GPUs there. Ended leases are
found by the months they accrued in (the budgets' facet), at most MAX_ENDED of them.
**Share** is the team's quota of the pool's model over the sum of every team's quota there, times the pool's GPUs
over the window: `nlp` with 8 of 16 quota GPUs in a pool of 12 GPUs has a 6 x 168 = 1,008 GPU-hour share a week.
A FIFO pool reads nothing of this (its Order needs no standings).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from gpufarm.core.accounting import gpu_hours
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.config.scheduling import QueuePolicy
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.lifecycle import HOLDING, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import ended_query
from gpufarm.core.leases.ordering import FIFO, Order, Standing

log = logging.getLogger(__name__)

MAX_ENDED = 5000


def pool_order(ctx: LeaseContext, environment: str, gpu_model: str) -> Order:
    """The order the pool serves its queue for the model in, with each team's standing where it orders by share."""
    settings = ctx.farm.scheduling.pool(environment)
    if settings.queue is not QueuePolicy.FAIR_SHARE:
        return FIFO
    now = ctx.now()
    start = now - timedelta(days=settings.usage_window_days)
    model = gpu_model.upper()
    leases = [a for a in ctx.live(environment) if (a.gpu_model or "").upper() == model]
    leases += _ended(ctx, environment, model, start, now)
    # The pool's GPUs from its sizes, counted without listing it where the host API allows (core.context.reads).
    capacity = sum(gpus * n for (_, gpus), n in ctx.reads().host_sizes(environment, model).items())
    standings = standings_of(
        ctx.farm, environment=environment, gpu_model=model, leases=leases, start=start, now=now, capacity=capacity
    )
    return Order(QueuePolicy.FAIR_SHARE, settings.usage_window_days, standings)


def standings_of(
    farm: FarmConfig,
    *,
    environment: str,
    gpu_model: str,
    leases: Iterable[Allocation],
    start: datetime,
    now: datetime,
    capacity: int,
) -> dict[str, Standing]:
    """Every team's standing in the pool: quota teams and any team that held GPUs there in the window."""
    used: dict[str, float] = {}
    seen: set[int] = set()
    for alloc in leases:
        if alloc.ir in seen or alloc.environment != environment or not alloc.team:
            continue
        seen.add(alloc.ir)
        used[alloc.team] = used.get(alloc.team, 0.0) + window_hours(alloc, start, now)
    quotas = {}
    for team in farm.teams:
        quota = farm.quota(team, environment, gpu_model)
        if quota is not None and quota.gpus > 0:
            quotas[team] = quota.gpus
    total = sum(quotas.values())
    pool_gpus = capacity if capacity > 0 else total
    hours = (now - start).total_seconds() / 3600
    out: dict[str, Standing] = {}
    for team in sorted(set(quotas) | set(used)):
        share = quotas.get(team, 0) / total * pool_gpus * hours if total else 0.0
        out[team] = Standing(team, used.get(team, 0.0), share)
    return out


def window_hours(alloc: Allocation, start: datetime, now: datetime) -> float:
    """The GPU-hours the lease held between `start` and `now`, from its accrued hours."""
    began = alloc.allocated_at
    if began is None:
        return 0.0
    if alloc.phase in HOLDING and alloc.state is not State.RESOLVED:
        accrued = gpu_hours.accrue(alloc, now, {})
        total, until = (accrued.held, now) if accrued is not None else (alloc.hours_held, now)
    else:
        total, until = alloc.hours_held, alloc.hours_until or began
    span = (until - began).total_seconds()
    if total <= 0 or span <= 0:
        return 0.0
    inside = (until - max(began, start)).total_seconds()
    return total * min(max(inside / span, 0.0), 1.0)


def _ended(ctx: LeaseContext, environment: str, model: str, start: datetime, now: datetime) -> list[Allocation]:
    """The pool's ended leases of the model that accrued in the months the window touches."""
    months = sorted({month for month, _ in gpu_hours.month_spans(start, now)})
    query = ended_query(months, environment=environment)
    out: list[Allocation] = []
    for index, record in enumerate(ctx.incidents.search(query)):
        if index >= MAX_ENDED:
            log.warning(
                "fair share of %s: over %d ended leases in the window, the rest not counted", environment, MAX_ENDED
            )
            break
        alloc = Allocation.from_record(record)
        if (alloc.gpu_model or "").upper() == model and (alloc.hours_until or start) > start:
            out.append(alloc)
    return out
