"""The gauges of quota changes and borrowing, as gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES declares them:
per team, pool and model, the GPUs the quota changes in effect add (gpufarm.core.accounting.overrides) and what the
team's live leases borrowed beyond its quota (gpufarm.core.leases.lending). Every quota of the farm file gets both,
0 when nothing changes it, so a dashboard's line drops back to 0 when a change ends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpufarm.core.accounting.overrides import Override
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries

Key = tuple[str, str, str]


def override_series(
    farm: FarmConfig, changes: Sequence[Override], live: Iterable[Allocation], timestamp: int
) -> list[MetricSeries]:
    """`gpufarm.quota.override_gpus` and `gpufarm.quota.borrowed_gpus` per team, pool and model."""
    added: dict[Key, int] = {}
    for change in changes:
        key = (change.team, change.environment, change.gpu_model)
        added[key] = added.get(key, 0) + change.delta
    borrowed: dict[Key, int] = {}
    for a in live:
        if a.phase in HOLDING and a.borrowed and a.team and a.environment:
            key = (a.team, a.environment, (a.gpu_model or "").upper())
            borrowed[key] = borrowed.get(key, 0) + a.borrowed
    keys = {(t, e, m) for t, spec in farm.teams.items() for e, models in spec.quotas.items() for m in models}
    series: list[MetricSeries] = []
    for team, env, model in sorted(keys | set(added) | set(borrowed)):
        tags = tuple(normalize_tag(f"{k}:{v}") for k, v in (("team", team), ("environment", env), ("gpu_model", model)))
        for name, value in (
            ("gpufarm.quota.override_gpus", added.get((team, env, model), 0)),
            ("gpufarm.quota.borrowed_gpus", borrowed.get((team, env, model), 0)),
        ):
            series.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tags, type=3))
    return series
