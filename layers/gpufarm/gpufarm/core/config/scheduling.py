"""The farm file's scheduling: how each pool orders its waiting requests, and how long an unapprovable request waits.

    scheduling:
      queue: fifo                  # fifo | fair-share, for every pool unless it says otherwise
      usage_window_days: 7         # fair share weighs each team's GPU-hours held over this window
      unapprovable_withdraw_hours: 24
      environments:
        onprem-hpc: {queue: fair-share, usage_window_days: 14}

`fifo` serves a pool's waiting requests first come, first served per model; `fair-share` serves first the team
that used least of its share of the pool over the window (gpufarm.core.leases.ordering), ties by age. A request
beyond its team's quota that no operator could approve without passing the team's hard limit is withdrawn, with
its reason, `unapprovable_withdraw_hours` after it was asked (gpufarm.core.leases.unapprovable).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.kernel.model import Name

MAX_WINDOW_DAYS = 90
MAX_WITHDRAW_HOURS = 30 * 24


class QueuePolicy(StrEnum):
    """How a pool orders its waiting requests."""

    FIFO = "fifo"
    FAIR_SHARE = "fair-share"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PoolScheduling(_Strict):
    """The scheduling in effect for one pool."""

    queue: QueuePolicy
    usage_window_days: int
    unapprovable_withdraw_hours: int


class SchedulingOverride(_Strict):
    """One pool's change to the scheduling; keys left out inherit."""

    queue: QueuePolicy | None = None
    usage_window_days: int | None = Field(default=None, ge=1, le=MAX_WINDOW_DAYS)
    unapprovable_withdraw_hours: int | None = Field(default=None, ge=1, le=MAX_WITHDRAW_HOURS)


class SchedulingSettings(_Strict):
    """The `scheduling:` section."""

    queue: QueuePolicy = QueuePolicy.FIFO
    usage_window_days: int = Field(default=7, ge=1, le=MAX_WINDOW_DAYS)
    unapprovable_withdraw_hours: int = Field(default=24, ge=1, le=MAX_WITHDRAW_HOURS)
    environments: dict[Name, SchedulingOverride] = Field(default_factory=dict)

    def pool(self, environment: str | None) -> PoolScheduling:
        """The scheduling of `environment` (the farm-wide values where it overrides nothing)."""
        values = self.model_dump(exclude={"environments"})
        override = self.environments.get(environment or "")
        if override is not None:
            values |= override.model_dump(exclude_none=True)
        return PoolScheduling.model_validate(values)

    def problems(self, environments: Iterable[str]) -> list[str]:
        """A pool named here that the farm lacks."""
        known = set(environments)
        return [f"scheduling.environments: '{e}' is not an environment" for e in self.environments if e not in known]
