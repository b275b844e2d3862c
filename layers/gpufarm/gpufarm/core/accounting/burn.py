"""The arithmetic of GPU-hour budgets: a budget's calendar period, and what leases burned in it.

Pure functions of the leases' recorded facts (gpufarm.core.kernel.accrued), shared by the budget gate
(gpufarm.core.accounting.budgets, which reads the leases) and the reports, on an Allocation or the light record
reports decode. A period's burn is the GPU-hours the team's (or project's) leases accrued in its months, plus, for a
lease holding now, the hours since its last accrual. A budget in money burns what those hours cost
(gpufarm.core.accounting.spend); a lease on a pool with no rate leaves it **incomplete**, never under budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpufarm.core.config.budget_terms import BudgetPeriod, BudgetTerms
from gpufarm.core.kernel import accrued
from gpufarm.core.kernel.accrued import HeldLease
from gpufarm.core.kernel.lifecycle import HOLDING


def period_months(period: BudgetPeriod, now: datetime) -> tuple[str, ...]:
    """The `YYYY-MM` months of the calendar period holding `now` (UTC)."""
    moment = now.astimezone(UTC)
    if period is BudgetPeriod.MONTH:
        return (f"{moment.year:04d}-{moment.month:02d}",)
    first = 3 * ((moment.month - 1) // 3) + 1
    return tuple(f"{moment.year:04d}-{m:02d}" for m in range(first, first + 3))


def period_bounds(period: BudgetPeriod, now: datetime) -> tuple[datetime, datetime]:
    """The start and end (exclusive) of the calendar period holding `now` (UTC)."""
    months = period_months(period, now)
    start = datetime(int(months[0][:4]), int(months[0][5:]), 1, tzinfo=UTC)
    last = datetime(int(months[-1][:4]), int(months[-1][5:]), 1, tzinfo=UTC)
    return start, (last + timedelta(days=32)).replace(day=1)


def period_label(period: BudgetPeriod, now: datetime) -> str:
    """`2026-12` or `2026-Q4`."""
    moment = now.astimezone(UTC)
    if period is BudgetPeriod.MONTH:
        return f"{moment.year:04d}-{moment.month:02d}"
    return f"{moment.year:04d}-Q{(moment.month - 1) // 3 + 1}"


def lease_burn(alloc: HeldLease, months: Sequence[str], now: datetime) -> float:
    """GPU-hours the lease held in these months: accrued, plus the un-accrued stretch of a holding lease."""
    hours = sum(v for m, v in accrued.by_month(alloc).items() if m in months)
    start = accrued.accrued_since(alloc)
    if alloc.phase in HOLDING and start is not None and now > start:
        held = sum(accrued.held_by_host(alloc).values())
        hours += sum(held * span for m, span in accrued.month_spans(start, now) if m in months)
    return hours


def applies(budget: BudgetTerms, alloc: HeldLease) -> bool:
    """True when the lease counts against the budget."""
    return alloc.team == budget.team and (budget.project is None or alloc.project == budget.project)


@dataclass(frozen=True)
class Burn:
    """One budget in its current period: the GPU-hours its leases held and, for a budget in money, what they cost."""

    budget: BudgetTerms
    period: str
    burned: float
    # A budget in money: the priced leases' cost (unrounded), and the pools of leases nothing prices.
    spent: Decimal | None = None
    unpriced: tuple[str, ...] = ()
    currency: str = ""

    @property
    def incomplete(self) -> bool:
        """True for a budget in money some of whose leases are unpriced: never shown as under budget."""
        return self.budget.in_money and (bool(self.unpriced) or self.spent is None)

    @property
    def used(self) -> float:
        """What was burned in the budget's unit (GPU-hours, or money of the priced leases)."""
        if self.budget.in_money:
            return float(self.spent or 0)
        return self.burned

    @property
    def remaining(self) -> float:
        """What is left in the period, in the budget's unit (never below 0)."""
        return max(0.0, self.budget.limit - self.used)

    @property
    def percent(self) -> float:
        """Share of the budget burned (of the priced part, for an incomplete budget in money)."""
        return 100.0 * self.used / self.budget.limit


def burn(budget: BudgetTerms, leases: Iterable[HeldLease], now: datetime) -> Burn:
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
