"""The allocation lifecycle: incident state (active / stable / resolved) plus a finer phase field."""

from __future__ import annotations

from enum import StrEnum

from gpufarm.core.kernel.errors import InvalidTransition


class State(StrEnum):
    """Datadog's own incident states; no custom states exist, so the phase field carries the rest."""

    ACTIVE = "active"
    STABLE = "stable"
    RESOLVED = "resolved"


class Phase(StrEnum):
    """Where an allocation is in its life."""

    REQUESTED = "requested"
    APPROVED = "approved"
    WAITING = "waiting"
    ALLOCATED = "allocated"
    IDLE_WARNED = "idle-warned"
    RECLAIMING = "reclaiming"
    RECLAIMED = "reclaimed"
    REJECTED = "rejected"


class ReclaimReason(StrEnum):
    """Why an allocation ended; written to the incident so every reclaim is audited."""

    RELEASED = "released"
    EXPIRED = "expired"
    IDLE = "idle"
    OPERATOR = "operator"
    RESOLVED_IN_DATADOG = "resolved-in-datadog"
    CANCELLED = "cancelled"
    # Approved but no hosts came within the lease policy's waiting limit (gpufarm.core.leases.terms).
    WITHDRAWN = "withdrawn"
    # A borrowing lease taken back on notice for the lending team (gpufarm.core.leases.preemption).
    PREEMPTED = "preempted"
    # Beyond quota, and no operator could approve it within the team's hard limit for the pool's policy time
    # (gpufarm.core.leases.unapprovable).
    UNAPPROVABLE = "unapprovable"


PHASE_STATE: dict[Phase, State] = {
    Phase.REQUESTED: State.ACTIVE,
    Phase.APPROVED: State.ACTIVE,
    Phase.WAITING: State.ACTIVE,
    Phase.ALLOCATED: State.STABLE,
    Phase.IDLE_WARNED: State.STABLE,
    Phase.RECLAIMING: State.RESOLVED,
    Phase.RECLAIMED: State.RESOLVED,
    Phase.REJECTED: State.RESOLVED,
}

# The phases in which a lease holds its hosts (and so counts, accrues, is repaired and can be warned).
HOLDING: frozenset[Phase] = frozenset({Phase.ALLOCATED, Phase.IDLE_WARNED})

# Reclaiming is reachable from every live phase: a release, an expiry, an idle reclaim or an operator
# resolving the incident in Datadog's UI may end an allocation at any stage.
_LIVE_TO_RECLAIM = frozenset({Phase.RECLAIMING})
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.REQUESTED: frozenset({Phase.APPROVED, Phase.REJECTED}) | _LIVE_TO_RECLAIM,
    Phase.APPROVED: frozenset({Phase.ALLOCATED, Phase.WAITING}) | _LIVE_TO_RECLAIM,
    Phase.WAITING: frozenset({Phase.ALLOCATED}) | _LIVE_TO_RECLAIM,
    Phase.ALLOCATED: frozenset({Phase.IDLE_WARNED}) | _LIVE_TO_RECLAIM,
    Phase.IDLE_WARNED: frozenset({Phase.ALLOCATED}) | _LIVE_TO_RECLAIM,
    Phase.RECLAIMING: frozenset({Phase.RECLAIMED}),
    Phase.RECLAIMED: frozenset(),
    Phase.REJECTED: frozenset(),
}


def state_for(phase: Phase) -> State:
    """The incident state a phase implies."""
    return PHASE_STATE[phase]


def can_transition(src: Phase, dst: Phase) -> bool:
    """True when the lifecycle allows src → dst; staying put is always allowed (idempotent writes)."""
    return src == dst or dst in TRANSITIONS[src]


def check_transition(src: Phase, dst: Phase) -> None:
    """Raise InvalidTransition unless src → dst is allowed."""
    if not can_transition(src, dst):
        raise InvalidTransition(f"an allocation in phase '{src}' cannot move to '{dst}'")
