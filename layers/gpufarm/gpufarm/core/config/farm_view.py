"""The farm as reports read it: a light, typed view of the already-validated farm, without its pydantic models.

Built only from what validation produced: `FarmView.of(farm)` from a FarmConfig, or `FarmView.from_dump(dump)`
from that FarmConfig's JSON dump (`farm.model_dump(mode="json")`), which `gpufarm report` keeps beside the hash of
the YAML it came from (gpufarm.adapters.farm_dump) so that a process whose farm did not change loads neither
pydantic nor the farm's models. A dump whose shape is not the one this code writes raises FarmDumpMismatch (the
caller validates the YAML again); nothing here validates YAML.

The whole dump is kept (`sections`): a section the farm file gains is carried with no change here, and a report
that reads it adds a typed accessor below, reading the section's validated values from the dump.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Protocol

from gpufarm.core.config.budget_terms import BudgetPeriod, budget_label
from gpufarm.core.config.farm_error import unknown_team
from gpufarm.core.config.pool_kind import PoolKind
from gpufarm.core.config.rate_view import RateView, amount, rate_view


class Validated(Protocol):
    """A validated farm (gpufarm.core.config.farm.FarmConfig) as far as the view reads it: its dump."""

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


class FarmDumpMismatch(ValueError):
    """A dump that is not the shape this code's FarmConfig dumps: validate the YAML again."""


@dataclass(frozen=True, slots=True)
class QuotaView:
    """A team's quota for one model in one pool (gpufarm.core.config.farm.ModelQuota)."""

    gpus: int
    hard_limit: int | None


@dataclass(frozen=True, slots=True)
class TeamView:
    """A team's quotas per pool and model, its cost center and channel (gpufarm.core.config.farm.TeamSpec)."""

    quotas: Mapping[str, Mapping[str, QuotaView]]
    cost_center: str | None = None
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool: how it hands out GPUs and the models it offers (gpufarm.core.config.farm.EnvironmentSpec)."""

    kind: PoolKind
    gpu_models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BudgetView:
    """One budget, in GPU-hours or in money (gpufarm.core.config.accounting.Budget)."""

    team: str
    project: str | None
    period: BudgetPeriod
    gpu_hours: float | None
    amount: Decimal | None = None
    alerts: tuple[int, ...] = ()

    @property
    def in_money(self) -> bool:
        """True for a budget in money (`amount`)."""
        return self.amount is not None

    @property
    def limit(self) -> float:
        """The budget in its own unit (GPU-hours, or the currency's units) as a float for the arithmetic."""
        return float(self.amount) if self.amount is not None else float(self.gpu_hours or 0.0)

    def label(self) -> str:
        """`nlp` or `nlp/llm-ko`."""
        return budget_label(self.team, self.project)


class FarmView:
    """The validated farm's pools, teams, quotas, budgets and rate card (and every section, as dumped)."""

    __slots__ = ("budgets", "environments", "rates", "sections", "teams")

    def __init__(
        self,
        sections: Mapping[str, Any],
        teams: Mapping[str, TeamView],
        budgets: tuple[BudgetView, ...],
        environments: Mapping[str, PoolView],
        rates: RateView,
    ) -> None:
        self.sections = sections
        self.teams = teams
        self.budgets = budgets
        self.environments = environments
        self.rates = rates

    def with_teams(self, teams: Mapping[str, TeamView]) -> FarmView:
        """The same farm with these teams (the report's quota changes applied: gpufarm.reporting.quota_changes)."""
        return FarmView(self.sections, MappingProxyType(dict(teams)), self.budgets, self.environments, self.rates)

    @classmethod
    def of(cls, farm: Validated) -> FarmView:
        """The view of a validated FarmConfig."""
        return cls.from_dump(farm.model_dump(mode="json"))

    @classmethod
    def from_dump(cls, dump: Any) -> FarmView:
        """The view of a FarmConfig's JSON dump; FarmDumpMismatch when it is not that shape."""
        try:
            sections = _mapping(dump)
            teams = {_text(name): _team(_mapping(spec)) for name, spec in _items(sections["teams"])}
            budgets = tuple(_budget(_mapping(item)) for item in _list(sections["budgets"]))
            pools = {_text(name): _pool(_mapping(spec)) for name, spec in _items(sections["environments"])}
            rates = rate_view(_mapping(sections["rates"]))
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            raise FarmDumpMismatch(f"not a farm dump: {type(exc).__name__}") from None
        return cls(MappingProxyType(sections), MappingProxyType(teams), budgets, MappingProxyType(pools), rates)

    def team(self, name: str) -> TeamView:
        """The team called `name`; ValidationFailed naming the known teams otherwise (as FarmConfig.team)."""
        spec = self.teams.get(name)
        if spec is None:
            raise unknown_team(name, list(self.teams))
        return spec


def _team(value: Mapping[str, Any]) -> TeamView:
    return TeamView(_quotas(value["quotas"]), _optional_text(value["cost_center"]), _optional_text(value["channel"]))


def _pool(value: Mapping[str, Any]) -> PoolView:
    return PoolView(PoolKind(_text(value["kind"])), tuple(_text(m) for m in _list(value["gpu_models"])))


def _quotas(value: Any) -> dict[str, dict[str, QuotaView]]:
    return {
        _text(env): {_text(model): _quota(_mapping(quota)) for model, quota in _items(models)}
        for env, models in _items(value)
    }


def _quota(value: Mapping[str, Any]) -> QuotaView:
    hard = value["hard_limit"]
    return QuotaView(_whole(value["gpus"]), None if hard is None else _whole(hard))


def _budget(value: Mapping[str, Any]) -> BudgetView:
    hours, money = value["gpu_hours"], value["amount"]
    if (hours is None) == (money is None):
        raise ValueError("gpu_hours or amount")
    alerts = tuple(_whole(a) for a in _list(value["alerts"]))
    return BudgetView(
        _text(value["team"]),
        _optional_text(value["project"]),
        BudgetPeriod(value["period"]),
        None if hours is None else _hours(hours),
        None if money is None else _positive(amount(money)),
        alerts,
    )


def _hours(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError("gpu_hours")
    return float(value)


def _positive(value: Decimal) -> Decimal:
    if value <= 0:
        raise ValueError("amount")
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError("a mapping")
    return value


def _items(value: Any) -> list[tuple[Any, Any]]:
    return list(_mapping(value).items())


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError("a list")
    return list(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a string")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("a count")
    return value
