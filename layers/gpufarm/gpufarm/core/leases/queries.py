"""What a lease, a user's or a team's leases look like now: `/gpu status` and `/gpu list`, read, never written.

Each is shown only to those who may see the lease (gpufarm.core.governance.visibility).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufarm.core.chat import messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance import visibility
from gpufarm.core.kernel.errors import NotAllowed, ValidationFailed
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases import fair_share, terms


@invocation
def allocation(ctx: LeaseContext, ir: int) -> Allocation:
    """One allocation by IR; NotFound naming the IR."""
    return ctx.get(ir)


@invocation
def status(ctx: LeaseContext, ir: int, user: str) -> Message:
    """One allocation in detail, for those who may see it (gpufarm.core.governance.visibility)."""
    alloc = ctx.get(ir)
    visibility.check(ctx.membership(), user, alloc)
    return messages.status_message(alloc, ctx.links_for(alloc), ctx.submit_hint(alloc))


@invocation
def visible_allocation(ctx: LeaseContext, ir: int, user: str) -> Allocation:
    """One allocation by IR when `user` may see it; NotFound naming the IR, NotAllowed for another team's."""
    alloc = ctx.get(ir)
    visibility.check(ctx.membership(), user, alloc)
    return alloc


@invocation
def list_allocations(ctx: LeaseContext, scope: str, user: str, team: str | None = None) -> Message:
    """Live allocations: the user's own, a team's, or all; other teams' leases are counted, never shown."""
    # Each scope reads only what it shows: a user's own through the requester facet, a team's through the team
    # facet, so a user's list costs the same whatever else the farm holds (docs/design.md, "Reads per invocation").
    membership = ctx.membership()
    if scope == "all":
        everything, hidden = visibility.visible(membership, user, sorted(ctx.live(), key=lambda a: -a.ir))
        return messages.list_message(
            "All live allocations", everything, positions(ctx, everything), ctx.links_for, hidden
        )
    mine = ctx.reads().requested_by(user)
    if scope == "team":
        if team is not None:
            ctx.farm.team(team)
            if not visibility.sees_team(membership, user, team):
                raise NotAllowed(f"team {team}'s leases are shown to its members and the GPU operators")
        teams = {team} if team else {a.team for a in mine if a.team}
        if not teams:
            raise ValidationFailed("team", "you hold no allocations; say which team: /gpu list team nlp")
        # A requester who has left a team still sees their own leases of it, and only those.
        everyone = sorted((a for t in teams for a in ctx.live(team=t)), key=lambda a: -a.ir)
        shown, hidden = visibility.visible(membership, user, everyone)
        title = f"Live allocations of team {', '.join(sorted(t for t in teams if t))}"
        return messages.list_message(title, shown, positions(ctx, shown), ctx.links_for, hidden)
    newest = sorted(mine, key=lambda a: -a.ir)
    return messages.list_message("Your live allocations", newest, positions(ctx, mine), ctx.links_for)


def positions(ctx: LeaseContext, shown: Iterable[Allocation]) -> dict[int, terms.Position]:
    """Queue positions of the waiting allocations among `shown`, against everything waiting in their pools, each in
    its pool's order with why it stands there (gpufarm.core.leases.ordering)."""
    waiting = [a for a in shown if a.phase in terms.WAITING]
    out: dict[int, terms.Position] = {}
    for env, model in sorted({(a.environment or "", (a.gpu_model or "").upper()) for a in waiting}):
        queue = ctx.live(env, phases=terms.WAITING)
        order = fair_share.pool_order(ctx, env, model)
        out |= {
            a.ir: terms.position(a, queue, order)
            for a in waiting
            if a.environment == env and (a.gpu_model or "").upper() == model
        }
    return out
