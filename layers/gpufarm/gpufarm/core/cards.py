"""The operators' approval card with the context a decision needs, and the card once decided.

An operator asked to approve a request beyond quota sees, beside the ask: the pool's free GPUs of that model now,
what the team holds in the pool against its quota and hard limit, how busy the team's leases there have been over
the last 7 days (measured by the node agent's `gpufarm.gpu.utilization`, read through the Datadog query API), the
requester's other live leases, and a link to the incident. Every part is bounded (at most MAX_LEASES leases named
and queried) and failure-tolerant: a failed metrics query says "utilisation unavailable", a failed read leaves its
line out; the card is still posted. After the decision the same card says who decided and why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from gpufarm.core.errors import GpufarmError
from gpufarm.core.ir import ir_tag_value
from gpufarm.core.links import DEVICE_IR_KEY, Links
from gpufarm.core.model import Allocation
from gpufarm.core.policy import team_usage
from gpufarm.core.ports import MetricsQuery
from gpufarm.core.views import (
    ACTION_APPROVE,
    ACTION_REJECT,
    Message,
    actions,
    button,
    context,
    linked,
    section,
)

if TYPE_CHECKING:
    from datetime import datetime

    from gpufarm.core.service import GpuFarm

log = logging.getLogger(__name__)

MAX_LEASES = 20
UTILISATION_DAYS = 7
UTILISATION_METRIC = "gpufarm.gpu.utilization"
UNAVAILABLE = "utilisation unavailable"


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


def gather(svc: GpuFarm, alloc: Allocation) -> CardContext:
    """The card's context, each part read once and failure-tolerant."""
    env, team, model = alloc.environment or "", alloc.team or "", (alloc.gpu_model or "").upper()
    free: tuple[int, int] | None
    try:
        free = svc._inventory_summary().get((env, model))
    except GpufarmError as exc:
        log.warning("%s: the pool's capacity could not be read for the card: %s", alloc.ir_label, exc)
        free = None
    held: int | None
    leases: tuple[Allocation, ...] = ()
    try:
        live = [a for a in svc._live(env, team) if a.ir != alloc.ir]
        held = team_usage(live, team, env, model)
        leases = tuple(a for a in live if a.hosts)
    except GpufarmError as exc:
        log.warning("%s: the team's leases could not be read for the card: %s", alloc.ir_label, exc)
        held = None
    others: tuple[Allocation, ...] = ()
    if alloc.requester:
        try:
            others = tuple(a for a in svc._reads().requested_by(alloc.requester) if a.ir != alloc.ir)
        except GpufarmError as exc:
            log.warning("%s: the requester's leases could not be read for the card: %s", alloc.ir_label, exc)
    usage = utilisation(svc.usage, leases, svc.clock.now())
    quota = svc.farm.quota(team, env, model)
    limits = (quota.gpus, quota.hard_limit) if quota is not None else None
    return CardContext(free, held, limits, leases, usage, others, svc.links_for(alloc))


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


def request_card(alloc: Allocation, reason: str, requester_name: str | None, ctx: CardContext) -> Message:
    """To the operators' channel: a request beyond quota, its context, and Approve / Reject (a reason modal)."""
    who = f"<@{alloc.requester}>" + (f" ({requester_name})" if requester_name else "")
    what = f"{alloc.gpu_count}x {alloc.gpu_model} in `{alloc.environment}` for `{alloc.team}/{alloc.project}`"
    link = ctx.links.incident(alloc.ir)
    text = f"*<{link}|{alloc.ir_label}>* needs approval: {who} asks for {what}, {alloc.duration_days} days."
    if alloc.purpose:
        text += f"\n>{alloc.purpose}"
    value = alloc.ir_label
    message = Message(
        f"{alloc.ir_label} needs approval",
        [
            section(text),
            section(_facts(alloc, ctx)),
            context(reason),
            actions(
                f"decide:{alloc.ir}",
                button("Approve", ACTION_APPROVE, value, "primary"),
                button("Reject", ACTION_REJECT, value, "danger"),
            ),
        ],
    )
    return linked(alloc, message, ctx.links)


def decided_card(alloc: Allocation, outcome: str, links: Links) -> Message:
    """The card once decided: the ask, who decided and why, no buttons."""
    what = f"{alloc.gpu_count}x {alloc.gpu_model} in `{alloc.environment}` for `{alloc.team}/{alloc.project}`"
    text = (
        f"*<{links.incident(alloc.ir)}|{alloc.ir_label}>*: <@{alloc.requester}> asked for {what}, "
        f"{alloc.duration_days} days."
    )
    return linked(alloc, Message(f"{alloc.ir_label}: {outcome}", [section(text), section(f"*{outcome}*")]), links)


def _facts(alloc: Allocation, ctx: CardContext) -> str:
    model, env = alloc.gpu_model, alloc.environment
    lines = []
    if ctx.free is not None:
        lines.append(f"• Pool `{env}` now: {ctx.free[0]} of {ctx.free[1]} {model} free")
    else:
        lines.append(f"• Pool `{env}`: free capacity unavailable")
    if ctx.team_held is not None:
        lease_list = ", ".join(a.ir_label for a in ctx.team_leases[:MAX_LEASES])
        more = f" +{len(ctx.team_leases) - MAX_LEASES}" if len(ctx.team_leases) > MAX_LEASES else ""
        held = f"{ctx.team_held} {model}" + (f" ({lease_list}{more})" if lease_list else "")
        lines.append(f"• Team {alloc.team} holds {held} in `{env}`{_quota(ctx)}")
    lines.append(f"• Team's leases there, last {UTILISATION_DAYS} days: {ctx.utilisation}")
    if ctx.others:
        named = ", ".join(f"{a.ir_label} ({a.gpu_count}x {a.gpu_model} {a.phase.value})" for a in ctx.others[:10])
        more = f" +{len(ctx.others) - 10}" if len(ctx.others) > 10 else ""
        lines.append(f"• <@{alloc.requester}>'s other live leases: {named}{more}")
    else:
        lines.append(f"• <@{alloc.requester}> holds no other live lease")
    return "\n".join(lines)


def _quota(ctx: CardContext) -> str:
    if ctx.quota is None:
        return ", no quota there"
    gpus, hard = ctx.quota
    return f", quota {gpus}" + (f", hard limit {hard}" if hard is not None else "")
