"""Twins of one Slack request: two deliveries that each created an incident before either could see the other's.

Slack redelivers a command it did not see acknowledged, and two worker invocations of one request can both find no
incident by its request id and both create one. The oldest live incident carrying the request id wins, whoever asks:
the other creator retires its own at once (resolved, rejected, titled as the duplicate), so one request is one lease,
or one quota change, however often it was delivered.
"""

from __future__ import annotations

from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.ir import format_ir
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, IncidentRecord
from gpufarm.core.kernel.search import live_query


def first_for(ctx: LeaseContext, request_id: str, created: IncidentRecord, *, pool: bool = False) -> IncidentRecord:
    """The oldest live incident carrying this request_id (ours when the search does not show it yet).

    Twins of one request share its pool and team: the search is narrowed to them; with `pool` (a booking, whose
    decision reads the pool whole next) the pool is read afresh through the invocation's reads instead, so that one
    read serves this check and the decision."""
    mine = Allocation.from_record(created)
    if pool and mine.environment:
        twins = [a for a in ctx.reads().fresh(mine.environment) if a.request_id == request_id and a.team == mine.team]
        older = min((a for a in twins if a.ir < created.public_id), key=lambda a: a.ir, default=None)
        return created if older is None else ctx.incidents.get(older.incident_id)
    query = live_query(mine.environment, mine.team)
    same = [r for r in ctx.incidents.search(query) if r.fields.get(f.REQUEST_ID) == request_id]
    if all(r.id != created.id for r in same):
        same.append(created)
    return min(same, key=lambda r: r.public_id)


def settle(
    ctx: LeaseContext, request_id: str, created: IncidentRecord, title: str, *, pool: bool = False
) -> IncidentRecord:
    """The incident that stands for the request: `created`, or an older twin, `created` then retired as its
    duplicate (`title`: the request's own title, to which the twin's IR is added; `pool`: see `first_for`)."""
    first = first_for(ctx, request_id, created, pool=pool)
    if first.id != created.id:
        retired = ctx.incidents.update(
            created.id,
            {f.STATE: State.RESOLVED.value, f.PHASE: Phase.REJECTED.value},
            title=f"{title} (duplicate of {format_ir(first.public_id)})"[:250],
        )
        ctx.reads().wrote(retired)  # what the invocation read of the pool no longer holds it as live
    return first
