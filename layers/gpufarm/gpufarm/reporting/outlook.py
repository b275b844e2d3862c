"""`gpufarm report --outlook`: unmet demand per pool and model over the period, and four weeks of free capacity.

Read as the report reads (gpufarm.reporting.read: the live leases, and the ended ones that accrued or ended with a
reason in the period's months) plus the inventory's hosts once (the host list the sync's inventory summary counts:
GPUs per pool and model, units on shared pools); built by gpufarm.core.outlook. The period is the report's
(`--since`, `--month`); the outlook is per pool and model, so it takes no team, project or grouping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.config.pool_kind import PoolKind
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.hosts import GpuHost, host_filter
from gpufarm.core.kernel.ports import HostTags, IncidentStore, LeaseReads
from gpufarm.core.outlook.capacity import PoolOutlook, first_short, outlook, pool_capacity
from gpufarm.core.outlook.demand import Demand, unmet_demand
from gpufarm.reporting import quota_changes
from gpufarm.reporting.query import Period, parse_query
from gpufarm.reporting.read import MAX_LEASES, read_leases


@dataclass(frozen=True)
class OutlookReport:
    """Unmet demand over a period and the free capacity ahead of its generation."""

    period: Period
    generated: datetime
    demand: list[Demand]
    pools: list[PoolOutlook]
    notes: list[str] = field(default_factory=list)


def check_scope(team: str | None, project: str | None) -> None:
    """The outlook is per pool and model: a team or project filter is refused (rule 10)."""
    if team is not None or project is not None:
        raise ValidationFailed("outlook", "--outlook is per pool and model: give neither --team nor --project")


def read_capacity(hosts: HostTags, farm: FarmView) -> dict[tuple[str, str], int]:
    """GPUs per pool and offered model from one listing of the managed hosts."""
    found = [h for h in (GpuHost.from_tags(i.name, i.tags) for i in hosts.list_hosts(host_filter())) if h is not None]
    shared = [name for name, env in farm.environments.items() if env.kind is PoolKind.SHARED]
    return pool_capacity({name: env.gpu_models for name, env in farm.environments.items()}, found, shared)


def make_outlook(
    incidents: IncidentStore | LeaseReads,
    hosts: HostTags,
    farm: FarmView,
    now: datetime,
    *,
    since: str | None = None,
    month: str | None = None,
    limit: int = MAX_LEASES,
) -> OutlookReport:
    """The outlook for the period asked (see the module docstring)."""
    query = parse_query(farm, now, since=since, month=month)
    read = read_leases(incidents, query.period.months, limit=limit)
    leases = quota_changes.leases_only(read.leases)
    period = query.period
    demand = unmet_demand(leases, period.start, period.end, now)
    pools = outlook(leases, read_capacity(hosts, farm), now)
    notes = []
    short = first_short(pools)
    if short is None:
        notes.append("capacity does not run out in the next four weeks in any pool")
    else:
        pool, slot = short
        notes.append(
            f"capacity runs out first in {pool.environment} {pool.gpu_model}, the week of "
            f"{slot.start:%Y-%m-%d} ({slot.free} free at its busiest moment)"
        )
    notes.append(
        "leases hold their GPUs until their expected ends (for ever without one); waits count requests queued for "
        "hosts, not those waiting for an operator"
    )
    if read.cut:
        notes.append(f"more than {MAX_LEASES:,} leases: the outlook was cut there")
    return OutlookReport(period, now, demand, pools, notes)
