"""A lease's end by time: expired, withdrawn after waiting too long for hosts, or idle past its grace; and the
reminder before the end. The sync finds them; each is re-checked on the incident as it is now, in the lease's
pool group, so an expiry never overwrites a Keep or an extension that ran in between (docs/design.md, rule 7)."""

from __future__ import annotations

from gpufarm.core.accounting import overrides
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.idle import lease_window
from gpufarm.core.idle.partial import every_part_due, grace_over
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.serial import IncidentCommand, Op, pool_group
from gpufarm.core.leases import notices, preemption, terms, unapprovable
from gpufarm.core.leases.ending import resolve


@invocation
def expire(ctx: LeaseContext, ir: int) -> Outcome:
    """The sync's verdict, re-checked on the incident as it is now: resolve when expired or idle past grace."""
    alloc = ctx.get(ir)
    if alloc.is_quota_override:
        return overrides.expire(ctx, alloc)  # a quota change at its end (gpufarm.core.accounting.overrides)
    reason = due(ctx, alloc)
    if reason is None:
        return Outcome(ir, f"nothing to do ({alloc.phase.value})")
    if reason is ReclaimReason.PREEMPTED and not preemption.still_needed(ctx, alloc):
        # The request the notice was for may have been cancelled or placed meanwhile: then the borrower stays.
        preemption.withdraw(ctx, alloc)
        return Outcome(ir, "preemption withdrawn")
    resolve(ctx, alloc, reason, by=None, note=_note(ctx, alloc, reason))
    return Outcome(ir, f"resolved ({reason.value})")


def _note(ctx: LeaseContext, alloc: Allocation, reason: ReclaimReason) -> str | None:
    """The numbers an end by time carries beyond its reason: the hard limit an unapprovable request would pass."""
    return unapprovable.over_limit(ctx, alloc) if reason is ReclaimReason.UNAPPROVABLE else None


def due(ctx: LeaseContext, alloc: Allocation) -> ReclaimReason | None:
    """Why the lease ends now, or None: expired, withdrawn (waited past its limit, or unapprovable past the pool's
    policy time: gpufarm.core.leases.unapprovable), or idle past its grace."""
    if alloc.state is State.RESOLVED:
        return None
    # A lease's days run from its allocation; a request still waiting for hosts has its own limit instead.
    now = ctx.now()
    if terms.expired(alloc, now):
        return ReclaimReason.EXPIRED
    if terms.waiting_over(alloc, ctx.farm, now):
        return ReclaimReason.WITHDRAWN
    if preemption.due(alloc, now):
        return ReclaimReason.PREEMPTED
    if unapprovable.due(ctx, alloc, now):
        return ReclaimReason.UNAPPROVABLE
    if alloc.phase is Phase.IDLE_WARNED and grace_over(ctx.farm, alloc, now):
        # A partly idle lease is not reclaimed whole: only once every host (or device) is idle past its grace.
        policy = lease_window.policy_for(ctx.farm, alloc)
        if not alloc.hosts or every_part_due(alloc, now, policy):
            return ReclaimReason.IDLE
    return None


@invocation
def remind(ctx: LeaseContext, ir: int) -> Outcome:
    """Once per end, before it: tell the holder when the lease ends, with Extend and Release (core.leases.terms)."""
    alloc = ctx.get(ir)
    if not terms.reminder_due(alloc, ctx.farm, ctx.now()) or alloc.expires_at is None:
        return Outcome(ir, f"nothing to do ({alloc.phase.value})")
    ends = isoformat(alloc.expires_at)
    reminded = ctx.step(history.SYNC, Step.REMINDED, f"ends {ends}")
    updated = ctx.write(alloc, alloc.phase, {f.EXPIRY_REMINDED: ends}, step=reminded)
    ctx.tell(updated.requester, notices.expiry_reminder(updated, ctx.links_for(updated)))
    return Outcome(ir, f"reminded (ends {isoformat(alloc.expires_at)})")


def send(ctx: LeaseContext, alloc: Allocation, op: Op, origin: str, *, reason: ReclaimReason | None = None) -> None:
    """An expiry or a reminder as a command in the lease's pool group, re-checked there and sent once per `origin`
    (the sync's five minutes, the sweep's minute); without a queue it runs at once."""
    if ctx.queue is not None:
        command = IncidentCommand(op=op, ir=alloc.ir, origin=origin)
        ctx.queue.send(command.to_body(), group=pool_group(alloc.environment), dedup_id=command.dedup_id())
    elif op is Op.REMIND:
        remind(ctx, alloc.ir)
    elif reason is ReclaimReason.PREEMPTED:
        expire(ctx, alloc.ir)
    elif reason is not None:
        resolve(ctx, alloc, reason, by=None, note=_note(ctx, alloc, reason))
