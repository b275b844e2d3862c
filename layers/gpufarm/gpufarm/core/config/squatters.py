"""The farm file's squatter policy, per environment: what gpufarm does about a process (or pod) that runs on a
device of another lease, or of none (gpufarm_node.squatters finds them; gpufarm.core.squatters acts).

    environments:
      onprem-hpc:
        squatters: report                              # the default: post once per episode, never stop
      onprem-sliced:
        squatters: {policy: stop-after, grace: 10m}    # post with a notice, stop the process after the grace

`report` posts each episode once to the operators' channel and to the holder of the lease it hurts. `stop-after`
posts the same with the grace it leaves, and once the episode outlasts the grace gpufarm publishes the stop on the
host (a `gpufarm_stop:` host tag, gpufarm.core.kernel.hosts) for the node agent to carry out; never on a host an
operator exempted (`gpufarm_exempt:squatters`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

_GRACE_RE = re.compile(r"^([0-9]{1,4})([mh])$")
MIN_GRACE_MINUTES = 1
MAX_GRACE_MINUTES = 24 * 60


class SquatterAction(StrEnum):
    """What gpufarm does about a squatter on the environment's devices."""

    REPORT = "report"
    STOP_AFTER = "stop-after"


class SquatterPolicy(BaseModel):
    """`squatters:` of one environment: a bare action (`report`, `stop-after`), or `{policy, grace}`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: SquatterAction = SquatterAction.REPORT
    # How long a squatter runs after its first notice before it is stopped (stop-after only): `<n>m` or `<n>h`.
    grace: str = "10m"

    @model_validator(mode="before")
    @classmethod
    def _bare_action(cls, data: Any) -> Any:
        return {"policy": data} if isinstance(data, str) else data

    @field_validator("grace")
    @classmethod
    def _grace_in_range(cls, value: str) -> str:
        minutes = grace_minutes(value)
        if minutes is None:
            raise ValueError(
                f"grace is a whole number of minutes or hours ('10m', '1h') from {MIN_GRACE_MINUTES} minute to "
                f"{MAX_GRACE_MINUTES // 60} hours"
            )
        return value

    @property
    def stops(self) -> bool:
        """True when a squatter is stopped once its grace is over."""
        return self.policy is SquatterAction.STOP_AFTER

    @property
    def grace_minutes(self) -> int:
        """The grace in minutes (validated at load)."""
        return grace_minutes(self.grace) or MIN_GRACE_MINUTES


def grace_minutes(text: str) -> int | None:
    """Minutes of a grace written `<n>m` or `<n>h`, within bounds; None for anything else."""
    match = _GRACE_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        return None
    minutes = int(match.group(1)) * (60 if match.group(2) == "h" else 1)
    return minutes if MIN_GRACE_MINUTES <= minutes <= MAX_GRACE_MINUTES else None


REPORT = SquatterPolicy()
