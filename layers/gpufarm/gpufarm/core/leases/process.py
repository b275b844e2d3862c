"""The incident webhook's step: act on an incident as it is now (allocate when approved or waiting, reclaim when
resolved, then give what the reclaim freed to the pool's queue)."""

from __future__ import annotations

from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.leases.allocation import allocate, allocate_waiting
from gpufarm.core.leases.ending import reclaim


@invocation
def process(ctx: LeaseContext, incident_id: str) -> list[Outcome]:
    """Act on an incident's current state: allocate when approved/waiting, reclaim when resolved, else nothing."""
    alloc = ctx.reads().get_by_id(incident_id)
    if alloc.state is State.RESOLVED:
        outcomes = [reclaim(ctx, alloc)]
        if outcomes[0].action == "reclaimed" and alloc.environment:
            outcomes += allocate_waiting(ctx, alloc.environment)
        return outcomes
    if alloc.phase in (Phase.APPROVED, Phase.WAITING):
        return [allocate(ctx, alloc)]
    return [Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")]
