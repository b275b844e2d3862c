"""The sweep (every minute): every incident whose next step waits on a side effect is brought to its pool's one
writer, so each step completes within two minutes with no webhook at all (docs/design.md, rule 13).

Webhooks are the fast path; the sweep is the guarantee. It reads:
- the live leases (one `state:(active OR stable)` search, the documented facet): an approved request not yet
  allocated gets its step queued, a lease due to end (expired, withdrawn, idle past its grace) an expiry command,
  a lease idle past its own idle window (gpufarm.core.idle.lease_window) an idle command;
- the ended leases whose hosts are not yet freed (resolved, phase not reclaimed or rejected: released, expired or
  resolved in Datadog's UI) among the newest ENDED_SCAN ended incidents: their step is queued.
A step goes to the incident's pool group as the webhook's message does, with the same dedup id for the same change
(gpufarm.core.kernel.serial.incident_step), so the two are one message and the step runs once, whichever comes
first; the consumer reads the incident fresh and does nothing when there is nothing to do. Without a queue (one
writer, the unit tests) each runs at once. A sweep that finds nothing writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufarm.core.accounting import overrides
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.idle import lease_window
from gpufarm.core.idle.alerts import idle_triggered
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IncidentCommand, Op, incident_step, pool_group
from gpufarm.core.leases.process import process
from gpufarm.core.sync import expiry

SWEEP_BUCKET_S = 60
# How many of the newest ended incidents the sweep looks at when Datadog cannot filter them by phase (a fallback,
# gpufarm.adapters.incident_search): a lease ends within minutes of its incident being resolved, far inside these.
ENDED_SCAN = 1000
# Phases that still hold a side effect once the incident is resolved: hosts to untag, a requester to tell.
ENDING = frozenset(Phase) - {Phase.RECLAIMED, Phase.REJECTED}
ENDED_QUERY = IncidentQuery.where({State.RESOLVED}, phase=sorted(p.value for p in ENDING), scan=ENDED_SCAN)


@dataclass
class SweepReport:
    """What one sweep found and queued (IR numbers)."""

    to_allocate: list[int] = field(default_factory=list)
    to_free: list[int] = field(default_factory=list)
    to_end: list[int] = field(default_factory=list)
    # Leases idle past their own idle window (gpufarm.core.idle.lease_window): their idle command queued.
    to_warn: list[int] = field(default_factory=list)
    live: int = 0


@invocation
def sweep(ctx: LeaseContext) -> SweepReport:
    """Queue the step of every incident waiting on one; nothing is written when nothing waits."""
    report = SweepReport()
    bucket = int(ctx.now().timestamp()) // SWEEP_BUCKET_S
    live = ctx.live()
    report.live = len(live)
    for alloc in live:
        reason = expiry.due(ctx, alloc)
        if reason is not None:
            expiry.send(ctx, alloc, Op.EXPIRE, f"sweep-{bucket}", reason=reason)
            report.to_end.append(alloc.ir)
        elif alloc.phase is Phase.APPROVED:
            _step(ctx, alloc)
            report.to_allocate.append(alloc.ir)
        elif lease_window.pending_due(alloc, ctx.now()):
            # Idle for the lease's own window, longer than the monitor's (gpufarm.core.idle.lease_window).
            _idle(ctx, alloc, f"sweep-{bucket}")
            report.to_warn.append(alloc.ir)
    # Quota changes at their end (gpufarm.core.accounting.overrides), ended in their pool's group.
    report.to_end += overrides.send_due(ctx, f"sweep-{bucket}")
    for record in ctx.incidents.search(ENDED_QUERY):
        alloc = Allocation.from_record(record)
        if not alloc.is_probe:
            _step(ctx, alloc)
            report.to_free.append(alloc.ir)
    return report


def _idle(ctx: LeaseContext, alloc: Allocation, origin: str) -> None:
    """The idle command for a lease idle past its own window, in its pool group; at once without a queue."""
    scope = lease_window.lease_scope(alloc)
    if ctx.queue is None:
        idle_triggered(ctx, alloc.ir, scope)
        return
    command = IncidentCommand(op=Op.IDLE, ir=alloc.ir, origin=origin, idle=scope)
    ctx.queue.send(command.to_body(), group=pool_group(alloc.environment), dedup_id=command.dedup_id())


def _step(ctx: LeaseContext, alloc: Allocation) -> None:
    """The incident's step in its pool group, as the webhook would queue it; at once without a queue."""
    if ctx.queue is None:
        process(ctx, alloc.incident_id)
        return
    body, group, dedup = incident_step(alloc)
    ctx.queue.send({**body, "reason": f"sweep {body['reason']}"}, group=group, dedup_id=dedup)
