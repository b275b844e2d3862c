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
from types import MappingProxyType
from typing import Any, Protocol

from gpufarm.core.config.budget_terms import BudgetPeriod, budget_label
from gpufarm.core.config.farm_error import unknown_team


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
    """A team's quotas per pool and model (gpufarm.core.config.farm.TeamSpec)."""

    quotas: Mapping[str, Mapping[str, QuotaView]]


@dataclass(frozen=True, slots=True)
class BudgetView:
    """One GPU-hour budget (gpufarm.core.config.accounting.Budget)."""

    team: str
    project: str | None
    period: BudgetPeriod
    gpu_hours: float

    def label(self) -> str:
        """`nlp` or `nlp/llm-ko`."""
        return budget_label(self.team, self.project)


class FarmView:
    """The validated farm's teams, quotas and budgets (and every section, as dumped)."""

    __slots__ = ("budgets", "sections", "teams")

    def __init__(
        self, sections: Mapping[str, Any], teams: Mapping[str, TeamView], budgets: tuple[BudgetView, ...]
    ) -> None:
        self.sections = sections
        self.teams = teams
        self.budgets = budgets

    @classmethod
    def of(cls, farm: Validated) -> FarmView:
        """The view of a validated FarmConfig."""
        return cls.from_dump(farm.model_dump(mode="json"))

    @classmethod
    def from_dump(cls, dump: Any) -> FarmView:
        """The view of a FarmConfig's JSON dump; FarmDumpMismatch when it is not that shape."""
        try:
            sections = _mapping(dump)
            teams = {
                _text(name): TeamView(_quotas(_mapping(spec)["quotas"])) for name, spec in _items(sections["teams"])
            }
            budgets = tuple(_budget(_mapping(item)) for item in _list(sections["budgets"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise FarmDumpMismatch(f"not a farm dump: {type(exc).__name__}") from None
        return cls(MappingProxyType(sections), MappingProxyType(teams), budgets)

    def team(self, name: str) -> TeamView:
        """The team called `name`; ValidationFailed naming the known teams otherwise (as FarmConfig.team)."""
        spec = self.teams.get(name)
        if spec is None:
            raise unknown_team(name, list(self.teams))
        return spec


def _quotas(value: Any) -> dict[str, dict[str, QuotaView]]:
    return {
        _text(env): {_text(model): _quota(_mapping(quota)) for model, quota in _items(models)}
        for env, models in _items(value)
    }


def _quota(value: Mapping[str, Any]) -> QuotaView:
    hard = value["hard_limit"]
    return QuotaView(_whole(value["gpus"]), None if hard is None else _whole(hard))


def _budget(value: Mapping[str, Any]) -> BudgetView:
    project = value["project"]
    hours = value["gpu_hours"]
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not math.isfinite(hours) or hours <= 0:
        raise ValueError("gpu_hours")
    return BudgetView(
        _text(value["team"]), None if project is None else _text(project), BudgetPeriod(value["period"]), float(hours)
    )


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


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("a count")
    return value
