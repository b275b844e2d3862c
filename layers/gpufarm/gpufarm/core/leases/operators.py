"""The operators' side of a request: the card that asks them (with the context it gathers) and its update once decided.

The card's context (gpufarm.core.chat.cards) is read here, each part once and failure-tolerant: the pool's free
GPUs, what the team holds against its quota, how busy the team's leases have been (the node agent's
`gpufarm.gpu.utilization` per device by the IR it attributes, read through the Datadog query API), and the
requester's other live leases. A part that cannot be read is left out or says "utilisation unavailable"; the
card is still posted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from gpufarm.core.chat import cards
from gpufarm.core.chat.cards import MAX_LEASES, UTILISATION_DAYS, CardContext
from gpufarm.core.chat.links import DEVICE_IR_KEY
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import team_usage
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricsQuery
from gpufarm.core.kernel.reasons import Reason, ReasonCode

log = logging.getLogger(__name__)

UTILISATION_METRIC = "gpufarm.gpu.utilization"
UNAVAILABLE = "utilisation unavailable"


def ask_operators(ctx: LeaseContext, alloc: Allocation, reason: str) -> None:
    """Post the request's card with Approve / Reject to the operators' channel and record where it is."""
    if not ctx.operators_channel:
        log.warning("%s needs an operator but no operators channel is configured", alloc.ir_label)
        return
    name = ctx.chat.user_name(alloc.requester) if alloc.requester else None
    message = cards.request_card(alloc, reason, name, gather(ctx, alloc))
    ts = ctx.chat.post_message(ctx.operators_channel, message.text, message.blocks)
    why = Reason(ReasonCode.AWAITING_OPERATOR, reason)
    asked = history.appended(alloc.history, ctx.step(history.POLICY, Step.ASKED, reason_trail.detail(why)))
    where = {f.SLACK_MESSAGE: f"{ctx.operators_channel}/{ts}", f.HISTORY: asked, **reason_trail.fields(why)}
    ctx.write_fields(alloc, where)


def update_operator_message(ctx: LeaseContext, alloc: Allocation, outcome: str) -> None:
    """The request's card, once decided, says who decided and why (its buttons gone)."""
    channel, _, ts = (alloc.slack_message or "").partition("/")
    if not channel or not ts:
        return
    message = cards.decided_card(alloc, outcome, ctx.links_for(alloc))
    try:
        ctx.chat.update_message(channel, ts, message.text, message.blocks)
    except UpstreamError:
        # The decision is recorded in the incident; a stale button message must not undo it.
        log.warning("could not update the operators' message for %s", alloc.ir_label)


def gather(ctx: LeaseContext, alloc: Allocation) -> CardContext:
    """The card's context, each part read once and failure-tolerant."""
    env, team, model = alloc.environment or "", alloc.team or "", (alloc.gpu_model or "").upper()
    free: tuple[int, int] | None
    try:
        free = ctx.inventory_summary().get((env, model))
    except GpufarmError as exc:
        log.warning("%s: the pool's capacity could not be read for the card: %s", alloc.ir_label, exc)
        free = None
    held: int | None
    leases: tuple[Allocation, ...] = ()
    try:
        live = [a for a in ctx.live(env, team) if a.ir != alloc.ir]
        held = team_usage(live, team, env, model)
        leases = tuple(a for a in live if a.hosts)
    except GpufarmError as exc:
        log.warning("%s: the team's leases could not be read for the card: %s", alloc.ir_label, exc)
        held = None
    others: tuple[Allocation, ...] = ()
    if alloc.requester:
        try:
            others = tuple(a for a in ctx.reads().requested_by(alloc.requester) if a.ir != alloc.ir)
        except GpufarmError as exc:
            log.warning("%s: the requester's leases could not be read for the card: %s", alloc.ir_label, exc)
    usage = utilisation(ctx.usage, leases, ctx.now())
    quota = ctx.farm.quota(team, env, model)
    limits = (quota.gpus, quota.hard_limit) if quota is not None else None
    return CardContext(free, held, limits, leases, usage, others, ctx.links_for(alloc))


def utilisation(query: MetricsQuery | None, leases: Sequence[Allocation], now: datetime) -> str:
    """`mean 37 % over 7 days (IR-4 12 %, IR-9 61 %)`, 'no leases holding GPUs', or 'utilisation unavailable'."""
    if not leases:
        return "no leases holding GPUs"
    if query is None:
        return UNAVAILABLE
    shown = sorted(leases, key=lambda a: a.ir)[:MAX_LEASES]
    scope = ", ".join(ir_tag_value(a.ir) for a in shown)
    # Per device by the IR the node agent attributes it to (`gpu_ir`, exact even on shared hosts, where the hosts'
    # `ir` tags name every lease on them).
    text = f"avg:{UTILISATION_METRIC}{{{DEVICE_IR_KEY} IN ({scope})}} by {{{DEVICE_IR_KEY}}}"
    try:
        results = query.scalar(text, now - timedelta(days=UTILISATION_DAYS), now)
    except GpufarmError as exc:
        log.warning("utilisation query failed: %s", exc)
        return UNAVAILABLE
    by_ir: dict[str, float] = {}
    for result in results:
        tags = dict(t.partition(":")[::2] for t in result.group_tags)
        if result.value is not None and tags.get(DEVICE_IR_KEY):
            by_ir[tags[DEVICE_IR_KEY]] = result.value
    if not by_ir:
        return f"no utilisation measured over {UTILISATION_DAYS} days"
    parts = [f"{a.ir_label} {by_ir[ir_tag_value(a.ir)]:.0f} %" for a in shown if ir_tag_value(a.ir) in by_ir]
    mean = sum(by_ir.values()) / len(by_ir)
    more = f", {len(leases) - len(shown)} more" if len(leases) > len(shown) else ""
    return f"mean {mean:.0f} % over {UTILISATION_DAYS} days ({', '.join(parts)}{more})"
