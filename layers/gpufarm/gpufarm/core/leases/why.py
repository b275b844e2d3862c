"""`/gpu why IR-n`: the lease's current state explained with the numbers. Read, never written.

- Waiting for hosts: its place in the pool's order and why (gpufarm.core.leases.ordering), what is ahead of it (the
  asker's own team's requests by IR, others counted), the pool's GPUs held and free, and the earliest start the live
  leases' ends allow for its GPUs over its whole duration (gpufarm.core.leases.earliest; the pool's future holds,
  such as reservations, join through `future_holds`), and when it is withdrawn if no hosts come.
- Waiting for an operator: why it needs one and, when no operator could approve it within the team's hard limit,
  when it is withdrawn (gpufarm.core.leases.unapprovable).
- Holding hosts: until when, and an idle warning's end. Ended or refused: the reason it carries.
Shown only to those who may see the lease (gpufarm.core.governance.visibility).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gpufarm.core.chat.block_kit import Message, linked, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance import visibility
from gpufarm.core.kernel import reason_trail
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.leases import fair_share, terms, unapprovable
from gpufarm.core.leases.earliest import Hold, Release, earliest_start
from gpufarm.core.leases.ordering import Order

MAX_AHEAD_NAMED = 5


def future_holds(ctx: LeaseContext, environment: str, gpu_model: str) -> list[Hold]:
    """GPUs of the pool promised over future windows (none until a calendar books them)."""
    del ctx, environment, gpu_model
    return []


@invocation
def why(ctx: LeaseContext, ir: int, user: str) -> Message:
    """The lease's state explained, for those who may see it."""
    alloc = ctx.get(ir)
    membership = ctx.membership()
    visibility.check(membership, user, alloc)
    lines = [f"*{alloc.ir_label}* ({alloc.gpu_count}x {inert(alloc.gpu_model)} in `{inert(alloc.environment)}`)"]
    if alloc.state is State.RESOLVED or alloc.phase in (Phase.RECLAIMING, Phase.RECLAIMED, Phase.REJECTED):
        lines.append(f"Ended ({alloc.phase.value}).")
    elif alloc.phase is Phase.REQUESTED:
        lines += _awaiting_operator(ctx, alloc)
    elif alloc.phase in terms.WAITING:
        order = fair_share.pool_order(ctx, alloc.environment or "", alloc.gpu_model or "")
        live = ctx.live(alloc.environment)
        ahead = order.ahead(alloc, terms.queue_of(alloc, [a for a in live if a.phase is Phase.WAITING]))
        shown, _ = visibility.visible(membership, user, ahead)
        lines += waiting_lines(ctx, alloc, order, live, ahead, shown)
    elif alloc.phase in HOLDING:
        lines += _holding(alloc)
    reason = reason_trail.latest(alloc)
    if reason is not None:
        lines.append(f"Reason on record: {inert(reason.line())}")
    text = "\n".join(lines)
    return linked(alloc, Message(text.replace("*", "").replace("`", ""), [section(text)]), ctx.links_for(alloc))


def waiting_lines(  # noqa: PLR0917 - the lease, its pool's order and reads, and what the asker sees
    ctx: LeaseContext,
    alloc: Allocation,
    order: Order,
    live: Sequence[Allocation],
    ahead: Sequence[Allocation],
    shown: Sequence[Allocation],
) -> list[str]:
    """Its place and why, what is ahead, the pool's GPUs, the earliest start, the withdrawal time."""
    spot = terms.position(alloc, [a for a in live if a.phase is Phase.WAITING], order)
    lines = [f"Waiting for hosts: {inert(spot)}.", _ahead_line(ahead, shown)]
    lines += _pool_lines(ctx, alloc, live, ahead)
    deadline = terms.waiting_deadline(alloc, ctx.farm)
    if deadline is not None:
        lines.append(f"Withdrawn at {isoformat(deadline)} if no hosts free by then.")
    return lines


def _ahead_line(ahead: Sequence[Allocation], shown: Sequence[Allocation]) -> str:
    """What is ahead of it: the requests the asker may see by name, the others counted."""
    named = [f"{a.ir_label} ({a.gpu_count}x {inert(a.team)})" for a in shown[:MAX_AHEAD_NAMED]]
    others = len(ahead) - len(named)
    if not (named or others):
        return "Nothing is ahead of it: it is next when the pool has room."
    more = f"{', ' if named else ''}{others} of other teams" if others else ""
    return f"Ahead of it: {', '.join(named)}{more}."


def _pool_lines(
    ctx: LeaseContext, alloc: Allocation, live: Sequence[Allocation], ahead: Sequence[Allocation]
) -> list[str]:
    """The pool's GPUs (held, free, needed) and the earliest start the live leases' ends and future holds allow."""
    env, model = alloc.environment or "", (alloc.gpu_model or "").upper()
    # The pool's size counted, not listed (gpufarm.core.context.reads.host_sizes): a few reads whatever its size.
    total = sum(gpus * n for (_, gpus), n in ctx.reads().host_sizes(env, model).items())
    holding = [a for a in live if a.phase in HOLDING and (a.gpu_model or "").upper() == model]
    held = sum(sum(a.host_gpus.values()) or a.gpu_count for a in holding)
    free = max(total - held, 0)
    need = alloc.gpu_count + sum(a.gpu_count for a in ahead)
    days = alloc.duration_days or ctx.farm.defaults.duration_days
    releases = [Release(a.expires_at, sum(a.host_gpus.values()) or a.gpu_count) for a in holding if a.expires_at]
    start = earliest_start(ctx.now(), free, need, timedelta(days=days), releases, future_holds(ctx, env, model))
    pool = f"Pool: {total} {model}, {held} held by {len(holding)} leases, {free} free; it and those ahead need {need}."
    return [pool, _earliest_text(start, ctx.now(), days)]


def _earliest_text(start: datetime | None, now: datetime, days: int) -> str:
    if start is None:
        return "Earliest start: not within the live leases' ends (more GPUs are needed than their ends free)."
    if start <= now:
        return "Earliest start: now, by GPU count (the placement on hosts decides)."
    return (
        f"Earliest start: no earlier than {isoformat(start)}, when the live leases' ends free enough GPUs for "
        f"{days} days (ends move with extensions, releases and idle reclaims)."
    )


def _awaiting_operator(ctx: LeaseContext, alloc: Allocation) -> list[str]:
    lines = ["Waiting for a GPU operator's decision (beyond the team's quota)."]
    over = unapprovable.over_limit(ctx, alloc)
    if over is None:
        return lines
    asked = unapprovable.asked_at(alloc)
    hours = ctx.farm.scheduling.pool(alloc.environment).unapprovable_withdraw_hours
    when = f" at {isoformat(asked + timedelta(hours=hours))}" if asked else ""
    lines.append(f"No operator can approve it now: {inert(over)}. It is withdrawn{when} unless that changes.")
    return lines


def _holding(alloc: Allocation) -> list[str]:
    held = sum(alloc.host_gpus.values()) or alloc.gpu_count
    until = isoformat(alloc.expires_at) if alloc.expires_at else "its end"
    lines = [f"Holds {held} GPUs on {len(alloc.hosts)} hosts until {until}."]
    if alloc.phase is Phase.IDLE_WARNED and alloc.idle_warned_at:
        lines.append(
            f"Warned idle at {isoformat(alloc.idle_warned_at)}: reclaimed after its grace unless busy or kept."
        )
    return lines
