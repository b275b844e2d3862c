"""Quota overrides: temporary changes of a team's quota, each held in an incident of gpufarm's own type.

An override is an incident of the GPU allocation type whose `gpufarm_kind` field is `quota-override`, with the
team, pool and model fields of a lease, the signed change (`gpufarm_quota_delta`) and its end
(`gpufarm_quota_until`). Its phase says where it is: `requested` (asked in chat, an operator decides:
gpufarm.core.accounting.quota_requests), `allocated` (in effect), `rejected` (refused or rejected) and `reclaimed`
(ended at its end). It never holds hosts: the lease reads skip it (gpufarm.core.context.reads) and the incident
webhook does nothing with it. Every change and who approved it is in its history.

While in effect, an override adds its change to the team's quota (`gpus`) and to its hard limit when the farm file
sets one, wherever a decision reads the quota (`effective_farm`): the policy's verdict, an operator's approval, the
lending pool's idle quota. At `until` the sweep ends it in its pool's queue group (`expire`).
"""

from __future__ import annotations

from datetime import datetime

from gpufarm.core.accounting.override_terms import Override as Override  # noqa: PLC0414
from gpufarm.core.accounting.override_terms import apply as apply  # noqa: PLC0414
from gpufarm.core.accounting.override_terms import in_effect as in_effect  # noqa: PLC0414
from gpufarm.core.chat.block_kit import Message, section
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.reasons import Reason, ReasonCode
from gpufarm.core.kernel.serial import IncidentCommand, Op, pool_group

MAX_LINES = 20


def live(ctx: LeaseContext, environment: str | None = None, team: str | None = None) -> list[Override]:
    """The overrides in effect for a team in a pool, a pool, or everywhere, as this invocation reads them."""
    return in_effect(ctx.reads().overrides(environment, team), ctx.now())


def effective_farm(ctx: LeaseContext, environment: str | None = None, team: str | None = None) -> FarmConfig:
    """The farm as a quota decision in `environment` (for `team`) reads it: the file's quotas plus the overrides in
    effect there (only `team`'s when given: read from the same search as the team's leases)."""
    return apply(ctx.farm, live(ctx, environment, team))


def due(alloc: Allocation, now: datetime) -> bool:
    """True when an override (in effect or still asked) has reached its end."""
    return (
        alloc.is_quota_override
        and alloc.state is not State.RESOLVED
        and alloc.quota_until is not None
        and alloc.quota_until <= now
    )


def send_due(ctx: LeaseContext, origin: str) -> list[int]:
    """Every override at its end, ended in its pool's group (at once without a queue); the IRs sent."""
    sent: list[int] = []
    for alloc in ctx.reads().overrides():
        if not due(alloc, ctx.now()):
            continue
        if ctx.queue is not None:
            command = IncidentCommand(op=Op.EXPIRE, ir=alloc.ir, origin=origin)
            ctx.queue.send(command.to_body(), group=pool_group(alloc.environment), dedup_id=command.dedup_id())
        else:
            expire(ctx, alloc)
        sent.append(alloc.ir)
    return sent


@invocation
def expire(ctx: LeaseContext, alloc: Allocation) -> Outcome:
    """An override at its end: in effect → ended (reclaimed, expired); still asked → withdrawn (rejected)."""
    if not due(alloc, ctx.now()):
        return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")
    until = isoformat(alloc.quota_until) if alloc.quota_until else "its end"
    where = f"{alloc.gpu_model} in {alloc.environment}"
    if alloc.phase in HOLDING:
        reason = Reason(
            ReasonCode.QUOTA_EXPIRED,
            f"team {alloc.team}'s quota change of {alloc.quota_delta:+d} {where} ended at {until}",
        )
        values: dict[str, object] = {f.RECLAIM_REASON: ReclaimReason.EXPIRED.value}
        ended = ctx.step(history.SYNC, Step.EXPIRED, reason.line())
        ctx.write(alloc, Phase.RECLAIMED, values, check=False, step=ended)
        message = f":calendar: {inert(reason.sentence)}."
        ctx.tell(alloc.requester, _note(message))
        ctx.post_operators(_note(message))
        return Outcome(alloc.ir, "quota override ended")
    step = ctx.step(history.SYNC, Step.WITHDRAWN, f"no operator decided before its end ({until})")
    ctx.write(alloc, Phase.REJECTED, {}, step=step)
    ctx.tell(alloc.requester, _note(f"{alloc.ir_label}: your quota change reached {until} undecided; it is withdrawn."))
    return Outcome(alloc.ir, "quota override withdrawn")


def quota_lines(ctx: LeaseContext, team: str | None = None) -> list[str]:
    """`/gpu quota`'s lines for the overrides in effect (the quotas above already include them)."""
    mine = [o for o in live(ctx) if team is None or o.team == team]
    if not mine:
        return []
    lines = ["*Quota changes in effect* (included above)"]
    for o in mine[:MAX_LINES]:
        by = f", approved by {mention(o.approved_by)}" if o.approved_by else ""
        lines.append(f"• {inert(o.label())}{by}")
    if len(mine) > MAX_LINES:
        lines.append(f"• {len(mine) - MAX_LINES} more")
    return lines


def _note(text: str) -> Message:
    return Message(text, [section(text)])
