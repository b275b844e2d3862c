"""The `Reason` of a lease's end: its code (one per ReclaimReason) and a sentence with the numbers.

gpufarm.core.leases.ending writes it with the end (field and history, gpufarm.core.kernel.reason_trail).
"""

from __future__ import annotations

from datetime import datetime

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel.lifecycle import ReclaimReason
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.reasons import Reason, ReasonCode

CODE: dict[ReclaimReason, ReasonCode] = {
    ReclaimReason.RELEASED: ReasonCode.ENDED_RELEASED,
    ReclaimReason.CANCELLED: ReasonCode.ENDED_CANCELLED,
    ReclaimReason.EXPIRED: ReasonCode.ENDED_EXPIRED,
    ReclaimReason.IDLE: ReasonCode.RECLAIMED_IDLE,
    ReclaimReason.OPERATOR: ReasonCode.RECLAIMED_OPERATOR,
    ReclaimReason.RESOLVED_IN_DATADOG: ReasonCode.RECLAIMED_IN_DATADOG,
    ReclaimReason.WITHDRAWN: ReasonCode.WITHDRAWN_WAIT_LIMIT,
    ReclaimReason.UNAPPROVABLE: ReasonCode.WITHDRAWN_UNAPPROVABLE,
    ReclaimReason.PREEMPTED: ReasonCode.PREEMPTED,
}


def end_reason(
    farm: FarmConfig,
    alloc: Allocation,
    why: ReclaimReason,
    now: datetime,
    *,
    by: str | None = None,
    note: str | None = None,
) -> Reason:
    """Why the lease ends, with the numbers its fields and the farm's policy give (`note`: the limit's own words)."""
    code = CODE[why]
    held = f"{alloc.gpu_count}x {alloc.gpu_model or 'GPU'}"
    timed = _by_time(farm, alloc, why, now, held, note)
    if timed is not None:
        return Reason(code, timed)
    if why is ReclaimReason.OPERATOR:
        return Reason(code, f"an operator{f' ({by})' if by else ''} took back {held}")
    if why is ReclaimReason.RELEASED:
        return Reason(code, f"the requester released {held}")
    if why is ReclaimReason.CANCELLED:
        return Reason(code, "the requester cancelled the request")
    return Reason(code, "its incident was resolved in Datadog")


def _by_time(  # noqa: PLR0917 - one sentence per end gpufarm decides by time
    farm: FarmConfig, alloc: Allocation, why: ReclaimReason, now: datetime, held: str, note: str | None
) -> str | None:
    """The sentence of an end gpufarm decided by the clock (expiry, idle, waiting limits, preemption), else None."""
    if why is ReclaimReason.EXPIRED:
        days = alloc.duration_days or farm.defaults.duration_days
        ends = isoformat(alloc.expires_at) if alloc.expires_at else isoformat(now)
        return f"its {days} days on {held} ran out at {ends}"
    if why is ReclaimReason.IDLE:
        grace = alloc.idle_grace_minutes or farm.idle.grace_for(alloc.environment, alloc.team)
        warned = isoformat(alloc.idle_warned_at) if alloc.idle_warned_at else "its warning"
        return f"its {held} stayed idle from {warned} past the {grace} min grace"
    if why is ReclaimReason.WITHDRAWN:
        hours = farm.leases.policy(alloc.environment, alloc.team).waiting_max_hours
        return f"no {held} freed in {alloc.environment} within the {hours} h waiting limit"
    if why is ReclaimReason.UNAPPROVABLE:
        hours = farm.scheduling.pool(alloc.environment).unapprovable_withdraw_hours
        limit = f": {note}" if note else ""
        return f"no operator could approve it within the team's hard limit for {hours} h{limit}"
    if why is ReclaimReason.PREEMPTED:
        at = isoformat(alloc.preempt_at) if alloc.preempt_at else isoformat(now)
        return (
            f"it borrowed {alloc.borrowed} GPUs and was taken back for {alloc.preempt_for} at its notice's end ({at})"
        )
    return None
