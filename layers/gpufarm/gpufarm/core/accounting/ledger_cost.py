"""The ledger in money: what each ledger line's held GPUs cost an hour at the rate card, split by kind (busy, idle
with no process, idle-held, unmeasured), and what each pool's unallocated GPUs cost an hour; for `/gpu quota` and
the ledger's gauges (`gpufarm.ledger.cost.*`, gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES).

A line's price is its leases' GPU-hour rates (gpufarm.core.money.lease_rate: MIG shares applied) times the units
each holds; a line with a lease no rate prices is unpriced (None) and sends no cost series, never 0. The kinds
split the line's price in proportion to its GPUs of each kind now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from gpufarm.core.accounting.gpu_hours import NO_LEASE, Accounts, LedgerLine, LineKey
from gpufarm.core.kernel.accrued import held_by_host
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.core.money.card import RateCard
from gpufarm.core.money.lease_rate import lease_rate

PER_HOUR = "gpufarm.ledger.cost.per_hour"
UNALLOCATED_PER_HOUR = "gpufarm.ledger.cost.unallocated_per_hour"


def hourly_cost(card: RateCard, live: Iterable[Allocation]) -> dict[LineKey, Decimal | None]:
    """What each ledger line's held GPUs cost an hour (None: a lease of the line is unpriced)."""
    out: dict[LineKey, Decimal | None] = {}
    for alloc in live:
        if alloc.phase not in HOLDING:
            continue
        model = (alloc.gpu_model or "").upper()
        key = (alloc.team or NO_LEASE, alloc.project or NO_LEASE, alloc.environment or NO_LEASE, model)
        rate = lease_rate(card, alloc.environment, alloc.gpu_model, alloc.devices)
        if rate is None or (key in out and out[key] is None):
            out[key] = None
            continue
        units = sum(held_by_host(alloc).values())
        out[key] = (out.get(key) or Decimal(0)) + rate.per_gpu_hour * units
    return out


def by_kind(line: LedgerLine, per_hour: Decimal) -> dict[str, Decimal]:
    """A line's price an hour split by its GPUs of each kind now."""
    if line.allocated <= 0:
        return {}
    gpus = {
        "busy": line.used,
        "idle": line.idle - line.idle_held,
        "idle_held": line.idle_held,
        "unmeasured": float(line.unmeasured),
    }
    return {kind: per_hour * Decimal(repr(n)) / line.allocated for kind, n in gpus.items()}


def cost_series(
    acc: Accounts,
    hourly: Mapping[LineKey, Decimal | None],
    card: RateCard,
    capacity: Mapping[tuple[str, str], int],
    timestamp: int,
) -> list[MetricSeries]:
    """The cost gauges: per line and kind, and per pool the unallocated GPUs (capacity: total GPUs per pool, model)."""
    out: list[MetricSeries] = []
    currency = card.currency

    def gauge(name: str, value: Decimal, **tags: str) -> None:
        tag_list = tuple(normalize_tag(f"{k}:{v}") for k, v in tags.items())
        out.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tag_list, type=3))

    for key, line in sorted(acc.lines.items()):
        per_hour = hourly.get(key)
        if per_hour is None:
            continue
        team, project, env, model = key
        for kind, value in by_kind(line, per_hour).items():
            gauge(
                PER_HOUR,
                value,
                team=team,
                project=project,
                environment=env,
                gpu_model=model,
                kind=kind,
                currency=currency,
            )
    for (env, model), total in sorted(capacity.items()):
        rate = card.rate(env, model)
        if rate is None:
            continue
        free = max(0, total - acc.allocated.get((env, model.upper()), 0))
        gauge(
            UNALLOCATED_PER_HOUR, rate.per_gpu_hour * free, environment=env, gpu_model=model.upper(), currency=currency
        )
    return out
