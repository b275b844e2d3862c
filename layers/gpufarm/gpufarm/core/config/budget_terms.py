"""What a budget says, without its model: the period it covers and the terms burn arithmetic reads.

The farm file's `budgets:` are validated as gpufarm.core.config.accounting.Budget; the arithmetic
(gpufarm.core.accounting.burn) and the reports read any record with these terms, so a report that reads the
already-validated farm (gpufarm.core.config.farm_view) never loads the models.
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Protocol


class BudgetPeriod(StrEnum):
    """The calendar period a budget covers (UTC)."""

    MONTH = "month"
    QUARTER = "quarter"


class BudgetTerms(Protocol):
    """A budget's terms: whose, which period, and its limit: GPU-hours or an amount of money (exactly one)."""

    @property
    def team(self) -> str: ...
    @property
    def project(self) -> str | None: ...
    @property
    def period(self) -> BudgetPeriod: ...
    @property
    def gpu_hours(self) -> float | None: ...
    @property
    def amount(self) -> Decimal | None: ...
    @property
    def alerts(self) -> tuple[int, ...]: ...
    @property
    def in_money(self) -> bool: ...
    @property
    def limit(self) -> float: ...
    def label(self) -> str: ...


def budget_label(team: str, project: str | None) -> str:
    """`nlp` or `nlp/llm-ko`."""
    return f"{team}/{project}" if project else team
