"""Extending a lease: its end pushed out within the team's max_days, by its holder or an operator."""

from __future__ import annotations

from datetime import timedelta

from gpufarm.core.chat import messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import GRANTED_PHASES, Action, authorize, extension_days
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import Conflict
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.leases.ending import ended


def extend(ctx: LeaseContext, ir: int, actor: str, days: int | None = None) -> Message:
    """Push the expiry out, within the team's max_days."""
    alloc = ctx.get(ir)
    if alloc.is_quota_override:
        raise Conflict(f"{alloc.ir_label} is a quota change, not a lease; ask for another change to hold it longer")
    authorize(Action.EXTEND, actor, ctx.operators(), alloc)
    ctx.membership().check(actor, alloc.team, f"extend {alloc.ir_label}")
    if alloc.state is State.RESOLVED or alloc.phase not in GRANTED_PHASES | {Phase.REQUESTED}:
        raise Conflict(f"{ended(alloc)}; nothing to extend (request GPUs again instead)")
    add = extension_days(alloc, ctx.farm, days)
    base = alloc.expires_at or ctx.now()
    expires = base + timedelta(days=add)
    was = isoformat(alloc.expires_at) if alloc.expires_at else "unset"
    updated = ctx.write(
        alloc,
        alloc.phase,
        {f.EXPIRES_AT: isoformat(expires), f.DURATION_DAYS: str((alloc.duration_days or 0) + add)},
        step=ctx.step(actor, Step.EXTENDED, f"{was} -> {isoformat(expires)} (+{add} days)"),
    )
    return messages.extended_reply(updated, add, ctx.links_for(updated))
