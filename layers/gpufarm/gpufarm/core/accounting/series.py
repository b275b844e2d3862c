"""The ledger's gauges: GPUs held, used, idle and unmeasured per team, project, pool and model, unattributed use,
and each budget's burn, as gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES declares them (sent by the sync)."""

from __future__ import annotations

from collections.abc import Iterable

from gpufarm.core.accounting.budgets import Burn
from gpufarm.core.accounting.gpu_hours import Accounts
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries


def ledger_series(acc: Accounts, burned: Iterable[Burn], timestamp: int) -> list[MetricSeries]:
    """The measured ledger and the budgets as the gauges gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES declares."""
    series: list[MetricSeries] = []

    def gauge(name: str, value: float, **tags: object) -> None:
        tag_list = tuple(normalize_tag(f"{k}:{v}") for k, v in tags.items())
        series.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tag_list, type=3))

    for (team, project, env, model), line in sorted(acc.lines.items()):
        tags = {"team": team, "project": project, "environment": env, "gpu_model": model}
        gauge("gpufarm.ledger.gpus.allocated", line.allocated, **tags)
        gauge("gpufarm.ledger.gpus.used", line.used, **tags)
        gauge("gpufarm.ledger.gpus.idle", line.idle, **tags)
        gauge("gpufarm.ledger.gpus.idle_held", line.idle_held, **tags)
        gauge("gpufarm.ledger.gpus.unmeasured", line.unmeasured, **tags)
    for (env, model), gpus in sorted(acc.allocated.items()):
        gauge("gpufarm.inventory.gpus.allocated", gpus, environment=env, gpu_model=model)
    for (host, team, env), busy in sorted(acc.unattributed.items()):
        gauge("gpufarm.ledger.gpus.unattributed", busy, host=host, team=team, environment=env)
    gauge("gpufarm.ledger.measured", 1 if acc.measured else 0)
    for b in burned:
        tags = {"team": b.budget.team, "project": b.budget.project or "all", "period": b.period}
        gauge("gpufarm.budget.burned", b.burned, **tags)
        if b.budget.amount is None:
            gauge("gpufarm.budget.gpu_hours", b.budget.limit, **tags)
            gauge("gpufarm.budget.remaining", b.remaining, **tags)
            continue
        # A budget in money: its amount, the priced leases' cost and what is left, and whether a lease is unpriced.
        money = {**tags, "currency": b.currency.lower()}
        gauge("gpufarm.budget.amount", float(b.budget.amount), **money)
        gauge("gpufarm.budget.spent", b.used, **money)
        gauge("gpufarm.budget.amount_remaining", b.remaining, **money)
        gauge("gpufarm.budget.incomplete", 1 if b.incomplete else 0, **tags)
    return series
