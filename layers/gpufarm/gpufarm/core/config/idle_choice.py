"""The farm file's bounds on the idle settings a researcher chooses at request time (`idle=30m grace=2h`).

    idle_choice:
      window_minutes: {min: 30, max: 240}   # how long idle before the warning
      grace_minutes: {min: 15, max: 480}    # from the warning to the reclaim
      environments:
        onprem-hpc: {window_minutes: {min: 60, max: 1440}}

A request that names neither keeps its pool's and team's idle policy (`idle:`). A chosen window is honoured by
gpufarm's own timer over the pool's monitors (gpufarm.core.idle.lease_window): a monitor fires after its kind's
window and gpufarm holds the warning back until the lease has been idle for its own, so a chosen window is at least
the shortest window of the pool's monitors (checked at request time, with the number in the refusal).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufarm.core.kernel.model import Name

MAX_MINUTES = 7 * 24 * 60


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Bounds(_Strict):
    """The least and most minutes a researcher may choose."""

    min: int = Field(ge=1, le=MAX_MINUTES)
    max: int = Field(ge=1, le=MAX_MINUTES)

    @model_validator(mode="after")
    def _ordered(self) -> Bounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class ChoiceOverride(_Strict):
    """One pool's bounds; keys left out inherit."""

    window_minutes: Bounds | None = None
    grace_minutes: Bounds | None = None


class PoolChoice(_Strict):
    """The bounds in effect for one pool."""

    window_minutes: Bounds
    grace_minutes: Bounds


class IdleChoiceSettings(_Strict):
    """The `idle_choice:` section."""

    window_minutes: Bounds = Bounds(min=30, max=240)
    grace_minutes: Bounds = Bounds(min=15, max=480)
    environments: dict[Name, ChoiceOverride] = Field(default_factory=dict)

    def pool(self, environment: str | None) -> PoolChoice:
        """The bounds of `environment` (the farm-wide ones where it overrides nothing)."""
        override = self.environments.get(environment or "") or ChoiceOverride()
        return PoolChoice(
            window_minutes=override.window_minutes or self.window_minutes,
            grace_minutes=override.grace_minutes or self.grace_minutes,
        )

    def problems(self, environments: Iterable[str]) -> list[str]:
        """A pool named here that the farm lacks."""
        known = set(environments)
        return [f"idle_choice.environments: '{e}' is not an environment" for e in self.environments if e not in known]
