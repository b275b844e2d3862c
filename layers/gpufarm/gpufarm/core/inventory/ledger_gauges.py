"""The inventory ledger's gauges, declared once (LEDGER_GAUGES: names, tags, units, for the dashboards to read):
down and agentless GPUs, unregistered and unknown nodes, cloud quotas and reservations, source errors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpufarm.core.inventory.sources import Ledger
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ports import (
    MetricPoint,
    MetricSeries,
)


@dataclass(frozen=True)
class GaugeSpec:
    """A gauge the sync publishes: its name, the tags it carries, its unit and what it means."""

    name: str
    tags: tuple[str, ...]
    unit: str
    description: str


LEDGER_GAUGES = (
    GaugeSpec(
        "gpufarm.inventory.gpus.down",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs of registered nodes silent past inventory.down_after_minutes (excluded from allocation)",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.no_agent",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs of nodes a cloud or static source lists that no registered host answers to",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.unregistered",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs the Datadog Agent's GPU check reports on hosts gpufarm has no registration for (never allocated)",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.cloud",
        ("environment", "gpu_model", "source"),
        "gpu",
        "GPUs of the nodes each cloud or static source lists, with or without an agent",
    ),
    GaugeSpec(
        "gpufarm.inventory.nodes.unknown",
        ("source", "region"),
        "host",
        "nodes whose GPU model the source could not say (unknown instance type or no GPU information)",
    ),
    GaugeSpec(
        "gpufarm.cloud.quota.limit",
        ("source", "region", "family", "unit"),
        "cpu",
        "a cloud region's quota for a family of GPU instances (EC2 vCPUs, Azure cores)",
    ),
    GaugeSpec(
        "gpufarm.cloud.quota.used",
        ("source", "region", "family", "unit"),
        "cpu",
        "what is in use against that quota (EC2: the vCPUs of the instances found; Azure: the usage API)",
    ),
    GaugeSpec(
        "gpufarm.cloud.quota.held",
        ("source", "region", "family", "unit"),
        "cpu",
        "the part of that quota held by gpufarm leases (instances whose registered host carries an ir: tag)",
    ),
    GaugeSpec(
        "gpufarm.cloud.reservation.instances",
        ("source", "region", "instance_type", "kind", "gpu_model"),
        "instance",
        "instances reserved (EC2 capacity reservations and capacity blocks)",
    ),
    GaugeSpec(
        "gpufarm.cloud.reservation.available",
        ("source", "region", "instance_type", "kind", "gpu_model"),
        "instance",
        "reserved instances not running yet",
    ),
    GaugeSpec(
        "gpufarm.inventory.source.errors",
        ("source",),
        "error",
        "parts of a source (regions, subscriptions) that failed or throttled in the last sync and were skipped",
    ),
    GaugeSpec(
        "gpufarm.inventory.source.calls",
        ("source",),
        "request",
        "API calls a source made in the last sync",
    ),
    # The measured ledger (gpufarm.core.accounting.gpu_hours) and the GPU-hour budgets
    # (gpufarm.core.accounting.budgets).
    GaugeSpec(
        "gpufarm.ledger.gpus.allocated",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "GPUs held by live leases (whole hosts on dedicated pools, units on shared ones)",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.used",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "held GPUs seen busy over ledger.window_minutes (gpufarm.ir.gpus_busy; gpu.sm_active on datadog-agent pools)",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.idle",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "held GPUs the agents saw not busy",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.idle_held",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "of the idle GPUs, those holding memory with no work (gpufarm-node pools only)",
    ),
    GaugeSpec(
        "gpufarm.ledger.cost.per_hour",
        ("team", "project", "environment", "gpu_model", "kind", "currency"),
        "currency",
        "what the held GPUs cost an hour at the rate card, by kind (busy, idle, idle_held, unmeasured); "
        "none for an unpriced pool or model, never 0",
    ),
    GaugeSpec(
        "gpufarm.ledger.cost.unallocated_per_hour",
        ("environment", "gpu_model", "currency"),
        "currency",
        "what a pool's GPUs no lease holds cost an hour at its whole-GPU rate; none when unpriced",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.unmeasured",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "held GPUs no metrics measured (agent silent or the query failed): never counted idle",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.allocated",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs held by live leases per environment and model",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.unattributed",
        ("host", "team", "environment"),
        "gpu",
        "busy GPUs no lease claims (gpu_ir:none), per host and the team its tags name (none without one)",
    ),
    GaugeSpec(
        "gpufarm.ledger.measured",
        (),
        "",
        "1 when the sync's busy-GPU query answered, 0 when every held GPU counts as unmeasured",
    ),
    # The pools' calendars (gpufarm.core.calendar.gauges): the reserved column, and the days ahead per pool.
    GaugeSpec(
        "gpufarm.ledger.gpu_hours.reserved",
        ("team", "project", "environment", "gpu_model"),
        "hour",
        "GPU-hours of reservations booked and not begun (GPUs x window); a reservation released stops counting",
    ),
    GaugeSpec(
        "gpufarm.calendar.gpus.reserved",
        ("environment", "gpu_model", "day"),
        "gpu",
        "the most GPUs reserved at any moment of a day ahead (day 00 is today, UTC), per pool and model",
    ),
    GaugeSpec(
        "gpufarm.budget.gpu_hours",
        ("team", "project", "period"),
        "hour",
        "a GPU-hour budget for its current period (project:all for a team's own budget)",
    ),
    GaugeSpec(
        "gpufarm.budget.burned",
        ("team", "project", "period"),
        "hour",
        "GPU-hours the budget's leases held in the current period",
    ),
    GaugeSpec(
        "gpufarm.budget.remaining",
        ("team", "project", "period"),
        "hour",
        "GPU-hours left in the budget's current period",
    ),
    # Budgets in money (gpufarm.core.accounting.spend): the amount, what the priced leases cost, and whether a lease
    # on a pool with no rate leaves the burn incomplete (then spent is the priced part only, never "under budget").
    GaugeSpec(
        "gpufarm.budget.amount",
        ("team", "project", "period", "currency"),
        "currency",
        "a budget in money for its current period, in the rate card's currency",
    ),
    GaugeSpec(
        "gpufarm.budget.spent",
        ("team", "project", "period", "currency"),
        "currency",
        "what the budget's leases cost in the current period (the priced ones; see gpufarm.budget.incomplete)",
    ),
    GaugeSpec(
        "gpufarm.budget.amount_remaining",
        ("team", "project", "period", "currency"),
        "currency",
        "money left in the budget's current period",
    ),
    GaugeSpec(
        "gpufarm.budget.incomplete",
        ("team", "project", "period"),
        "",
        "1 when a lease of a budget in money is on a pool with no rate (its burn is incomplete), else 0",
    ),
    # Quota changes in effect (gpufarm.core.accounting.overrides) and GPUs borrowed beyond quota
    # (gpufarm.core.leases.lending); gpufarm.quota.entitled already includes the changes.
    GaugeSpec(
        "gpufarm.quota.override_gpus",
        ("team", "environment", "gpu_model"),
        "gpu",
        "GPUs the quota changes in effect add to (or, negative, take from) the team's quota in the farm file",
    ),
    GaugeSpec(
        "gpufarm.quota.borrowed_gpus",
        ("team", "environment", "gpu_model"),
        "gpu",
        "GPUs the team's live leases hold beyond its quota, borrowed from other teams' unused quota",
    ),
)


GAUGE_NAMES = frozenset(g.name for g in LEDGER_GAUGES)


_SPECS = {g.name: g for g in LEDGER_GAUGES}


# A row of gauges: tag values by key, and the value of each gauge by name. A gauge's tags are those LEDGER_GAUGES
# declares for it, in that order, so the declaration is the one place a gauge's shape is said.
Row = tuple[Mapping[str, object], Mapping[str, float]]


def _pool_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for (env, model), count in sorted(ledger.pools.items()):
        yield (
            {"environment": env, "gpu_model": model},
            {
                "gpufarm.inventory.gpus.down": count.down,
                "gpufarm.inventory.gpus.no_agent": count.no_agent,
                "gpufarm.inventory.gpus.unregistered": count.unregistered,
            },
        )


def _cloud_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for (env, model, source), gpus in sorted(ledger.cloud_gpus.items()):
        yield {"environment": env, "gpu_model": model, "source": source}, {"gpufarm.inventory.gpus.cloud": gpus}


def _unknown_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    unknown: dict[tuple[str, str], int] = {}
    for node in ledger.unknown:
        unknown[(node.source, node.region)] = unknown.get((node.source, node.region), 0) + 1
    for (source, region), n in sorted(unknown.items()):
        yield {"source": source, "region": region or "none"}, {"gpufarm.inventory.nodes.unknown": n}


def _quota_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for q in sorted(ledger.quotas, key=lambda q: (q.source, q.region, q.family)):
        yield (
            {"source": q.source, "region": q.region, "family": q.family, "unit": q.unit},
            {
                "gpufarm.cloud.quota.limit": q.limit,
                "gpufarm.cloud.quota.used": q.used,
                "gpufarm.cloud.quota.held": q.held,
            },
        )


def _reservation_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for r in sorted(ledger.reservations, key=lambda r: (r.source, r.region, r.id)):
        tags = {
            "source": r.source,
            "region": r.region,
            "instance_type": r.instance_type,
            "kind": r.kind,
            "gpu_model": r.gpu_model or "unknown",
        }
        yield tags, {"gpufarm.cloud.reservation.instances": r.total, "gpufarm.cloud.reservation.available": r.available}


def _source_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    # Every source named or read gets an error gauge, 0 when it answered: a source that recovers reads 0 again.
    errors: dict[str, int] = dict.fromkeys(sources, 0) | dict.fromkeys(ledger.calls, 0)
    for error in ledger.errors:
        errors[error.source] = errors.get(error.source, 0) + 1
    for source, n in sorted(errors.items()):
        values = {"gpufarm.inventory.source.errors": float(n)}
        if source in ledger.calls:
            values["gpufarm.inventory.source.calls"] = ledger.calls[source]
        yield {"source": source}, values


_ROWS: tuple[Callable[[Ledger, Iterable[str]], Iterable[Row]], ...] = (
    _pool_rows,
    _cloud_rows,
    _unknown_rows,
    _quota_rows,
    _reservation_rows,
    _source_rows,
)


def ledger_series(ledger: Ledger, timestamp: int, sources: Iterable[str] = ()) -> list[MetricSeries]:
    """The ledger as the gauges of LEDGER_GAUGES (sources named with no error still get a 0 error gauge)."""
    named = tuple(sources)
    series: list[MetricSeries] = []
    for rows in _ROWS:
        for tags, values in rows(ledger, named):
            for name, value in values.items():
                tag_list = tuple(normalize_tag(f"{key}:{tags[key]}") for key in _SPECS[name].tags)
                series.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tag_list, type=3))
    return series
