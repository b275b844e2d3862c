"""Lease semantics: the days count from allocation, a wait for hosts is bounded, the holder is reminded of the end.

A lease's `duration_days` start when its hosts are allocated (`allocated_at`; the end is allocated_at + days), so a
request that waited in the queue still gets every day it asked for. Waiting is bounded by its own limit (farm YAML
`leases.waiting_max_hours`, from `waiting_since`): past it the request is withdrawn, with its own reason and
message, instead of "expiring" before it ever held a host. Waiting requests are served in their pool's order per
model (gpufarm.core.leases.ordering: first come, first served or fair share), which is the queue position shown to the
requester. One
reminder goes out `leases.reminder_hours` before the end, with Extend and Release; the field `expiry_reminded`
records the end it was sent for, so it is sent once per end (an extension moves the end and earns a new one).
The scheduled sync finds both (gpufarm.core.sync) and sends them as incident commands through the pool's
one writer (gpufarm.core.commands.executor).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel import history
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases.ordering import FIFO, Order

# Phases that hold hosts: their end is the lease's expiry.
# Phases that wait for hosts: granted, nothing held yet.
WAITING = frozenset({Phase.APPROVED, Phase.WAITING})


@dataclass(frozen=True)
class Position:
    """Where a waiting request stands in its pool's queue for its model (1 is next)."""

    place: int
    of: int
    gpu_model: str
    # Why it stands there, as the pool's ordering says (gpufarm.core.leases.ordering); empty where not known.
    why: str = ""

    def __str__(self) -> str:
        where = f"{_ordinal(self.place)} of {self.of} waiting for {self.gpu_model}"
        return f"{where}: {self.why}" if self.why else where


def lease_end(allocated_at: datetime, days: int) -> datetime:
    """The end of a lease whose hosts were allocated at `allocated_at`."""
    return allocated_at + timedelta(days=days)


def waiting_deadline(alloc: Allocation, farm: FarmConfig) -> datetime | None:
    """When a waiting request is withdrawn; None while it does not wait (or its wait has no known start)."""
    if alloc.phase not in WAITING or alloc.state is State.RESOLVED:
        return None
    # An incident that began waiting before the field existed counts from its last change, never from nothing.
    since = alloc.waiting_since or alloc.modified
    if since is None:
        return None
    hours = farm.leases.policy(alloc.environment, alloc.team).waiting_max_hours
    return since + timedelta(hours=hours)


def waiting_over(alloc: Allocation, farm: FarmConfig, now: datetime) -> bool:
    """True when a waiting request has waited past its limit."""
    deadline = waiting_deadline(alloc, farm)
    return deadline is not None and deadline <= now


def expired(alloc: Allocation, now: datetime) -> bool:
    """True when a lease holding hosts has reached its end."""
    return (
        alloc.state is not State.RESOLVED
        and alloc.phase in HOLDING
        and alloc.expires_at is not None
        and alloc.expires_at <= now
    )


def reminder_due(alloc: Allocation, farm: FarmConfig, now: datetime) -> bool:
    """True when a holding lease is within its reminder window and was not reminded of this end yet."""
    if alloc.state is State.RESOLVED or alloc.phase not in HOLDING or alloc.expires_at is None:
        return False
    hours = farm.leases.policy(alloc.environment, alloc.team).reminder_hours
    if hours <= 0 or now >= alloc.expires_at or now < alloc.expires_at - timedelta(hours=hours):
        return False
    return alloc.expiry_reminded != alloc.expires_at


def position(alloc: Allocation, live: Iterable[Allocation], order: Order = FIFO) -> Position:
    """The request's place among the waiting requests of its pool and model, in the order the pool serves them
    (gpufarm.core.leases.ordering: FIFO by IR unless the pool orders by fair share); one just approved has not
    joined the queue yet, so it is counted as if it had."""
    ranked = order.ranked(queue_of(alloc, live))
    place = next(i for i, a in enumerate(ranked, 1) if a.ir == alloc.ir)
    return Position(place, len(ranked), (alloc.gpu_model or "").upper() or "its model", order.why(alloc, ranked))


def queue_of(alloc: Allocation, live: Iterable[Allocation]) -> list[Allocation]:
    """The requests waiting in phase waiting for the pool and model of `alloc`, with `alloc` itself."""
    model = (alloc.gpu_model or "").upper()
    queue = {
        a.ir: a
        for a in live
        if a.phase is Phase.WAITING
        and a.state is not State.RESOLVED
        and a.environment == alloc.environment
        and (a.gpu_model or "").upper() == model
    }
    queue[alloc.ir] = alloc
    return list(queue.values())


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def waiting_since(alloc: Allocation) -> datetime | None:
    """When the request began waiting: its wait for hosts, else its request entry, else its last change."""
    if alloc.phase in WAITING and alloc.waiting_since is not None:
        return alloc.waiting_since
    first = history.parse(alloc.history[0]) if alloc.history else None
    if first is not None and first.step == history.Step.REQUESTED.value:
        return first.at
    return alloc.waiting_since or alloc.modified
