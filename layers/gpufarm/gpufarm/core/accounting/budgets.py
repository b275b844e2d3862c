"""GPU-hour budgets: per team (optionally per project), per calendar month or quarter, and they never decay.

A period's **burn** is the GPU-hours the team's (or project's) leases held in it: what the incidents accrued in
that period's months (`gpu_hours_by_month`, gpufarm.core.accounting.gpu_hours) plus, for a lease holding now, the hours
since its last accrual. It is read from incidents only: the team's live leases and the leases that ended after
accruing in the period (one search narrowed to the team and the period's months), so burn survives metrics
retention. A request whose expected GPU-hours (GPUs it is charged x days x 24) exceed what is left goes to the
operators with the numbers, whatever its quota says; a request the quota refuses stays refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gpufarm.core.accounting import gpu_hours
from gpufarm.core.config.accounting import Budget, BudgetPeriod, budgets_for
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import Decision, Verdict
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.lifecycle import HOLDING, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery

log = logging.getLogger(__name__)

# Ended leases one budget reads at most (a team ending more leases in a quarter is read up to this many).
MAX_ENDED = 5_000


def period_months(period: BudgetPeriod, now: datetime) -> tuple[str, ...]:
    """The `YYYY-MM` months of the calendar period holding `now` (UTC)."""
    moment = now.astimezone(UTC)
    if period is BudgetPeriod.MONTH:
        return (f"{moment.year:04d}-{moment.month:02d}",)
    first = 3 * ((moment.month - 1) // 3) + 1
    return tuple(f"{moment.year:04d}-{m:02d}" for m in range(first, first + 3))


def period_label(period: BudgetPeriod, now: datetime) -> str:
    """`2026-12` or `2026-Q4`."""
    moment = now.astimezone(UTC)
    if period is BudgetPeriod.MONTH:
        return f"{moment.year:04d}-{moment.month:02d}"
    return f"{moment.year:04d}-Q{(moment.month - 1) // 3 + 1}"


def lease_burn(alloc: Allocation, months: Sequence[str], now: datetime) -> float:
    """GPU-hours the lease held in these months: accrued, plus the un-accrued stretch of a holding lease."""
    hours = sum(v for m, v in gpu_hours.by_month(alloc).items() if m in months)
    start = gpu_hours.accrued_since(alloc)
    if alloc.phase in HOLDING and start is not None and now > start:
        held = sum(gpu_hours.held_by_host(alloc).values())
        hours += sum(held * span for m, span in gpu_hours.month_spans(start, now) if m in months)
    return hours


def applies(budget: Budget, alloc: Allocation) -> bool:
    """True when the lease counts against the budget."""
    return alloc.team == budget.team and (budget.project is None or alloc.project == budget.project)


@dataclass(frozen=True)
class Burn:
    """One budget in its current period."""

    budget: Budget
    period: str
    burned: float

    @property
    def remaining(self) -> float:
        """GPU-hours left in the period (never below 0)."""
        return max(0.0, self.budget.gpu_hours - self.burned)

    @property
    def percent(self) -> float:
        """Share of the budget burned."""
        return 100.0 * self.burned / self.budget.gpu_hours


def burn(budget: Budget, leases: Iterable[Allocation], now: datetime) -> Burn:
    """The budget's burn from these leases (each counted once)."""
    months = period_months(budget.period, now)
    seen: set[int] = set()
    total = 0.0
    for alloc in leases:
        if alloc.ir in seen or not applies(budget, alloc):
            continue
        seen.add(alloc.ir)
        total += lease_burn(alloc, months, now)
    return Burn(budget, period_label(budget.period, now), total)


def ended_query(team: str, months: Sequence[str]) -> IncidentQuery:
    """Resolved leases of the team that accrued in these months."""
    return IncidentQuery.where({State.RESOLVED}, team=team, months=months)


def team_leases(ctx: LeaseContext, team: str, months: Sequence[str]) -> list[Allocation]:
    """The team's live leases and those that ended after accruing in these months (incidents only)."""
    found = list(ctx.reads().live(None, team))
    for index, record in enumerate(ctx.incidents.search(ended_query(team, months))):
        if index >= MAX_ENDED:
            log.warning("budget of %s: more than %d ended leases in the period, the rest not counted", team, MAX_ENDED)
            break
        found.append(Allocation.from_record(record))
    return found


def burns(ctx: LeaseContext, budgets: Sequence[Budget]) -> list[Burn]:
    """Each budget's burn now, reading each team's leases once."""
    now = ctx.now()
    by_team: dict[str, list[Allocation]] = {}
    out = []
    for budget in budgets:
        if budget.team not in by_team:
            months = sorted({m for b in budgets if b.team == budget.team for m in period_months(b.period, now)})
            by_team[budget.team] = team_leases(ctx, budget.team, months)
        out.append(burn(budget, by_team[budget.team], now))
    return out


def expected_hours(gpus: int, days: int) -> float:
    """What a request is expected to hold: GPUs charged x days x 24."""
    return float(gpus * days * 24)


def over_budget(expected: float, burned: Sequence[Burn]) -> str | None:
    """Why a request of `expected` GPU-hours goes to operators, or None when every budget has room."""
    reasons = [
        f"{b.budget.label()}'s GPU-hour budget for {b.period} has {b.remaining:,.0f} of "
        f"{b.budget.gpu_hours:,.0f} left ({b.burned:,.0f} used) and this request expects {expected:,.0f}"
        for b in burned
        if expected > b.remaining
    ]
    return "; ".join(reasons) or None


def gate(ctx: LeaseContext, decision: Decision, *, team: str, project: str | None, gpus: int, days: int) -> Decision:
    """The policy's decision with the budgets applied: an approval that would overspend goes to operators.

    A refusal stays a refusal and a request already going to operators gets the budget's numbers added. When the
    incidents cannot be read the decision goes to operators too: a budget is never waved through unread.
    """
    budgets = budgets_for(ctx.farm.budgets, team, project)
    if not budgets or decision.verdict is Verdict.REFUSE:
        return decision
    expected = expected_hours(gpus, days)
    try:
        reason = over_budget(expected, burns(ctx, budgets))
    except GpufarmError as exc:
        log.warning("budgets of %s could not be read: %s", team, exc)
        reason = "the GPU-hour budget could not be read"
    if reason is None:
        return decision
    note = f"{gpus} GPUs x {days} days x 24 = {expected:,.0f} GPU-hours expected: {reason}"
    if decision.verdict is Verdict.NEEDS_OPERATOR:
        return replace(decision, reason=f"{decision.reason}; {note}")
    return replace(decision, verdict=Verdict.NEEDS_OPERATOR, reason=f"{note}; an operator decides")
