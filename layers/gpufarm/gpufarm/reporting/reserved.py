"""The reports' reserved column: GPU-hours of reservations' windows inside the report's period.

A reservation counts from its window's start to its end, or to its release when it ended sooner (cancelled before
its start: nothing; a no-show: the minutes until it was released), so its hours go back when it is released. A
booking refused counts nothing. Read from the incidents alone (their `reserved_from`, `reserved_until` and history),
like the held hours beside it (gpufarm.core.calendar).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from datetime import datetime

from gpufarm.core.kernel import history
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.reporting.model import Row
from gpufarm.reporting.query import Period

# The history steps that end a reservation's claim on its window.
_ENDS = frozenset({history.Step.RELEASED.value, history.Step.CANCELLED.value, history.Step.RECLAIMED.value})


def ended_at(alloc: LeaseFacts) -> datetime | None:
    """When the lease's end was recorded in its history (released, cancelled or reclaimed), if it was."""
    for line in alloc.history:
        entry = history.parse(line)
        if entry is not None and entry.step in _ENDS:
            return entry.at
    return None


def reserved_hours(alloc: LeaseFacts, period: Period) -> float:
    """GPU-hours of the reservation's window inside the period (0 for a lease from now or a refused booking)."""
    if alloc.reserved_from is None or alloc.reserved_until is None or alloc.phase in (Phase.REQUESTED, Phase.REJECTED):
        return 0.0
    end = alloc.reserved_until
    stopped = ended_at(alloc)
    if stopped is not None:
        end = min(end, stopped)
    low, high = max(alloc.reserved_from, period.start), min(end, period.end)
    return alloc.gpu_count * max((high - low).total_seconds(), 0.0) / 3600


def add_reserved(
    rows: MutableMapping[str, Row], leases: Iterable[LeaseFacts], period: Period, key: Callable[[LeaseFacts], str]
) -> None:
    """Each reservation's hours onto its group's row (a row made for a group with nothing else in the period)."""
    for alloc in leases:
        hours = reserved_hours(alloc, period)
        if hours > 0:
            name = key(alloc)
            rows.setdefault(name, Row(name)).reserved += hours
