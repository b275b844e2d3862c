"""Budgets in GPU-hours or money: per team (optionally per project), per calendar month or quarter, never decaying.

A period's **burn** is the GPU-hours the team's (or project's) leases held in it: what the incidents accrued in
that period's months (`gpu_hours_by_month`, gpufarm.core.accounting.gpu_hours) plus, for a lease holding now, the hours
since its last accrual. It is read from incidents only: the team's live leases and the leases that ended after
accruing in the period (one search narrowed to the team and the period's months), so burn survives metrics
retention. A budget in money burns what those GPU-hours cost at the rate card (gpufarm.core.accounting.spend). A
request whose expected GPU-hours (GPUs it is charged x days x 24), or their cost, exceed what is left goes to the
operators with the numbers, whatever its quota says; so does one against a budget in money that is incomplete (a
lease or the request on a pool with no rate: never waved through as under budget). A request the quota refuses
stays refused.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal

from gpufarm.core.accounting.budget_text import money
from gpufarm.core.accounting.burn import Burn as Burn  # noqa: PLC0414
from gpufarm.core.accounting.burn import applies as applies  # noqa: PLC0414
from gpufarm.core.accounting.burn import burn as burn  # noqa: PLC0414
from gpufarm.core.accounting.burn import lease_burn as lease_burn  # noqa: PLC0414
from gpufarm.core.accounting.burn import period_label as period_label  # noqa: PLC0414
from gpufarm.core.accounting.burn import period_months as period_months  # noqa: PLC0414
from gpufarm.core.accounting.spend import spend
from gpufarm.core.config.accounting import Budget, budgets_for
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import Decision, Verdict
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import ended_query
from gpufarm.core.money.card import RateCard
from gpufarm.core.money.lease_rate import lease_rate

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
    return [burned for burned, _ in burns_with_leases(ctx, budgets)]


def burns_with_leases(ctx: LeaseContext, budgets: Sequence[Budget]) -> list[tuple[Burn, list[Allocation]]]:
    """Each budget's burn now and the team's leases it was read from (read once per team)."""
    now = ctx.now()
    by_team: dict[str, list[Allocation]] = {}
    facts: dict[str, list[LeaseFacts]] = {}
    card: RateCard | None = None
    out = []
    for budget in budgets:
        if budget.team not in by_team:
            months = sorted({m for b in budgets if b.team == budget.team for m in period_months(b.period, now)})
            by_team[budget.team] = team_leases(ctx, budget.team, months)
        leases = by_team[budget.team]
        if budget.in_money:
            card = card or ctx.rate_card()
            light = facts.setdefault(budget.team, [LeaseFacts.of(a) for a in leases])
            out.append((spend(card, budget, light, now), leases))
        else:
            out.append((burn(budget, leases, now), leases))
    return out


def expected_hours(gpus: int, days: int) -> float:
    """What a request is expected to hold: GPUs charged x days x 24."""
    return float(gpus * days * 24)


def over_budget(expected: float, burned: Sequence[Burn], expected_cost: Decimal | None = None) -> str | None:
    """Why a request of `expected` GPU-hours (costing `expected_cost`; None: unpriced) goes to operators, or None
    when every budget has room."""
    reasons: list[str] = []
    for b in burned:
        if b.budget.in_money:
            reason = _over_money(b, expected_cost)
            if reason:
                reasons.append(reason)
        elif expected > b.remaining:
            reasons.append(
                f"{b.budget.label()}'s GPU-hour budget for {b.period} has {b.remaining:,.0f} of "
                f"{b.budget.limit:,.0f} left ({b.burned:,.0f} used) and this request expects {expected:,.0f}"
            )
    return "; ".join(reasons) or None


def _over_money(b: Burn, expected_cost: Decimal | None) -> str | None:
    if b.incomplete:
        return (
            f"{b.budget.label()}'s budget for {b.period} is incomplete: no rate prices "
            f"{', '.join(b.unpriced) or 'some of its leases'}"
        )
    if expected_cost is None:
        return f"{b.budget.label()}'s budget for {b.period} is in money and no rate prices this request"
    left = Decimal(repr(b.remaining))
    if expected_cost > left:
        return (
            f"{b.budget.label()}'s budget for {b.period} has {money(left, b.currency)} of "
            f"{money(b.budget.amount, b.currency)} left ({money(b.spent or Decimal(0), b.currency)} spent) and this "
            f"request expects {money(expected_cost, b.currency)}"
        )
    return None


def gate(
    ctx: LeaseContext,
    decision: Decision,
    *,
    team: str,
    project: str | None,
    gpus: int,
    days: int,
    environment: str | None = None,
    model: str | None = None,
) -> Decision:
    """The policy's decision with the budgets applied: an approval that would overspend goes to operators.

    A refusal stays a refusal and a request already going to operators gets the budget's numbers added. When the
    incidents cannot be read the decision goes to operators too: a budget is never waved through unread; so does a
    request against a budget in money that is incomplete, or that no rate prices.
    """
    budgets = budgets_for(ctx.farm.budgets, team, project)
    if not budgets or decision.verdict is Verdict.REFUSE:
        return decision
    expected = expected_hours(gpus, days)
    cost: Decimal | None = None
    if any(b.in_money for b in budgets):
        rate = lease_rate(ctx.rate_card(), environment, model)
        cost = None if rate is None else rate.cost(expected)
    try:
        reason = over_budget(expected, burns(ctx, budgets), cost)
    except GpufarmError as exc:
        log.warning("budgets of %s could not be read: %s", team, exc)
        reason = "the budget could not be read"
    if reason is None:
        return decision
    note = f"{gpus} GPUs x {days} days x 24 = {expected:,.0f} GPU-hours expected: {reason}"
    if decision.verdict is Verdict.NEEDS_OPERATOR:
        return replace(decision, reason=f"{decision.reason}; {note}")
    return replace(decision, verdict=Verdict.NEEDS_OPERATOR, reason=f"{note}; an operator decides")
