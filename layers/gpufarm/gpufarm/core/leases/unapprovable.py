"""A request no operator can approve: beyond its team's quota, and approving it would pass the team's hard limit.

Such a request waits for an operator who cannot say yes (an approval is refused by the hard limit,
gpufarm.core.leases.requests.approve), so `scheduling.unapprovable_withdraw_hours` (gpufarm.core.config.scheduling)
after the operators were asked it is withdrawn, with its reason (code `withdrawn-unapprovable` and the numbers of the
limit), instead of staying `requested` until someone rejects it by hand. The sync and the sweep find it
(gpufarm.core.sync.expiry.due) and the withdrawal runs in the pool's queue group, re-checked there, so a request
that became approvable meanwhile (a lease of the team ended) stays.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import over_hard_limit
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases.requests import grant


def asked_at(alloc: Allocation) -> datetime | None:
    """When the operators were asked to decide (the newest `asked-operators` entry), else when it was requested."""
    first: datetime | None = None
    for line in reversed(alloc.history):
        entry = history.parse(line)
        if entry is None:
            continue
        if entry.step == Step.ASKED.value:
            return entry.at
        if entry.step == Step.REQUESTED.value:
            first = entry.at
    return first


def over_limit(ctx: LeaseContext, alloc: Allocation) -> str | None:
    """Why no operator can approve the request now (the hard limit's numbers), or None when one could."""
    weighed = grant(
        ctx, alloc.team or "", alloc.environment or "", alloc.gpu_model or "", alloc.gpu_count, exclude=alloc.ir
    )
    return over_hard_limit(weighed.ask, ctx.farm, team_used=weighed.team_used)


def due(ctx: LeaseContext, alloc: Allocation, now: datetime) -> bool:
    """True when an undecided request has waited past the pool's policy time and no operator can approve it."""
    if alloc.state is State.RESOLVED or alloc.phase is not Phase.REQUESTED or alloc.approved_by or alloc.is_probe:
        return False
    since = asked_at(alloc)
    if since is None:
        return False
    hours = ctx.farm.scheduling.pool(alloc.environment).unapprovable_withdraw_hours
    if now < since + timedelta(hours=hours):
        return False
    return over_limit(ctx, alloc) is not None
