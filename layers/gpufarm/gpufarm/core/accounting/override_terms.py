"""A quota change's terms, pure: what an override incident holds and how it changes the farm's quotas.

Shared by the decisions (gpufarm.core.accounting.overrides, which reads and ends overrides in the pool's queue) and
the report (gpufarm.reporting.quota_changes, which reads leases without the lifecycle's models): both hand in what
they decoded, an `Allocation` or a report's `LeaseFacts`, which carry the same fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from gpufarm.core.kernel.field_values import isoformat
from gpufarm.core.kernel.lifecycle import HOLDING, State
from gpufarm.core.kernel.pool_record import PoolRecord

if TYPE_CHECKING:
    from gpufarm.core.config.farm import FarmConfig


class OverrideFacts(PoolRecord, Protocol):
    """The fields of an incident an override is read from."""

    @property
    def approved_by(self) -> str | None: ...
    @property
    def quota_delta(self) -> int | None: ...
    @property
    def quota_until(self) -> datetime | None: ...
    @property
    def is_quota_override(self) -> bool: ...


@dataclass(frozen=True)
class Override:
    """One quota change as the quota check applies it."""

    ir: int
    team: str
    environment: str
    gpu_model: str
    delta: int
    until: datetime
    approved_by: str | None

    @classmethod
    def of(cls, alloc: OverrideFacts) -> Override | None:
        """The override an incident holds, or None when it is not a complete one."""
        if not alloc.is_quota_override or alloc.quota_delta is None or alloc.quota_until is None:
            return None
        if not (alloc.team and alloc.environment and alloc.gpu_model):
            return None
        model = alloc.gpu_model.upper()
        delta, until = alloc.quota_delta, alloc.quota_until
        return cls(alloc.ir, alloc.team, alloc.environment, model, delta, until, alloc.approved_by)

    def label(self) -> str:
        """`IR-7: nlp +16 H100 in hpc until 2027-01-31T00:00:00Z`."""
        change = f"{self.team} {self.delta:+d} {self.gpu_model} in {self.environment}"
        return f"IR-{self.ir}: {change} until {isoformat(self.until)}"


def in_effect(overrides: Iterable[OverrideFacts], now: datetime) -> list[Override]:
    """The approved overrides not yet at their end."""
    found = [Override.of(a) for a in overrides if a.phase in HOLDING and a.state is not State.RESOLVED]
    return [o for o in found if o is not None and o.until > now]


def changed_quota(override: Override, quota: tuple[int, int | None]) -> tuple[int, int | None]:
    """A quota's (gpus, hard_limit) with the override's change added (never below zero; no quota yet: (0, 0))."""
    gpus = max(0, quota[0] + override.delta)
    hard = None if quota[1] is None else max(gpus, quota[1] + override.delta)
    return gpus, hard


def apply(farm: FarmConfig, overrides: Sequence[Override]) -> FarmConfig:
    """The farm with each override's change added to its team's quota and hard limit (never below zero)."""
    if not overrides:
        return farm
    from gpufarm.core.config.farm import ModelQuota, TeamSpec

    teams = dict(farm.teams)
    for o in overrides:
        team = teams.get(o.team)
        if team is None:
            continue
        pools = {env: dict(models) for env, models in team.quotas.items()}
        base = pools.get(o.environment, {}).get(o.gpu_model)
        gpus, hard = changed_quota(o, (0, 0) if base is None else (base.gpus, base.hard_limit))
        pools.setdefault(o.environment, {})[o.gpu_model] = ModelQuota.model_construct(gpus=gpus, hard_limit=hard)
        teams[o.team] = TeamSpec.model_construct(**{**dict(team), "quotas": pools})
    return farm.model_copy(update={"teams": teams})
