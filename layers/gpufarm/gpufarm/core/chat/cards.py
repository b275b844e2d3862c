"""The operators' approval card with the context a decision needs, and the card once decided.

An operator asked to approve a request beyond quota sees, beside the ask: the pool's free GPUs of that model now,
what the team holds in the pool against its quota and hard limit, how busy the team's leases there have been over
the last 7 days (measured by the node agent's `gpufarm.gpu.utilization`, read through the Datadog query API), the
requester's other live leases, and a link to the incident. Every part is bounded (at most MAX_LEASES leases named
and queried) and failure-tolerant: a failed metrics query says "utilisation unavailable", a failed read leaves its
line out; the card is still posted (gpufarm.core.leases.operators gathers it). After the decision the same card
says who decided and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufarm.core.chat.amounts import gpu_amount
from gpufarm.core.chat.block_kit import (
    ACTION_APPROVE,
    ACTION_REJECT,
    Message,
    actions,
    button,
    context,
    linked,
    section,
)
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.kernel.model import Allocation

MAX_LEASES = 20
UTILISATION_DAYS = 7


@dataclass(frozen=True)
class CardContext:
    """What the card says besides the ask; None where it could not be read."""

    free: tuple[int, int] | None  # free and total GPUs of the model in the pool now
    team_held: int | None
    quota: tuple[int, int | None] | None  # the team's quota and hard limit for the model in the pool
    team_leases: tuple[Allocation, ...]
    utilisation: str
    others: tuple[Allocation, ...]  # the requester's other live leases
    links: Links  # the lease's (its pool's metrics source)


def request_card(alloc: Allocation, reason: str, requester_name: str | None, ctx: CardContext) -> Message:
    """To the operators' channel: a request beyond quota, its context, and Approve / Reject (a reason modal)."""
    who = mention(alloc.requester) + (f" ({inert(requester_name)})" if requester_name else "")
    what = _what(alloc)
    link = ctx.links.incident(alloc.ir)
    text = f"*<{link}|{alloc.ir_label}>* needs approval: {who} asks for {what}, {alloc.duration_days} days."
    if alloc.purpose:
        text += f"\n>{inert(alloc.purpose)}"
    value = alloc.ir_label
    message = Message(
        f"{alloc.ir_label} needs approval",
        [
            section(text),
            section(_facts(alloc, ctx)),
            context(inert(reason)),
            actions(
                f"decide:{alloc.ir}",
                button("Approve", ACTION_APPROVE, value, "primary"),
                button("Reject", ACTION_REJECT, value, "danger"),
            ),
        ],
    )
    return linked(alloc, message, ctx.links)


def decided_card(alloc: Allocation, outcome: str, links: Links) -> Message:
    """The card once decided: the ask, who decided and why, no buttons.

    `outcome` is gpufarm's own mrkdwn (a mention of the operator it checked): its callers make any reason in it
    inert (gpufarm.core.chat.escape).
    """
    text = (
        f"*<{links.incident(alloc.ir)}|{alloc.ir_label}>*: {mention(alloc.requester)} asked for {_what(alloc)}, "
        f"{alloc.duration_days} days."
    )
    return linked(alloc, Message(f"{alloc.ir_label}: {outcome}", [section(text), section(f"*{outcome}*")]), links)


def _what(alloc: Allocation) -> str:
    where, owner = inert(alloc.environment), inert(f"{alloc.team}/{alloc.project}")
    return f"{gpu_amount(alloc)} in `{where}` for `{owner}`"


def _facts(alloc: Allocation, ctx: CardContext) -> str:
    model, env = inert(alloc.gpu_model), inert(alloc.environment)
    lines = []
    if ctx.free is not None:
        lines.append(f"• Pool `{env}` now: {ctx.free[0]} of {ctx.free[1]} {model} free")
    else:
        lines.append(f"• Pool `{env}`: free capacity unavailable")
    if ctx.team_held is not None:
        lease_list = ", ".join(a.ir_label for a in ctx.team_leases[:MAX_LEASES])
        more = f" +{len(ctx.team_leases) - MAX_LEASES}" if len(ctx.team_leases) > MAX_LEASES else ""
        held = f"{ctx.team_held} {model}" + (f" ({lease_list}{more})" if lease_list else "")
        lines.append(f"• Team {inert(alloc.team)} holds {held} in `{env}`{_quota(ctx)}")
    lines.append(f"• Team's leases there, last {UTILISATION_DAYS} days: {ctx.utilisation}")
    if ctx.others:
        named = ", ".join(f"{a.ir_label} ({gpu_amount(a)} {a.phase.value})" for a in ctx.others[:10])
        more = f" +{len(ctx.others) - 10}" if len(ctx.others) > 10 else ""
        lines.append(f"• {mention(alloc.requester)}'s other live leases: {named}{more}")
    else:
        lines.append(f"• {mention(alloc.requester)} holds no other live lease")
    return "\n".join(lines)


def _quota(ctx: CardContext) -> str:
    if ctx.quota is None:
        return ", no quota there"
    gpus, hard = ctx.quota
    return f", quota {gpus}" + (f", hard limit {hard}" if hard is not None else "")
