"""The incident webhook's step: act on an incident as it is now (allocate when approved or waiting, reclaim when
resolved, then give what the reclaim freed to the pool's queue). The webhook and the sweep both bring incidents
here, so whichever comes first does the step and the other finds nothing to do."""

from __future__ import annotations

from gpufarm.core.calendar import reservations
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.leases import probe
from gpufarm.core.leases.allocation import allocate, allocate_waiting
from gpufarm.core.leases.ending import reclaim


@invocation
def process(ctx: LeaseContext, incident_id: str, arrival: str | None = None) -> list[Outcome]:
    """Act on an incident's current state: allocate when approved/waiting, reclaim when resolved, else nothing.

    `arrival` says how the incident webhook's call came (token, fields, trigger); only a doctor's probe records it.
    """
    alloc = ctx.reads().get_by_id(incident_id)
    if alloc.is_probe:
        return [probe.note_webhook(ctx, alloc, arrival) if arrival else Outcome(alloc.ir, "nothing to do (probe)")]
    if alloc.is_quota_override:
        # A quota change holds no hosts: its phases say pending, in effect or ended (gpufarm.core.accounting.overrides).
        return [Outcome(alloc.ir, "nothing to do (quota override)")]
    if alloc.is_budget_period:
        # A budget period's incident records the alerts told; it is created ended and holds nothing.
        return [Outcome(alloc.ir, "nothing to do (budget period)")]
    if alloc.state is State.RESOLVED:
        outcomes = [reclaim(ctx, alloc)]
        if outcomes[0].action == "reclaimed" and alloc.environment:
            outcomes += allocate_waiting(ctx, alloc.environment)
        return outcomes
    if alloc.phase in (Phase.APPROVED, Phase.WAITING) or reservations.started(alloc, ctx.now()):
        return [allocate(ctx, alloc)]
    return [Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")]
