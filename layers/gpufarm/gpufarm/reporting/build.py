"""Build a report from leases (pure): per group GPU-hours held / busy / idle / unmeasured, counts and waits.

Held, busy, idle and unmeasured are the incidents' accrued GPU-hours inside the period (gpufarm.core.money.lease_cost);
**unmeasured** hours (no agent answer when they accrued, or held since the last accrual) are never counted as
idle, and the leases holding them are listed. Warnings, keeps, exemptions, reclaims and waits come from each
lease's history (gpufarm.reporting.events). Team rows add the team's entitlement and what it holds now; team and
project rows their GPU-hour budgets' burn (gpufarm.core.accounting.burn) in the budget's period holding the report's
end.

Money (gpufarm.reporting.money): each lease's hours by kind at its rate from the farm's rate card, beside every
hours column; per pool and model, the capacity no lease held (from the inventory gauges, where read) and its cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from gpufarm.core.accounting import burn
from gpufarm.core.config.budget_terms import BudgetTerms
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import accrued
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.money.card import RateCard
from gpufarm.core.money.lease_cost import lease_hours
from gpufarm.reporting import money, quota_changes, reasons, squatting
from gpufarm.reporting.events import lease_events
from gpufarm.reporting.model import MAX_LEASE_LINES, BudgetUse, LeaseLine, PoolLine, Report, Row, UsageSeries
from gpufarm.reporting.query import GroupBy, ReportQuery
from gpufarm.reporting.read import MAX_LEASES, Leases
from gpufarm.reporting.reserved import add_reserved

NONE = "(none)"


def budget_moment(query: ReportQuery) -> datetime:
    """The instant whose budget periods a report shows: the last second of its period."""
    return query.period.end - timedelta(seconds=1)


def months_to_read(query: ReportQuery, farm: FarmView) -> tuple[str, ...]:
    """The months whose ended leases the report needs: its own, and its budgets' periods."""
    at = budget_moment(query)
    months = set(query.period.months)
    for budget in farm.budgets:
        months |= set(burn.period_months(budget.period, at))
    return tuple(sorted(months))


def group_key(alloc: LeaseFacts, by: GroupBy) -> str:
    """The row a lease belongs to."""
    if by is GroupBy.IR:
        return alloc.ir_label
    value = {GroupBy.TEAM: alloc.team, GroupBy.PROJECT: alloc.project, GroupBy.ENVIRONMENT: alloc.environment}[by]
    return value or NONE


def selected(alloc: LeaseFacts, query: ReportQuery) -> bool:
    """True when the lease passes the report's team and project filters."""
    return (query.team is None or alloc.team == query.team) and (
        query.project is None or alloc.project == query.project
    )


def unmeasured_note(total: Row) -> str:
    """How many GPU-hours are unmeasured, and why such hours are: never counted as idle."""
    said = f"{total.unmeasured:,.1f} GPU-hours of {total.unmeasured_leases} lease(s) are unmeasured (not idle)"
    if total.unmeasured <= 0:
        return said
    return (
        f"{said}: no node agent (gpufarm-node, or the Datadog Agent where the pool reads it) answered for their "
        "hosts when the hours accrued, or they were held since the last accrual (the sync, every 15 minutes)"
    )


def _add(row: Row, other: Row) -> None:
    row.leases += other.leases
    row.held += other.held
    row.busy += other.busy
    row.idle += other.idle
    row.idle_held += other.idle_held
    row.unmeasured += other.unmeasured
    row.unmeasured_leases += other.unmeasured_leases
    row.idle_warnings += other.idle_warnings
    row.keeps += other.keeps
    row.exemptions += other.exemptions
    row.squatter_episodes += other.squatter_episodes
    row.squatter_stops += other.squatter_stops
    row.reclaims.update(other.reclaims)
    row.waits += other.waits
    row.reserved += other.reserved
    money.add_rows(row, other)


def _lease_row(alloc: LeaseFacts, query: ReportQuery, now: datetime, card: RateCard) -> tuple[Row, LeaseLine] | None:
    hours = lease_hours(alloc, query.period.start, query.period.end, now)
    events = lease_events(alloc, query.period)
    if hours.held <= 0 and events.ended is None and events.waited_hours is None and not events.counts:
        return None
    row = Row(
        key=group_key(alloc, query.by),
        leases=1 if hours.held > 0 else 0,
        held=hours.held,
        busy=hours.busy,
        idle=hours.idle,
        idle_held=hours.idle_held,
        unmeasured=hours.unmeasured,
        unmeasured_leases=1 if hours.unmeasured > 0 else 0,
        idle_warnings=events.counts["warned"],
        keeps=events.counts["kept"],
        exemptions=events.counts["exempted"],
        squatter_episodes=squatting.episodes(events.counts),
        squatter_stops=squatting.stops(events.counts),
    )
    priced = money.lease_money(card, alloc, hours) if hours.held > 0 else None
    money.add_lease(row, priced, hours.held)
    if events.ended is not None:
        row.reclaims[events.ended] += 1
    if events.waited_hours is not None:
        row.waits.append(events.waited_hours)
    line = LeaseLine(
        alloc.ir,
        alloc.team or NONE,
        alloc.project or NONE,
        alloc.environment or NONE,
        hours.held,
        hours.busy,
        hours.idle,
        hours.unmeasured,
        hours.idle_held,
        money.wasted(priced),
    )
    return row, line


def _team_extras(row: Row, farm: FarmView, live: Sequence[LeaseFacts]) -> None:
    spec = farm.teams.get(row.key)
    if spec is None:
        return
    row.entitled = sum(q.gpus for models in spec.quotas.values() for q in models.values())
    row.held_now = sum(sum(accrued.held_by_host(a).values()) for a in live if a.team == row.key and a.phase in HOLDING)


def _budget_uses(applicable: Iterable[BudgetTerms], leases: Sequence[LeaseFacts], at: datetime) -> list[BudgetUse]:
    out = []
    for budget in applicable:
        if budget.gpu_hours is None:
            continue  # a budget in money: `/gpu budget` and the gauges show it (gpufarm.core.accounting.spend)
        used = burn.burn(budget, leases, at)
        out.append(BudgetUse(budget.label(), used.period, used.burned, budget.gpu_hours))
    return out


def _grouped(
    chosen: Sequence[LeaseFacts], query: ReportQuery, now: datetime, card: RateCard
) -> tuple[dict[str, Row], list[LeaseLine], dict[tuple[str, str], float]]:
    """The rows by group key, the lease lines of the leases with anything inside the period, and the GPU-hours
    held per pool and model."""
    rows: dict[str, Row] = {}
    lines: list[LeaseLine] = []
    pools: dict[tuple[str, str], float] = {}
    for alloc in chosen:
        found = _lease_row(alloc, query, now, card)
        if found is None:
            continue
        part, line = found
        _add(rows.setdefault(part.key, Row(part.key)), part)
        lines.append(line)
        if alloc.environment and alloc.gpu_model:
            pool = (alloc.environment, alloc.gpu_model.upper())
            pools[pool] = pools.get(pool, 0.0) + part.held
    return rows, lines, pools


def _add_quotas_and_budgets(
    rows: Iterable[Row], query: ReportQuery, farm: FarmView, chosen: Sequence[LeaseFacts]
) -> None:
    """A team's quota and what it holds now, and the budgets of each team or project row."""
    live = [a for a in chosen if a.phase in HOLDING]
    at = budget_moment(query)
    for row in rows:
        if query.by is GroupBy.TEAM:
            _team_extras(row, farm, live)
            team_budgets = [b for b in farm.budgets if b.team == row.key and b.project is None]
            row.budgets = _budget_uses(team_budgets, chosen, at)
        elif query.by is GroupBy.PROJECT:
            row.budgets = _budget_uses([b for b in farm.budgets if b.project == row.key], chosen, at)


def _every_team_row(rows: dict[str, Row], query: ReportQuery, farm: FarmView) -> None:
    """A team with quotas and no lease in the period still has a row: what it may hold is part of the answer."""
    if query.by is GroupBy.TEAM and query.project is None:
        for team in farm.teams if query.team is None else [query.team]:
            rows.setdefault(team, Row(team))


def build_report(
    query: ReportQuery,
    read: Leases,
    farm: FarmView,
    now: datetime,
    *,
    usage: Sequence[UsageSeries] = (),
    usage_note: str | None = None,
    card: RateCard | None = None,
    capacity: tuple[dict[tuple[str, str], float] | None, str] | None = None,
) -> Report:
    """The report for `query` from the leases read (see the module docstring); rows by held GPU-hours, largest first.

    card: the rate card (default: the farm file's written prices alone); capacity: the mean GPUs per pool and model
    read from the inventory gauges (gpufarm.reporting.capacity) and its note, for the unallocated hours.
    """
    card = card if card is not None else RateCard(farm.rates)
    # Quota changes are incidents too: never a lease row, their effect in the entitlement and the notes.
    chosen = [a for a in quota_changes.leases_only(read.leases) if selected(a, query)]
    farm = quota_changes.with_changes(farm, read.leases, now)
    rows, lines, held_by_pool = _grouped(chosen, query, now, card)
    add_reserved(rows, chosen, query.period, lambda a: group_key(a, query.by))
    _every_team_row(rows, query, farm)
    _add_quotas_and_budgets(rows.values(), query, farm, chosen)
    total = Row("total")
    for row in rows.values():
        _add(total, row)
    ordered = sorted(rows.values(), key=lambda r: (-r.held, r.key))
    pools, capacity_note = _pools(query, farm, card, held_by_pool, capacity)
    said = [
        f"more than {MAX_LEASES:,} leases: the report was cut there" if read.cut else None,
        usage_note,
        money.money_note(total, card.currency),
        capacity_note,
    ]
    notes = [unmeasured_note(total), *(n for n in said if n), *quota_changes.notes(read.leases, now)]
    return Report(
        query=query,
        generated=now,
        rows=ordered,
        total=total,
        top_idle=sorted((x for x in lines if x.idle > 0), key=lambda x: (-x.idle, x.ir))[:MAX_LEASE_LINES],
        unmeasured=sorted((x for x in lines if x.unmeasured > 0), key=lambda x: (-x.unmeasured, x.ir))[
            :MAX_LEASE_LINES
        ],
        notes=notes,
        usage=list(usage),
        reasons=reasons.counted(chosen, query.period),
        currency=card.currency,
        pools=pools,
    )


def _pools(
    query: ReportQuery,
    farm: FarmView,
    card: RateCard,
    held: dict[tuple[str, str], float],
    capacity: tuple[dict[tuple[str, str], float] | None, str] | None,
) -> tuple[list[PoolLine], str | None]:
    """Per pool and model, the unallocated capacity, and where capacity came from: for the whole farm only (a
    team's or a project's report has no spare capacity of its own)."""
    if query.team is not None or query.project is not None:
        return [], None
    gpus, note = capacity if capacity is not None else (None, None)
    offered = {name: env.gpu_models for name, env in farm.environments.items()}
    return money.pool_lines(card, offered, held, gpus, query.period.hours), note
