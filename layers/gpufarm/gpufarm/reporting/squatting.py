"""Squatting in a report: per group, the squatting episodes that began on its leases' devices and the squatters
stopped there, inside the period (the hurt lease's history: `squatted` and `squatter-stopped` steps,
gpufarm.core.squatters). Counted with the other history steps (gpufarm.reporting.events); shown in every format."""

from __future__ import annotations

from collections import Counter

from gpufarm.core.kernel.history import Step

EPISODE = Step.SQUATTED.value
STOP = Step.SQUATTER_STOPPED.value
STEPS = (EPISODE, STOP)


def episodes(counts: Counter[str]) -> int:
    """Episodes begun in the period, from a lease's step counts."""
    return counts[EPISODE]


def stops(counts: Counter[str]) -> int:
    """Squatters stopped in the period, from a lease's step counts."""
    return counts[STOP]
