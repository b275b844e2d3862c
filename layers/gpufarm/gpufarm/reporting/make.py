"""Make a report: validate what was asked, read the incidents (and for charts the metrics), build the rows.

Shared by `gpufarm report` and `/gpu report`. The period, grouping and team are checked before anything is read;
a project is checked against the projects the farm's budgets and the leases read name, before anything is built
or written. Bad input raises ValidationFailed (rule 10: a clear answer, nothing changed). Money comes from the
rate card given (default: the farm file's written prices); the pools' capacity, for the unallocated hours, from
the inventory gauges when `metrics` is given (gpufarm.reporting.capacity).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel.ports import IncidentStore, LeaseReads, MetricsHistory
from gpufarm.core.money.card import RateCard
from gpufarm.reporting.build import build_report, months_to_read
from gpufarm.reporting.capacity import read_capacity
from gpufarm.reporting.model import Report
from gpufarm.reporting.query import GroupBy, budget_projects, known_project, parse_query
from gpufarm.reporting.read import MAX_LEASES, read_leases
from gpufarm.reporting.usage import read_usage


def make_report(
    incidents: IncidentStore | LeaseReads,
    farm: FarmView,
    now: datetime,
    *,
    since: str | None = None,
    month: str | None = None,
    by: str = GroupBy.TEAM.value,
    team: str | None = None,
    project: str | None = None,
    metrics: MetricsHistory | None = None,
    with_usage: bool = False,
    limit: int = MAX_LEASES,
    card: RateCard | None = None,
) -> Report:
    """The report asked for (see the module docstring); usage over time is read only `with_usage` (HTML)."""
    first = parse_query(farm, now, since=since, month=month, by=by, team=team)
    read = read_leases(incidents, months_to_read(first, farm), team=first.team, limit=limit)
    # The period, grouping and team are those already checked; only the project waits for the leases read.
    query = replace(first, project=known_project(project, budget_projects(farm) | read.projects()))
    usage, note = read_usage(metrics, query) if with_usage else ([], None)
    whole_farm = query.team is None and query.project is None
    capacity = read_capacity(metrics, query.period) if whole_farm else None
    return build_report(query, read, farm, now, usage=usage, usage_note=note, card=card, capacity=capacity)
