"""The farm file's `lending:` section: whether a request beyond its team's quota may borrow idle capacity of a pool,
and how a borrowing lease is preempted when the lending team needs its quota back.

    lending:
      borrow: never               # never | when-idle | priority, for every pool unless overridden
      notice_minutes: 30          # a preempted borrower's notice before it is reclaimed
      protection_hours: 1         # a lease this young is never preempted
      classes:                    # priority classes: who may borrow where `borrow: priority`, and who goes last
        research: {teams: [nlp], rank: 10}
      environments:
        onprem-hpc: {borrow: priority, classes: [research], notice_minutes: 60}

What borrowing and preemption do with it is gpufarm.core.leases.lending and gpufarm.core.leases.preemption.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.kernel.model import Name

MAX_NOTICE_MINUTES = 7 * 24 * 60
MAX_PROTECTION_HOURS = 30 * 24
MAX_CLASSES = 50
MAX_RANK = 1000


class Borrow(StrEnum):
    """Whether a pool lends its teams' idle quota to requests beyond quota."""

    NEVER = "never"
    # Any team may borrow what the pool's other teams leave unused, while the pool has that many GPUs free.
    WHEN_IDLE = "when-idle"
    # As when-idle, but only teams of the pool's priority classes may borrow.
    PRIORITY = "priority"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PriorityClass(_Strict):
    """Teams that may borrow where a pool names the class; a higher rank is preempted later."""

    teams: tuple[Name, ...] = Field(min_length=1, max_length=500)
    rank: int = Field(default=0, ge=0, le=MAX_RANK)


class LendingPolicy(_Strict):
    """The lending policy in effect for one pool."""

    borrow: Borrow
    notice_minutes: int
    protection_hours: float
    classes: tuple[str, ...]


class LendingOverride(_Strict):
    """A per-pool change to the lending policy; keys left out inherit."""

    borrow: Borrow | None = None
    notice_minutes: int | None = Field(default=None, ge=1, le=MAX_NOTICE_MINUTES)
    protection_hours: float | None = Field(default=None, ge=0, le=MAX_PROTECTION_HOURS)
    classes: tuple[Name, ...] | None = Field(default=None, max_length=MAX_CLASSES)


class LendingSettings(_Strict):
    """Borrowing idle quota and preempting borrowers on notice, per pool."""

    borrow: Borrow = Borrow.NEVER
    notice_minutes: int = Field(default=30, ge=1, le=MAX_NOTICE_MINUTES)
    protection_hours: float = Field(default=1.0, ge=0, le=MAX_PROTECTION_HOURS)
    classes: dict[Name, PriorityClass] = Field(default_factory=dict, max_length=MAX_CLASSES)
    environments: dict[Name, LendingOverride] = Field(default_factory=dict)

    def policy(self, environment: str | None) -> LendingPolicy:
        """The policy in effect for a pool (its override's keys win)."""
        values = self.model_dump(exclude={"environments", "classes"})
        values["classes"] = ()
        override = self.environments.get(environment or "")
        if override is not None:
            values |= override.model_dump(exclude_none=True)
        return LendingPolicy.model_validate(values)

    def may_borrow(self, environment: str | None, team: str | None) -> bool:
        """Whether the pool lends to `team` at all."""
        rules = self.policy(environment)
        if rules.borrow is Borrow.NEVER:
            return False
        if rules.borrow is Borrow.WHEN_IDLE:
            return True
        return any(team in self.classes[name].teams for name in rules.classes if name in self.classes)

    def rank(self, team: str | None) -> int:
        """The team's highest class rank (0 outside every class): lower ranks are preempted first."""
        return max((c.rank for c in self.classes.values() if team in c.teams), default=0)

    def problems(self, environments: Iterable[str], teams: Iterable[str]) -> list[str]:
        """What this section names that the farm lacks: pools, teams and classes."""
        pools, known = set(environments), set(teams)
        found = [f"lending.environments: '{e}' is not an environment" for e in self.environments if e not in pools]
        for name, spec in self.classes.items():
            found += [f"lending.classes.{name}.teams: '{t}' is not a team" for t in spec.teams if t not in known]
        for env, override in self.environments.items():
            found += [
                f"lending.environments.{env}.classes: '{c}' is not a class of lending.classes"
                for c in override.classes or ()
                if c not in self.classes
            ]
            if override.borrow is Borrow.PRIORITY and not (override.classes or ()):
                found.append(f"lending.environments.{env}: borrow: priority names the classes that may borrow")
        return found
