"""The farm file's `keeps:` section: how many Keeps a lease gets, how long each holds, how long an exemption may be.

Overrides per environment, then per team (a team's wins), like the idle policy (gpufarm.core.config.farm); only the keys
given change. What Keep and an exemption do with it is gpufarm.core.idle.keeps.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.kernel.model import Name

MAX_KEEPS = 20
MAX_KEEP_HOURS = 30 * 24
MAX_EXEMPT_DAYS = 365


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KeepPolicy(_Strict):
    """The keep policy in effect for one environment and team."""

    max_keeps: int
    keep_hours: int
    max_exempt_days: int


class KeepOverride(_Strict):
    """A per-environment or per-team change to the keep policy; keys left out inherit."""

    max_keeps: int | None = Field(default=None, ge=0, le=MAX_KEEPS)
    keep_hours: int | None = Field(default=None, ge=1, le=MAX_KEEP_HOURS)
    max_exempt_days: int | None = Field(default=None, ge=1, le=MAX_EXEMPT_DAYS)


class KeepSettings(_Strict):
    """Keep answers an idle warning `max_keeps` times per lease, each holding idle reclaim off for `keep_hours`.

    Past that, Keep is refused and the holder is told to ask the operators, who may exempt a lease from idle
    reclaim for at most `max_exempt_days` (`/gpu exempt IR-n 3d reason`).
    """

    max_keeps: int = Field(default=2, ge=0, le=MAX_KEEPS)
    keep_hours: int = Field(default=24, ge=1, le=MAX_KEEP_HOURS)
    max_exempt_days: int = Field(default=30, ge=1, le=MAX_EXEMPT_DAYS)
    environments: dict[Name, KeepOverride] = Field(default_factory=dict)
    teams: dict[Name, KeepOverride] = Field(default_factory=dict)

    def policy(self, environment: str | None = None, team: str | None = None) -> KeepPolicy:
        """The policy in effect for a lease of `team` in `environment`."""
        values = self.model_dump(exclude={"environments", "teams"})
        for override in (self.environments.get(environment or ""), self.teams.get(team or "")):
            if override is not None:
                values |= override.model_dump(exclude_none=True)
        return KeepPolicy.model_validate(values)
