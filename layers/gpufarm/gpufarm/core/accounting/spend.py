"""What a budget in money burned: the cost of its leases' GPU-hours in the period, priced by the rate card.

Each lease's GPU-hours inside the period (gpufarm.core.money.lease_cost.lease_hours: accrued per month, plus the
un-accrued stretch of a lease holding now) times its GPU-hour price (its pool's rate for its model, MIG shares
applied). A lease whose pool or model nothing prices adds its pool to `unpriced`: the burn is then **incomplete**
and never shown or gated as under budget (gpufarm.core.accounting.budgets). Pure: the leases are read elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from gpufarm.core.accounting.burn import Burn, applies, lease_burn, period_bounds, period_label, period_months
from gpufarm.core.config.budget_terms import BudgetTerms
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.money.card import RateCard
from gpufarm.core.money.lease_cost import lease_cost, lease_hours


def spend(card: RateCard, budget: BudgetTerms, leases: Iterable[LeaseFacts], now: datetime) -> Burn:
    """The budget's burn in GPU-hours and, priced, in money (each lease counted once)."""
    start, end = period_bounds(budget.period, now)
    months = period_months(budget.period, now)
    seen: set[int] = set()
    hours = 0.0
    spent = Decimal(0)
    unpriced: set[str] = set()
    for lease in leases:
        if lease.ir in seen or not applies(budget, lease):
            continue
        seen.add(lease.ir)
        held = lease_burn(lease, months, now)
        hours += held
        if held <= 0:
            continue
        cost = lease_cost(card, lease, lease_hours(lease, start, end, now))
        if cost.amount is None:
            unpriced.add(lease.environment or "no pool")
        else:
            spent += cost.amount
    return Burn(budget, period_label(budget.period, now), hours, spent, tuple(sorted(unpriced)), card.currency)
