"""The farm YAML's `ledger:` and `budgets:` sections: how GPU-hours accrue, and the budgets.

`ledger:` says how the sync measures use (one metrics query per sync, over the last `window_minutes`) and how
often it writes a lease's accrued GPU-hours into its incident (`accrue_hours`, at most `max_accruals` leases a
sync). `budgets:` lists budgets per team, optionally per project, per calendar month or quarter, each in GPU-hours
(`gpu_hours`) or in money (`amount`, in the rate card's currency): exactly one of the two. They never decay: a
period's burn is what the team's leases held in it, or what that cost (gpufarm.core.accounting.budgets). Each
budget's `alerts` are the percentages told once per period (gpufarm.core.accounting.budget_alerts).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufarm.core.config.budget_terms import BudgetPeriod as BudgetPeriod  # noqa: PLC0414 - its home before
from gpufarm.core.config.budget_terms import budget_label
from gpufarm.core.kernel.model import Name

MAX_BUDGETS = 500
MAX_BUDGET_HOURS = 100_000_000
MAX_BUDGET_AMOUNT = Decimal(10) ** 12
MAX_ALERTS = 10
DEFAULT_ALERTS = (50, 80, 100)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LedgerSettings(_Strict):
    """How used GPUs are measured and GPU-hours accrue into the incidents (gpufarm.core.accounting.gpu_hours)."""

    # A lease's accrued GPU-hours are written at most once per this many hours (and always when it ends).
    accrue_hours: float = Field(default=1.0, ge=0.25, le=24 * 7)
    # The one metrics query of a sync averages the agents' busy devices over this window.
    window_minutes: int = Field(default=60, ge=5, le=24 * 60)
    # At most this many leases accrue in one sync (the ones waiting longest first); the rest wait for the next.
    max_accruals: int = Field(default=500, ge=1, le=10_000)


class Budget(_Strict):
    """What a team (or one of its projects) may hold in each calendar month or quarter: GPU-hours or money."""

    team: Name
    project: str | None = Field(default=None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    period: BudgetPeriod = BudgetPeriod.MONTH
    # Exactly one: GPU-hours, or an amount in the rate card's currency (gpufarm.core.config.rates).
    gpu_hours: float | None = Field(default=None, gt=0, le=MAX_BUDGET_HOURS, allow_inf_nan=False)
    amount: Decimal | None = Field(default=None, gt=0, le=MAX_BUDGET_AMOUNT, allow_inf_nan=False, decimal_places=2)
    # Percentages of the budget each told once per period to the team and the operators, ascending.
    alerts: tuple[Annotated[int, Field(ge=1, le=1000)], ...] = Field(default=DEFAULT_ALERTS, max_length=MAX_ALERTS)

    @field_validator("alerts")
    @classmethod
    def _alerts(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value):
            raise ValueError("an alert percentage is given twice")
        return tuple(sorted(value))

    @model_validator(mode="after")
    def _one_limit(self) -> Budget:
        if (self.gpu_hours is None) == (self.amount is None):
            raise ValueError("give exactly one of gpu_hours or amount (money, in the rates' currency)")
        return self

    @property
    def in_money(self) -> bool:
        """True for a budget in money (`amount`)."""
        return self.amount is not None

    @property
    def limit(self) -> float:
        """The budget in its own unit (GPU-hours, or the currency's units) as a float for the arithmetic."""
        return float(self.amount) if self.amount is not None else float(self.gpu_hours or 0.0)

    @property
    def key(self) -> tuple[str, str | None, BudgetPeriod]:
        """What makes a budget unique."""
        return (self.team, self.project, self.period)

    def label(self) -> str:
        """`nlp` or `nlp/llm-ko`."""
        return budget_label(self.team, self.project)


def budget_problems(budgets: Sequence[Budget], teams: Collection[str], *, priced: bool = True) -> list[str]:
    """What is wrong with the budgets: a team the farm does not define, two budgets for one period, a budget in
    money in a farm whose rate card prices no pool (`priced` False)."""
    problems: list[str] = []
    seen: set[tuple[str, str | None, BudgetPeriod]] = set()
    for index, budget in enumerate(budgets):
        if budget.team not in teams:
            problems.append(f"budgets[{index}].team: '{budget.team}' is not a team")
        if budget.in_money and not priced:
            problems.append(f"budgets[{index}].amount: a budget in money needs a rates: section that prices a pool")
        if budget.key in seen:
            problems.append(f"budgets[{index}]: {budget.label()} has two {budget.period.value} budgets")
        seen.add(budget.key)
    return problems


def budgets_for(budgets: Sequence[Budget], team: str, project: str | None) -> list[Budget]:
    """The budgets a request of this team and project counts against (the team's own and its project's)."""
    return [b for b in budgets if b.team == team and (b.project is None or b.project == project)]
