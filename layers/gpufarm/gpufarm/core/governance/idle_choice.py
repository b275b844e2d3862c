"""The idle window and grace a request chooses (`idle=30m grace=2h`), validated within its pool's bounds.

Each value is a duration (`45`, `45m`, `2h`, `1d`; minutes when bare), within the pool's bounds
(gpufarm.core.config.idle_choice); a window is at least the shortest window of the pool's enabled idle monitors for
the team (they fire after it: nothing can warn sooner). A value out of bounds is refused with the bounds, and
nothing is created. gpufarm.core.idle.lease_window honours them once the lease holds GPUs.
"""

from __future__ import annotations

import re

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.config.idle_choice import Bounds
from gpufarm.core.kernel.errors import ValidationFailed

_DURATION_RE = re.compile(r"^([0-9]{1,5})\s*(m|min|h|d)?$")
_UNIT_MINUTES = {None: 1, "m": 1, "min": 1, "h": 60, "d": 1440}


def minutes(text: str, field: str) -> int:
    """`45`, `45m`, `2h`, `1d` in minutes; ValidationFailed naming the field otherwise."""
    match = _DURATION_RE.match(text.strip().lower())
    if match is None:
        raise ValidationFailed(field, f"{field}= takes a duration such as 30m, 2h or 1d, not '{text[:20]}'")
    return int(match.group(1)) * _UNIT_MINUTES[match.group(2)]


def choose(
    farm: FarmConfig, environment: str, team: str, window: str | None, grace: str | None
) -> tuple[int | None, int | None]:
    """The lease's own idle window and grace in minutes (None: the pool's), validated within the pool's bounds."""
    bounds = farm.idle_choice.pool(environment)
    chosen_window = chosen_grace = None
    if window:
        chosen_window = _within(minutes(window, "idle"), bounds.window_minutes, "idle", environment)
        # The pool's monitors fire after their kind's window: no warning can come sooner than the shortest.
        shortest = min((k.window_minutes for _, k in farm.idle.policy(environment, team).enabled()), default=0)
        if chosen_window < shortest:
            raise ValidationFailed(
                "idle",
                f"{environment}'s idle monitors judge over {shortest} min at the least: "
                f"choose idle={shortest}m or more",
            )
    if grace:
        chosen_grace = _within(minutes(grace, "grace"), bounds.grace_minutes, "grace", environment)
    return chosen_window, chosen_grace


def _within(value: int, bounds: Bounds, field: str, environment: str) -> int:
    if not bounds.min <= value <= bounds.max:
        raise ValidationFailed(
            field, f"{field}= in {environment} is between {bounds.min} and {bounds.max} minutes, not {value}"
        )
    return value
