"""A lease's end: released, cancelled, reclaimed by an operator or the sync, then its hosts freed.

Ending is two steps, each idempotent: `resolve` writes the end (phase reclaiming, the reason, the lease's final
GPU-hours: gpufarm.core.accounting.gpu_hours) and the incident webhook's consumer then runs `reclaim`, which removes
exactly this lease's tags (gpufarm.core.kernel.tags), clears its hosts and tells the requester and the operators.
An incident resolved in Datadog's UI goes through `reclaim` alone, which records the end itself.
"""

from __future__ import annotations

import logging

from gpufarm.core.accounting import gpu_hours
from gpufarm.core.chat import messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.governance.policy import Action, authorize
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.errors import Conflict
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State, check_transition
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases import metrics, notices
from gpufarm.core.leases.end_reasons import end_reason
from gpufarm.core.leases.operators import update_operator_message

log = logging.getLogger(__name__)

REASON_TEXT = {
    ReclaimReason.RELEASED: "released by the requester",
    ReclaimReason.EXPIRED: "its time ran out",
    ReclaimReason.IDLE: "its GPUs stayed idle past the grace period",
    ReclaimReason.OPERATOR: "reclaimed by an operator",
    ReclaimReason.RESOLVED_IN_DATADOG: "its incident was resolved in Datadog",
    ReclaimReason.CANCELLED: "the request was cancelled",
    ReclaimReason.WITHDRAWN: "it waited past its limit for hosts and was withdrawn",
    ReclaimReason.PREEMPTED: "it borrowed idle GPUs and was taken back on notice for the team that lent them",
    ReclaimReason.UNAPPROVABLE: "no operator could approve it within the team's hard limit, and it was withdrawn",
}


@invocation
def release(ctx: LeaseContext, ir: int, actor: str) -> Message:
    """The requester (or an operator) gives the GPUs back: the incident is resolved; the webhook reclaims."""
    alloc = ctx.get(ir)
    authorize(Action.RELEASE, actor, ctx.operators(), alloc)
    ctx.membership().check(actor, alloc.team, f"release {alloc.ir_label}")
    reason = ReclaimReason.CANCELLED if alloc.phase is Phase.REQUESTED else ReclaimReason.RELEASED
    if actor != alloc.requester:
        reason = ReclaimReason.OPERATOR
    return resolve(ctx, alloc, reason, by=actor)


@invocation
def force_reclaim(ctx: LeaseContext, ir: int, actor: str, reason: str | None = None) -> Message:
    """An operator takes an allocation back."""
    authorize(Action.FORCE_RECLAIM, actor, ctx.operators())
    alloc = ctx.get(ir)
    return resolve(ctx, alloc, ReclaimReason.OPERATOR, by=actor, note=reason)


def resolve(
    ctx: LeaseContext, alloc: Allocation, reason: ReclaimReason, *, by: str | None, note: str | None = None
) -> Message:
    """Write the lease's end (phase reclaiming, the reason, its final GPU-hours); the webhook then reclaims."""
    if alloc.is_quota_override:
        # A quota change holds no GPUs: it ends at its end, or an operator rejects it (core.accounting.quota_requests).
        raise Conflict(f"{alloc.ir_label} is a quota change, not a lease; it ends on its own at its end")
    if alloc.state is State.RESOLVED or alloc.phase in (Phase.RECLAIMING, Phase.RECLAIMED, Phase.REJECTED):
        raise Conflict(f"{alloc.ir_label} has already ended ({alloc.phase.value})")
    # The lease's final GPU-hours land with its end (gpufarm.core.accounting.gpu_hours), and its reason
    # (gpufarm.core.kernel.reason_trail).
    why = end_reason(ctx.farm, alloc, reason, ctx.now(), by=by, note=note)
    ended = {
        f.RECLAIM_REASON: reason.value,
        **gpu_hours.final_fields(alloc, ctx.now()),
        **reason_trail.fields(why, ctx.now()),
    }
    step = _ended_step(ctx, reason, by, note, reason_trail.detail(why))
    ctx.write(alloc, Phase.RECLAIMING, ended, step=step)
    if alloc.phase is Phase.REQUESTED and alloc.slack_message:
        who = f" by {mention(by)}" if by else ""
        update_operator_message(ctx, alloc, f"Cancelled{who}" + (f": {inert(note)}" if note else ""))
    log.info("%s resolved (%s)", alloc.ir_label, reason.value)
    return messages.releasing_reply(alloc, REASON_TEXT[reason], ctx.links_for(alloc))


@invocation
def reclaim(ctx: LeaseContext, alloc: Allocation) -> Outcome:
    """Remove exactly this IR's tags, clear its hosts, phase reclaimed, tell the requester and operators."""
    if alloc.phase in (Phase.REJECTED, Phase.RECLAIMED) and not alloc.hosts:
        return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")
    if alloc.state is not State.RESOLVED:
        return Outcome(alloc.ir, f"nothing to do (still {alloc.state.value})")
    check_transition(alloc.phase, Phase.RECLAIMING)
    me = ir_tag_value(alloc.ir)
    tagged = {h.name for h in ctx.reads().tagged_with(alloc.ir, alloc.environment) if me in h.irs}
    hosts = sorted(set(alloc.hosts) | tagged)
    for host in hosts:
        ctx.untag_host(host, alloc)
    reason = alloc.reclaim_reason or ReclaimReason.RESOLVED_IN_DATADOG
    check_transition(Phase.RECLAIMING, Phase.RECLAIMED)
    recorded: dict[str, object] = {}  # the end's reason, when resolve did not record it
    if alloc.phase is Phase.RECLAIMING:
        freed = ctx.step(history.GPUFARM, Step.FREED, f"hosts: {', '.join(hosts) or 'none'}")
    else:  # resolved in Datadog's UI: nobody went through gpufarm, so this is where the reclaim is recorded
        why = end_reason(ctx.farm, alloc, reason, ctx.now())
        recorded = reason_trail.fields(why, ctx.now())
        details = (f"reason: {reason.value}", f"hosts: {', '.join(hosts)}", reason_trail.detail(why))
        freed = ctx.step(history.DATADOG, Step.RECLAIMED, *details)
    # The devices field is emptied only for a lease that recorded units (a dedicated lease's PATCH unchanged).
    no_devices: dict[str, object] = {f.DEVICES: []} if alloc.devices else {}
    updated = ctx.write(
        alloc,
        Phase.RECLAIMED,
        {f.HOSTS: [], f.HOST_GPUS: [], **no_devices, f.RECLAIM_REASON: reason.value, **recorded},
        check=False,
        step=freed,
    )
    if alloc.phase is not Phase.RECLAIMED:  # counted once, by the write that reclaimed it
        metrics.reclaimed(ctx, alloc, reason.value, metrics.held_gpus(alloc))
    if reason is ReclaimReason.WITHDRAWN:
        hours = ctx.farm.leases.policy(alloc.environment, alloc.team).waiting_max_hours
        message = notices.withdrawn(updated, hours, ctx.links_for(updated))
    else:
        # The reason with its numbers, as the history and `/gpu status` give it (gpufarm.core.leases.end_reasons).
        said = f"{REASON_TEXT[reason]}: {end_reason(ctx.farm, alloc, reason, ctx.now()).line()}"
        message = messages.reclaimed(updated, said, hosts, ctx.links_for(updated))
    ctx.tell(updated.requester, message)
    ctx.post_operators(message)
    return Outcome(alloc.ir, "reclaimed", tuple(hosts))


def ended(alloc: Allocation) -> str:
    """'IR-n was released by the requester' and the like, for an answer to an action that came too late."""
    reason = alloc.reclaim_reason
    if alloc.phase is Phase.REJECTED:
        return f"{alloc.ir_label} was rejected"
    if reason is None:
        return f"{alloc.ir_label} has ended ({alloc.phase.value})"
    return f"{alloc.ir_label} has ended ({REASON_TEXT[reason]})"


def _ended_step(ctx: LeaseContext, reason: ReclaimReason, by: str | None, note: str | None, why: str) -> history.Entry:
    """The history entry of a lease ending: released, cancelled, withdrawn or reclaimed, with its note, and last the
    reason line (`why`, gpufarm.core.kernel.reason_trail)."""
    if reason is ReclaimReason.RELEASED:
        return ctx.step(by, Step.RELEASED, why)
    if reason is ReclaimReason.CANCELLED:
        return ctx.step(by, Step.CANCELLED, why)
    if reason in (ReclaimReason.WITHDRAWN, ReclaimReason.UNAPPROVABLE):
        return ctx.step(history.SYNC, Step.WITHDRAWN, why)
    actor = by or (history.MONITOR if reason is ReclaimReason.IDLE else history.SYNC)
    return ctx.step(actor, Step.RECLAIMED, f"reason: {reason.value}", f"note: {note}" if note else "", why)
