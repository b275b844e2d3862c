"""Bounded keeps and operator exemptions from idle reclaim.

Keep answers an idle warning at most `max_keeps` times per lease, each holding idle reclaim off for `keep_hours`
(the farm file's `keeps:` section, per environment and team; gpufarm.core.config.keeps). The count and the end of
the hold are incident fields (keep_count, kept_until) and every keep is a history entry, so the warning it
answered stays on record though its timestamp is cleared. Past the maximum Keep is refused, saying why and whom to
ask: only an operator can exempt a lease (`/gpu exempt IR-n 3d reason`, or the Exempt button on the operators'
card) until an end date (exempt_until, exempt_by); a researcher can neither exempt a lease nor turn reclaim off.
Every keep and every exemption is posted to the operators' channel. These run as incident commands in the pool's
group like every other change (docs/design.md, rule 7).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufarm.core.chat.amounts import gpu_amount
from gpufarm.core.chat.block_kit import ACTION_EXEMPT, ACTION_RECLAIM, Message, actions, button, linked, section
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.chat.messages import lease_note
from gpufarm.core.config.keeps import KeepPolicy
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance.policy import Action, authorize
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import Conflict, NotAllowed, ValidationFailed
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.leases.ending import ended

MAX_REASON = 300
# What clears an idle warning: its time and the parts it named (gpufarm.core.idle.partial).
WARNING_CLEARED: dict[str, object] = {f.IDLE_WARNED_AT: None, f.IDLE_PARTS: []}


def policy(ctx: LeaseContext, alloc: Allocation) -> KeepPolicy:
    """The keep policy of the lease's environment and team."""
    return ctx.farm.keeps.policy(alloc.environment, alloc.team)


def suppressed(alloc: Allocation, now: datetime) -> str | None:
    """Why idle reclaim is held off for the lease now ('exempt until ... (granted by ...)', 'kept until ...')."""
    if alloc.exempt_until is not None and alloc.exempt_until > now:
        by = f" (granted by {mention(alloc.exempt_by)})" if alloc.exempt_by else ""
        return f"exempt from idle reclaim until {isoformat(alloc.exempt_until)}{by}"
    if alloc.kept_until is not None and alloc.kept_until > now:
        return f"kept until {isoformat(alloc.kept_until)}"
    return None


@invocation
def keep(ctx: LeaseContext, ir: int, actor: str) -> Message:
    """The requester answers an idle warning with Keep: back to allocated, the warning cleared, within the bounds
    of the keep policy; refused past it, nothing written."""
    alloc = ctx.get(ir)
    authorize(Action.KEEP, actor, ctx.operators(), alloc)
    if alloc.state is State.RESOLVED:
        return lease_note(alloc, f"{ended(alloc)}; nothing to keep.", ctx.links_for(alloc))
    if alloc.phase is not Phase.IDLE_WARNED:
        held = suppressed(alloc, ctx.now())
        if held is not None:
            return lease_note(alloc, f"{alloc.ir_label} is {held}; nothing to keep.", ctx.links_for(alloc))
        text = f"{alloc.ir_label} has no idle warning to clear ({alloc.phase.value})."
        return lease_note(alloc, text, ctx.links_for(alloc))
    return _keep_warned(ctx, alloc, actor)


def _keep_warned(ctx: LeaseContext, alloc: Allocation, actor: str) -> Message:
    """Keep a warned lease: the next of its bounded keeps, or a refusal that says why and whom to ask (nothing is
    written when the keep is refused or the lease is exempt)."""
    now = ctx.now()
    if alloc.exempt_until is not None and alloc.exempt_until > now:
        text = f"{alloc.ir_label} is {suppressed(alloc, now)}; nothing to keep."
        return lease_note(alloc, text, ctx.links_for(alloc))
    rules = policy(ctx, alloc)
    if alloc.keep_count >= rules.max_keeps:
        return refused(ctx, alloc, rules)
    n = alloc.keep_count + 1
    until = now + timedelta(hours=rules.keep_hours)
    values = {**WARNING_CLEARED, f.KEEP_COUNT: str(n), f.KEPT_UNTIL: isoformat(until)}
    step = ctx.step(actor, Step.KEPT, f"{n} of {rules.max_keeps}", f"until {isoformat(until)}")
    updated = ctx.write(alloc, Phase.ALLOCATED, values, step=step)
    ctx.post_operators(
        operators_card(
            updated,
            f"{mention(actor)} kept {updated.ir_label} ({_lease(updated)}): keep {n} of {rules.max_keeps}, "
            f"idle reclaim held off until {isoformat(until)}.",
            ctx.links_for(updated),
        )
    )
    return kept_reply(updated, rules.max_keeps, ctx.links_for(updated))


def operators_card(alloc: Allocation, text: str, links: Links | None = None) -> Message:
    """A lease's news for the operators' channel, with Exempt and Reclaim (each opens a reason form)."""
    message = Message(
        text,
        [
            section(text),
            actions(
                f"lease:{alloc.ir}",
                button("Exempt…", ACTION_EXEMPT, alloc.ir_label),
                button("Reclaim…", ACTION_RECLAIM, alloc.ir_label, "danger"),
            ),
        ],
    )
    return linked(alloc, message, links)


def kept_reply(alloc: Allocation, max_keeps: int | None = None, links: Links | None = None) -> Message:
    """To whoever kept a lease (and to a redelivery of that keep)."""
    until = f" until {isoformat(alloc.kept_until)}" if alloc.kept_until else ""
    of = f" of {max_keeps}" if max_keeps is not None else ""
    text = f"{alloc.ir_label} kept{until} (keep {alloc.keep_count}{of}); the idle warning is cleared."
    return lease_note(alloc, text, links)


def refused(ctx: LeaseContext, alloc: Allocation, rules: KeepPolicy) -> Message:
    """Keep past the maximum: why, and whom to ask for an exemption."""
    ctx.post_operators(
        operators_card(
            alloc,
            f"{mention(alloc.requester)} cannot keep {alloc.ir_label} ({_lease(alloc)}) again: its {rules.max_keeps} "
            f"keeps of {rules.keep_hours} h are used; still idle after the grace it is reclaimed unless exempted.",
            ctx.links_for(alloc),
        )
    )
    ops = _operators_named(ctx)
    text = (
        f":no_entry: {alloc.ir_label} cannot be kept again: it has used its {rules.max_keeps} keeps of "
        f"{rules.keep_hours} h (the policy for team {inert(alloc.team)} in {inert(alloc.environment)}); "
        "still idle after the "
        f"grace period it is reclaimed. To hold it longer, ask the GPU operators{ops} for an exemption "
        f"(`/gpu exempt {alloc.ir_label} 3d {inert('<reason>')}`). Nothing was changed."
    )
    return linked(alloc, Message(text.replace("`", ""), [section(text)]), ctx.links_for(alloc))


@invocation
def exempt(ctx: LeaseContext, ir: int, actor: str, days: int | None, reason: str | None) -> Message:
    """An operator exempts a lease from idle reclaim until an end date, with a reason; the warning is cleared."""
    alloc = ctx.get(ir)
    if alloc.state is State.RESOLVED:
        return lease_note(alloc, f"{ended(alloc)}; nothing to exempt.", ctx.links_for(alloc))
    if actor not in ctx.operators():
        raise NotAllowed(
            "only GPU operators can exempt a lease from idle reclaim; a researcher can Keep a warned lease "
            f"(at most {policy(ctx, alloc).max_keeps} times) or ask the GPU operators"
        )
    if alloc.phase not in HOLDING:
        raise Conflict(f"{alloc.ir_label} holds no GPUs ({alloc.phase.value}); nothing to exempt")
    rules = policy(ctx, alloc)
    if days is None or days < 1:
        raise ValidationFailed("days", f"say for how long: /gpu exempt {alloc.ir_label} 3d <reason>")
    if days > rules.max_exempt_days:
        raise ValidationFailed(
            "days", f"an exemption lasts at most {rules.max_exempt_days} days in {alloc.environment}"
        )
    text = " ".join((reason or "").split())
    if not text:
        raise ValidationFailed("reason", f"say why: /gpu exempt {alloc.ir_label} {days}d <reason>")
    now = ctx.now()
    if alloc.exempt_until is not None and alloc.exempt_until > now and alloc.exempt_by != actor:
        # An error is shown inert as a whole (messages.error_message): the operator is named, not mentioned.
        raise Conflict(
            f"{alloc.ir_label} is already exempt from idle reclaim until {isoformat(alloc.exempt_until)} "
            f"(granted by operator {alloc.exempt_by or 'unknown'}); nothing changed "
            "(the operator who granted it can change it)"
        )
    until = now + timedelta(days=days)
    values: dict[str, object] = {f.EXEMPT_UNTIL: isoformat(until), f.EXEMPT_BY: actor}
    if alloc.phase is Phase.IDLE_WARNED:
        values |= WARNING_CLEARED
    step = ctx.step(actor, Step.EXEMPTED, f"until {isoformat(until)}", f"reason: {text[:MAX_REASON]}")
    updated = ctx.write(alloc, Phase.ALLOCATED, values, step=step)
    notice = (
        f"{mention(actor)} exempted {updated.ir_label} ({_lease(updated)}) from idle reclaim until {isoformat(until)}: "
        f"{inert(text[:MAX_REASON])}"
    )
    links = ctx.links_for(updated)
    ctx.post_operators(lease_note(updated, notice, links))
    ctx.tell(updated.requester, lease_note(updated, notice, links))
    return exempted_reply(updated, links)


def exempted_reply(alloc: Allocation, links: Links | None = None) -> Message:
    """To the operator who exempted a lease (and to a redelivery of that exemption)."""
    until = isoformat(alloc.exempt_until) if alloc.exempt_until else "its end date"
    return lease_note(alloc, f"{alloc.ir_label} is exempt from idle reclaim until {until}.", links)


def _lease(alloc: Allocation) -> str:
    where, team = inert(alloc.environment), inert(alloc.team)
    return f"{gpu_amount(alloc)} in {where}, team {team}, {mention(alloc.requester)}"


def _operators_named(ctx: LeaseContext) -> str:
    """` (@gpu-operators in #gpu-ops)` as Slack mentions, or '' when neither is configured."""
    parts = []
    if ctx.operators_usergroup:
        parts.append(f"<!subteam^{ctx.operators_usergroup}>")
    if ctx.operators_channel:
        parts.append(f"in <#{ctx.operators_channel}>")
    return f" ({' '.join(parts)})" if parts else ""
