"""The farm file's reservations: how far ahead a pool may be booked, the longest booking, the no-show window.

    reservations:
      horizon_days: 90          # a window must end within this many days from now
      max_days: 14              # the longest window one reservation may hold
      no_show_minutes: 30       # unused this long after its start, a reservation is released
      environments:             # per pool, any of the three
        onprem-hpc: {horizon_days: 30}

Read by the calendar (gpufarm.core.calendar); documented in docs/configure.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.kernel.model import MAX_DURATION_DAYS, Name

MAX_HORIZON_DAYS = 730
MAX_NO_SHOW_MINUTES = 24 * 60


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class ReservationPolicy:
    """One pool's reservation policy, overrides applied."""

    horizon_days: int
    max_days: int
    no_show_minutes: int


class ReservationOverride(_Strict):
    """A pool's own values; unset keys keep the farm's."""

    horizon_days: int | None = Field(default=None, ge=1, le=MAX_HORIZON_DAYS)
    max_days: int | None = Field(default=None, ge=1, le=MAX_DURATION_DAYS)
    no_show_minutes: int | None = Field(default=None, ge=1, le=MAX_NO_SHOW_MINUTES)


class ReservationSettings(_Strict):
    """`reservations:` in the farm file."""

    horizon_days: int = Field(default=90, ge=1, le=MAX_HORIZON_DAYS)
    max_days: int = Field(default=14, ge=1, le=MAX_DURATION_DAYS)
    no_show_minutes: int = Field(default=30, ge=1, le=MAX_NO_SHOW_MINUTES)
    environments: dict[Name, ReservationOverride] = Field(default_factory=dict)

    def policy(self, environment: str | None) -> ReservationPolicy:
        """The policy for one pool."""
        own = self.environments.get(environment or "") or ReservationOverride()
        return ReservationPolicy(
            horizon_days=own.horizon_days or self.horizon_days,
            max_days=own.max_days or self.max_days,
            no_show_minutes=own.no_show_minutes or self.no_show_minutes,
        )

    def problems(self, environments: set[str]) -> list[str]:
        """Pools named here that the farm lacks."""
        return [
            f"reservations.environments: '{name}' is not an environment"
            for name in sorted(self.environments)
            if name not in environments
        ]
