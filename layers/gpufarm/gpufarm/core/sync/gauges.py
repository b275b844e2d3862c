"""The sync's gauges: quota (entitled / allocated per team, pool, model), inventory (total / free per pool, model),
the inventory ledger's (down, no agent, cloud quotas, source errors), waiting requests and idle warnings
(gpufarm.core.leases.metrics), the accounting ledger's (gpufarm.core.accounting.series), the calendar's, and the
outlook's free capacity per pool, model and week ahead (gpufarm.core.outlook.gauges), in one submit."""

from __future__ import annotations

from typing import Any

from gpufarm.core.accounting import agent_usage, budgets, gpu_hours, ledger_cost, overrides, series
from gpufarm.core.accounting.override_series import override_series
from gpufarm.core.calendar.gauges import calendar_series
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.inventory.ledger_gauges import ledger_series
from gpufarm.core.inventory.sources import Ledger
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.core.leases import metrics
from gpufarm.core.outlook.capacity import outlook
from gpufarm.core.outlook.gauges import outlook_series
from gpufarm.core.sync.inventory_read import read_ledger


@invocation
def publish_gauges(
    ctx: LeaseContext,
    ledger: Ledger | None = None,
    usage: gpu_hours.Usage | None = None,
    burned: list[budgets.Burn] | None = None,
) -> int:
    """Every gauge of the farm, sent once; returns how many series were sent.

    The inventory ledger (gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES), the busy-GPU measurement and the
    budgets' burn are read here when the caller did not read them already.
    """
    if ctx.metrics is None:
        return 0
    if ledger is None:
        ledger = read_ledger(ctx)
    live = ctx.live()
    ts = int(ctx.now().timestamp())
    out: list[MetricSeries] = []

    def gauge(name: str, value: float, tags: list[str]) -> None:
        out.append(MetricSeries(name, (MetricPoint(ts, float(value)),), tuple(tags), type=3))

    held: dict[tuple[str | None, str | None, str], int] = {}
    for a in live:
        if a.phase in HOLDING:
            key = (a.team, a.environment, (a.gpu_model or "").upper())
            # What the lease holds: whole hosts on dedicated pools (gpufarm.core.governance.charging), not its ask.
            held[key] = held.get(key, 0) + (sum(a.host_gpus.values()) or a.gpu_count)
    # The quotas as decisions read them: the farm file's plus the changes in effect (gpufarm.core.accounting.overrides).
    changes = overrides.live(ctx)
    for team, spec in sorted(overrides.apply(ctx.farm, changes).teams.items()):
        for env, models in sorted(spec.quotas.items()):
            for model, q in sorted(models.items()):
                tags = metric_tags(team=team, environment=env, gpu_model=model)
                gauge("gpufarm.quota.entitled", q.gpus, tags)
                gauge("gpufarm.quota.allocated", held.get((team, env, model), 0), tags)
    summary = ctx.inventory_summary()
    for (env, model), (free, total) in sorted(summary.items()):
        tags = metric_tags(environment=env, gpu_model=model)
        gauge("gpufarm.inventory.gpus.total", total, tags)
        gauge("gpufarm.inventory.gpus.free", free, tags)
    out += ledger_series(ledger, ts)
    out += override_series(ctx.farm, changes, live, ts)
    # Requests waiting and their age, leases warned as idle: from the same read of the live incidents.
    out += metrics.gauges(live, ctx.farm, ctx.now())
    if usage is None:
        usage = gpu_hours.measure(ctx.usage, ctx.now(), ctx.farm.ledger, agent_usage.for_farm(ctx.farm))
    measured = gpu_hours.accounts(live, usage, ctx.inventory())
    if burned is None:
        burned = budgets.burns(ctx, ctx.farm.budgets)
    out += series.ledger_series(measured, burned, ts)
    # The ledger in money: per line and kind, and each pool's unallocated GPUs (gpufarm.core.accounting.ledger_cost).
    card = ctx.rate_card()
    totals = {key: total for key, (_, total) in summary.items()}
    out += ledger_cost.cost_series(measured, ledger_cost.hourly_cost(card, live), card, totals, ts)
    # The reserved column and the pools' calendars (gpufarm.core.calendar.gauges), from the same live read.
    pools = {name: env.gpu_models for name, env in ctx.farm.environments.items()}
    out += calendar_series(live, pools, ctx.now())
    # Free capacity four weeks ahead (gpufarm.core.outlook): the inventory less leases to their ends and reservations.
    out += outlook_series(outlook(live, {key: total for key, (_, total) in summary.items()}, ctx.now()), ts)
    if out:
        ctx.metrics.submit(out)
    return len(out)


def metric_tags(**values: Any) -> list[str]:
    """`key:value` metric tags, normalized as Datadog stores them."""
    return [normalize_tag(f"{k}:{v}") for k, v in values.items()]
