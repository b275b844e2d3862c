"""Preemption on notice: a borrowing lease is taken back when the team that lent the capacity needs its quota.

A request of a team within its quota that the pool cannot place (it waits, gpufarm.core.leases.allocation) claims
the GPUs that borrowing leases (gpufarm.core.leases.lending) hold in the pool for its model. A borrower is
preemptible once its protection window has passed (`protection_hours` after its allocation, default 1 h) and while
no operator exemption holds (`exempt_until`, the exemption of gpufarm.core.idle.keeps); the lowest priority class
goes first (gpufarm.core.config.lending), then the youngest lease. Each one chosen is told first, by DM, the reason,
its deadline (`notice_minutes`, default 30) and who needs the GPUs; only then is the notice recorded
(`gpufarm_preempt_at`, `gpufarm_preempt_for`, a `preempting` history step with the reason). A notice Slack did not
take for a reason that may pass fails the step, nothing recorded: the preemption waits and is tried again, as an idle
warning is (gpufarm.core.idle.delivery). At the deadline the sync and the sweep end the lease through the ending
path (reason preempted: gpufarm.core.sync.expiry), its hosts are freed, and the waiting request is allocated.
With nothing preemptible the request waits with a reason saying when the earliest borrower becomes preemptible.
A pool whose policy is `borrow: never` claims nothing (its waiting requests cost no extra read): a pool that stops
lending lets the leases that borrowed run to their end.
Everything here runs in the pool's queue group (docs/design.md, rule 7).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufarm.core.accounting import overrides
from gpufarm.core.chat.amounts import gpu_amount
from gpufarm.core.chat.block_kit import Message, linked, section
from gpufarm.core.chat.delivery import deliver_warning
from gpufarm.core.chat.escape import inert
from gpufarm.core.config.lending import Borrow
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import team_usage
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import NotFound, ValidationFailed
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.ir import parse_ir
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.reasons import Reason, ReasonCode
from gpufarm.core.leases.lending import granted_in, pool_gpus

log = logging.getLogger(__name__)

NOTICE_CLEARED: dict[str, object] = {f.PREEMPT_AT: None, f.PREEMPT_FOR: None}


@dataclass(frozen=True)
class Claim:
    """What a lender's claim did: the borrowers newly told, and the reason the lender waits."""

    noticed: tuple[int, ...]
    reason: Reason | None


def protected_until(alloc: Allocation, ctx: LeaseContext) -> datetime | None:
    """Until when the borrower may not be preempted (its protection window or an operator's exemption), or None."""
    now = ctx.now()
    ends: list[datetime] = []
    hours = ctx.farm.lending.policy(alloc.environment).protection_hours
    if alloc.allocated_at is not None and alloc.allocated_at + timedelta(hours=hours) > now:
        ends.append(alloc.allocated_at + timedelta(hours=hours))
    if alloc.exempt_until is not None and alloc.exempt_until > now:
        ends.append(alloc.exempt_until)
    return max(ends) if ends else None


def lender(ctx: LeaseContext, alloc: Allocation) -> bool:
    """A granted request of a team within its quota (not itself borrowing): it may claim borrowed GPUs back."""
    farm = overrides.effective_farm(ctx, alloc.environment, alloc.team)
    quota = farm.quota(alloc.team or "", alloc.environment or "", alloc.gpu_model or "")
    if quota is None or alloc.borrowed:
        return False
    team, env = alloc.team or "", alloc.environment or ""
    return team_usage(ctx.live(env), team, env, alloc.gpu_model or "", ctx.held) <= quota.gpus


def claim(ctx: LeaseContext, waiting: Allocation) -> Claim:
    """The waiting lender's claim on borrowed GPUs: borrowers told and recorded, or the reason it waits for them."""
    if waiting.phase is not Phase.WAITING or ctx.farm.lending.policy(waiting.environment).borrow is Borrow.NEVER:
        return Claim((), None)  # a pool that does not lend has no borrower to claim from, and costs no read
    borrowers = _borrowers(ctx, waiting)
    if not borrowers or not lender(ctx, waiting):
        return Claim((), None)
    mine = [a for a in borrowers if a.preempt_for == waiting.ir_label]
    need = ctx.held(waiting) - _free(ctx, waiting) - sum(ctx.held(a) for a in mine)
    noticed: list[int] = []
    for victim in _preemptible(ctx, borrowers):
        if need <= 0:
            break
        notice(ctx, victim, waiting)
        noticed.append(victim.ir)
        mine.append(ctx.get(victim.ir))
        need -= ctx.held(victim)
    return Claim(tuple(noticed), _waits(ctx, waiting, mine, borrowers, need))


def _borrowers(ctx: LeaseContext, waiting: Allocation) -> list[Allocation]:
    """Leases of other teams holding GPUs of the waiting request's pool and model beyond their quota."""
    env, model = waiting.environment or "", (waiting.gpu_model or "").upper()
    return [
        a for a in granted_in(ctx.live(env), env, model) if a.phase in HOLDING and a.borrowed and a.team != waiting.team
    ]


def _free(ctx: LeaseContext, waiting: Allocation) -> int:
    """GPUs of the pool's model no lease holds now."""
    env, model = waiting.environment or "", (waiting.gpu_model or "").upper()
    holding = sum(ctx.held(a) for a in granted_in(ctx.live(env), env, model) if a.phase in HOLDING)
    return max(0, pool_gpus(ctx, env, model) - holding)


def _preemptible(ctx: LeaseContext, borrowers: list[Allocation]) -> list[Allocation]:
    """Borrowers not yet under notice and past protection: the lowest class first, then the youngest lease."""
    rules = ctx.farm.lending
    return sorted(
        (a for a in borrowers if a.preempt_at is None and protected_until(a, ctx) is None),
        key=lambda a: (rules.rank(a.team), -(a.allocated_at or ctx.now()).timestamp(), -a.ir),
    )


def _waits(
    ctx: LeaseContext, waiting: Allocation, mine: list[Allocation], borrowers: list[Allocation], need: int
) -> Reason | None:
    """Why the lender still waits: for borrowers under notice, or until the earliest protected one may be taken."""
    if need > 0:
        later = [(t, a) for a in borrowers if a.preempt_at is None and (t := protected_until(a, ctx)) is not None]
        if later:
            when, first = min(later, key=lambda pair: (pair[0], pair[1].ir))
            return Reason(
                ReasonCode.QUEUED_PROTECTED,
                f"{waiting.ir_label} waits for {need} GPUs borrowed by other teams; the earliest borrower, "
                f"{first.ir_label}, becomes preemptible at {isoformat(when)}",
            )
    deadline = min((a.preempt_at for a in mine if a.preempt_at is not None), default=None)
    if deadline is not None:
        names = ", ".join(a.ir_label for a in mine)
        return Reason(
            ReasonCode.QUEUED_PREEMPTION,
            f"{waiting.ir_label} waits for {names}, borrowing its team's quota, to be taken back by "
            f"{isoformat(deadline)}",
        )
    return None


def notice(ctx: LeaseContext, victim: Allocation, waiting: Allocation) -> Allocation:
    """Tell the borrower first (DM), then record the notice; UpstreamError (nothing recorded) when Slack may take it
    later. A notice that can never be delivered (the holder's account is gone) is recorded undelivered."""
    minutes = ctx.farm.lending.policy(victim.environment).notice_minutes
    deadline = ctx.now() + timedelta(minutes=minutes)
    reason = notice_reason(victim, waiting, deadline, minutes)
    delivered = deliver_warning(ctx.chat, victim.requester, notice_message(ctx, victim, reason))
    if not delivered:
        log.warning("%s: preemption notice not delivered; recorded undelivered", victim.ir_label)
    step = ctx.step(history.GPUFARM, Step.PREEMPTING, "" if delivered else "notice undelivered", reason.line())
    values: dict[str, object] = {f.PREEMPT_AT: isoformat(deadline), f.PREEMPT_FOR: waiting.ir_label}
    updated = ctx.write(victim, victim.phase, values, step=step)
    ctx.post_operators(Message(inert(reason.sentence), [section(inert(reason.sentence))]))
    return updated


def notice_reason(victim: Allocation, waiting: Allocation, deadline: datetime, minutes: int) -> Reason:
    """The notice's reason: what is taken back, why, by when, and who needs it."""
    return Reason(
        ReasonCode.PREEMPTION_NOTICE,
        f"{victim.ir_label} borrowed {victim.borrowed} GPUs beyond team {victim.team}'s quota; team {waiting.team} "
        f"needs them back for {waiting.ir_label} ({waiting.gpu_count}x {waiting.gpu_model}, requested by "
        f"{waiting.requester}), so {victim.ir_label} is reclaimed at {isoformat(deadline)} ({minutes} min notice)",
    )


def notice_message(ctx: LeaseContext, victim: Allocation, reason: Reason) -> Message:
    """The DM a preempted borrower gets."""
    text = (
        f":warning: *{victim.ir_label}* ({gpu_amount(victim)} in `{inert(victim.environment)}`) is taken back: "
        f"{inert(reason.sentence)}. Save your work before then; release it sooner to give the GPUs back now."
    )
    return linked(victim, Message(text.replace("*", "").replace("`", ""), [section(text)]), ctx.links_for(victim))


def due(alloc: Allocation, now: datetime) -> bool:
    """True when a borrower's notice has run out (an exemption granted meanwhile holds it off)."""
    if alloc.preempt_at is None or alloc.preempt_at > now or alloc.phase not in HOLDING:
        return False
    return alloc.exempt_until is None or alloc.exempt_until <= now


def still_needed(ctx: LeaseContext, alloc: Allocation) -> bool:
    """Whether the request the notice was for still waits (it may have been cancelled or placed meanwhile)."""
    try:
        waiting = ctx.get(parse_ir(alloc.preempt_for or ""))
    except (NotFound, ValidationFailed):
        return False
    return waiting.state is not State.RESOLVED and waiting.phase in (Phase.APPROVED, Phase.WAITING)


def withdraw(ctx: LeaseContext, alloc: Allocation) -> Allocation:
    """The notice cleared, on record: the request it was for no longer waits."""
    step = ctx.step(history.GPUFARM, Step.PREEMPTING, f"notice withdrawn: {alloc.preempt_for} no longer waits")
    updated = ctx.write(alloc, alloc.phase, dict(NOTICE_CLEARED), step=step)
    ctx.tell(updated.requester, Message(f"{alloc.ir_label} is no longer taken back; it keeps its GPUs."))
    return updated


def record_wait(ctx: LeaseContext, waiting: Allocation, reason: Reason) -> None:
    """The lender's wait reason in its history, once per new sentence (the sync retries every few minutes)."""
    line = reason.line()
    if any(line in entry for entry in waiting.history[-3:]):
        return
    updated = ctx.write(waiting, waiting.phase, {}, step=ctx.step(history.GPUFARM, Step.BORROWING, line))
    told = Message(inert(reason.sentence), [section(inert(reason.sentence))])
    ctx.tell(updated.requester, linked(updated, told, ctx.links_for(updated)))
