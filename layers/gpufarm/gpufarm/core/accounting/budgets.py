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
from collections.abc import Sequence
from dataclasses import replace

from gpufarm.core.accounting.burn import Burn as Burn  # noqa: PLC0414
from gpufarm.core.accounting.burn import applies as applies  # noqa: PLC0414
from gpufarm.core.accounting.burn import burn as burn  # noqa: PLC0414
from gpufarm.core.accounting.burn import lease_burn as lease_burn  # noqa: PLC0414
from gpufarm.core.accounting.burn import period_label as period_label  # noqa: PLC0414
from gpufarm.core.accounting.burn import period_months as period_months  # noqa: PLC0414
from gpufarm.core.config.accounting import Budget, budgets_for
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import Decision, Verdict
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import ended_query

log = logging.getLogger(__name__)

# Ended leases one budget reads at most (a team ending more leases in a quarter is read up to this many).
MAX_ENDED = 5_000


def team_leases(ctx: LeaseContext, team: str, months: Sequence[str]) -> list[Allocation]:
    """The team's live leases and those that ended after accruing in these months (incidents only)."""
    found = list(ctx.reads().live(None, team))
    for index, record in enumerate(ctx.incidents.search(ended_query(months, team))):
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
