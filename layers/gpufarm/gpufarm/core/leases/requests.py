"""A request's way to a decision: the incident created once per request, the policy's verdict, the operators' call.

Within quota the policy approves at once; beyond quota but within the hard limit the operators get a card with
Approve / Reject; over the hard limit the request is refused. The verdict is weighed from one `Grant` (what the
request asks and what the team already holds in the pool), built the same way for the up-front check, the
decision that counts and an operator's approval, and always serialized with the grants it commits (docs/design.md,
rule 7).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpufarm.core.accounting import budgets, overrides, quota_requests
from gpufarm.core.calendar import reservations
from gpufarm.core.chat import cards, messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.context import twins
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance.policy import (
    POLICY_APPROVER,
    Action,
    Ask,
    Decision,
    Verdict,
    authorize,
    decide_grant,
    over_hard_limit,
    team_usage,
)
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.errors import Conflict
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, GpuRequest
from gpufarm.core.kernel.reasons import Reason, ReasonCode
from gpufarm.core.leases import lending
from gpufarm.core.leases.operators import ask_operators, update_operator_message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """What the policy weighs: the ask (charged as the pool charges it) and the team's grants in the pool."""

    ask: Ask
    team_used: int


def grant(
    ctx: LeaseContext, team: str, environment: str, gpu_model: str, gpu_count: int, *, exclude: int | None = None
) -> Grant:
    """The ask and what the team holds in the pool now (the lease `exclude` left out: the one being decided)."""
    model = gpu_model.upper()
    charge = ctx.charge(environment, model, gpu_count)
    ask = Ask(team, environment, model, gpu_count, charge=charge)
    live = [a for a in ctx.live(environment, team) if a.ir != exclude]
    return Grant(ask, team_usage(live, team, environment, model, charge=ctx.held))


def decide(ctx: LeaseContext, weighed: Grant, *, project: str | None, days: int) -> Decision:
    """The policy's verdict against the pool's capacity and the team's quota, then its GPU-hour budgets."""
    ask = weighed.ask
    capacity = ctx.reads().capacity(ask.environment, ask.gpu_model, ask.gpu_count, units=ctx.shared(ask.environment))
    # The quotas as the farm file sets them plus the quota changes in effect (gpufarm.core.accounting.overrides).
    farm = overrides.effective_farm(ctx, ask.environment, ask.team)
    decision = decide_grant(ask, farm, team_used=weighed.team_used, pool_capacity=capacity)
    # Beyond quota only: approved on the idle quota other teams lend, where the pool lets the team borrow.
    decision = lending.borrow(ctx, ask, weighed.team_used, decision)
    return budgets.gate(
        ctx,
        decision,
        team=ask.team,
        project=project,
        gpus=ask.charged,
        days=days,
        environment=ask.environment,
        model=ask.gpu_model,
    )


@invocation
def check_requester(ctx: LeaseContext, request: GpuRequest) -> None:
    """NotAllowed unless the requester may charge the request's team; MembershipUnavailable when Slack fails."""
    ctx.membership().check(request.requester, request.team, f"request GPUs for team {request.team}")


def submit_request(ctx: LeaseContext, request: GpuRequest) -> Message:
    """Create the incident for a request (once per request_id) and decide it now (no queue: one writer)."""
    decision = precheck(ctx, request)
    if decision.verdict is Verdict.REFUSE:
        return messages.refused(decision.reason)
    alloc, undecided = create_request(ctx, request)
    if not undecided:
        granted = alloc.phase is not Phase.REQUESTED
        return messages.request_created(alloc, approved=granted, reason="already requested", links=ctx.links_for(alloc))
    return decide_request(ctx, alloc.ir)


@invocation
def precheck(ctx: LeaseContext, request: GpuRequest) -> Decision:
    """The policy's verdict against what is granted now: a refusal here creates no incident.

    A reservation is weighed against the pool's calendar over its window instead (gpufarm.core.calendar)."""
    if request.is_reservation:
        refusal = reservations.precheck(ctx, request)
        if refusal is not None:
            return Decision(Verdict.REFUSE, refusal.line(), 0, 0, None)
        return Decision(Verdict.APPROVE, "the window is weighed against the pool's calendar when decided", 0, 0, None)
    weighed = grant(ctx, request.team, request.environment, request.gpu_model, request.gpu_count)
    return decide(ctx, weighed, project=request.project, days=request.duration_days)


def create_request(ctx: LeaseContext, request: GpuRequest) -> tuple[Allocation, bool]:
    """The request's incident in phase requested, created once per request_id; True when it awaits a decision.

    A concurrent duplicate of the same request (two worker invocations) is retired at once: the lowest IR
    carrying the request_id wins and only its creator asks for the decision.
    """
    record = ctx.incidents.find_by_request_id(request.request_id)
    act = record is not None  # a retry of an attempt that may have died before its decision was asked for
    if record is None:
        requested = history.entry(ctx.now(), request.requester, Step.REQUESTED, _asked(request))
        created = ctx.incidents.create(
            request.title(),
            {**request.to_fields(Phase.REQUESTED, ctx.now()), f.HISTORY: [requested.line()]},
            initial_note=f"Requested from Slack by <@{request.requester}>",
        )
        # A booking's check reads its pool afresh, which its decision then reads from (twins.first_for).
        record = twins.settle(ctx, request.request_id, created, request.title(), pool=request.is_reservation)
        act = record.id == created.id
    alloc = Allocation.from_record(record)
    return alloc, act and undecided(alloc)


@invocation
def decide_request(ctx: LeaseContext, ir: int) -> Message:
    """The policy decision that counts, run in the pool's queue group after every grant committed before it.

    Within quota: approved by policy. Beyond quota but within the hard limit: sent to the operators. Over the
    hard limit now (grants committed since the request's up-front check): refused, the incident closed with
    the reason, rather than left waiting for room the team may never be allowed (docs/design.md, rule 7).
    """
    alloc = ctx.get(ir)
    links = ctx.links_for(alloc)
    if not undecided(alloc):
        if alloc.state is State.RESOLVED:
            return messages.ended_reply(alloc, links)
        granted = alloc.phase is not Phase.REQUESTED
        return messages.request_created(alloc, approved=granted, reason="already decided", links=links)
    if alloc.reserved_from is not None:
        # A booking: weighed against the pool's calendar over its window, here in the pool's one writer.
        return reservations.book(ctx, alloc)
    weighed = grant(ctx, alloc.team or "", alloc.environment or "", alloc.gpu_model or "", alloc.gpu_count, exclude=ir)
    days = alloc.duration_days or ctx.farm.defaults.duration_days
    decision = decide(ctx, weighed, project=alloc.project, days=days)
    if decision.verdict is Verdict.REFUSE:
        refused = Reason(ReasonCode.REFUSED_POLICY, decision.reason)
        step = ctx.step(history.POLICY, Step.REFUSED, reason_trail.detail(refused))
        ctx.write(alloc, Phase.REJECTED, reason_trail.fields(refused, ctx.now()), step=step)
        ctx.write_fields(alloc, {}, title=f"{alloc.title} (refused: {decision.reason})"[:250])
        log.info("%s refused by policy: %s", alloc.ir_label, decision.reason)
        return messages.policy_refused(alloc, decision.reason, links)
    if decision.verdict is Verdict.APPROVE:
        approved = ctx.step(history.POLICY, Step.APPROVED, decision.reason)
        borrowed = {f.BORROWED: str(decision.borrowed)} if decision.borrowed else {}
        alloc = ctx.write(alloc, Phase.APPROVED, {f.APPROVED_BY: POLICY_APPROVER, **borrowed}, step=approved)
        ctx.post_operators(
            cards.decided_card(alloc, f"Approved by policy: {inert(decision.reason)}", ctx.links_for(alloc))
        )
    else:
        ask_operators(ctx, alloc, decision.reason)
    granted = decision.verdict is Verdict.APPROVE
    return messages.request_created(alloc, approved=granted, reason=decision.reason, links=ctx.links_for(alloc))


@invocation
def approve(ctx: LeaseContext, ir: int, actor: str) -> Message:
    """An operator approves a request beyond quota; the webhook then allocates."""
    authorize(Action.APPROVE, actor, ctx.operators())
    alloc = ctx.get(ir)
    if alloc.is_quota_override:
        return quota_requests.approve(ctx, alloc, actor)
    expect_phase(alloc, Phase.REQUESTED, "approved")
    # Serialized with every other grant of the pool (docs/design.md, rule 7): the hard limit holds for operators.
    weighed = grant(ctx, alloc.team or "", alloc.environment or "", alloc.gpu_model or "", alloc.gpu_count, exclude=ir)
    farm = overrides.effective_farm(ctx, alloc.environment, alloc.team)
    over = over_hard_limit(weighed.ask, farm, team_used=weighed.team_used)
    if over:
        raise Conflict(f"{alloc.ir_label} cannot be approved: {over}; it stays requested")
    updated = ctx.write(alloc, Phase.APPROVED, {f.APPROVED_BY: actor}, step=ctx.step(actor, Step.APPROVED))
    update_operator_message(ctx, updated, f"Approved by {mention(actor)}")
    ctx.tell(updated.requester, messages.approved_notice(updated, actor, ctx.links_for(updated)))
    return messages.approved_reply(updated, ctx.links_for(updated))


@invocation
def reject(ctx: LeaseContext, ir: int, actor: str, reason: str | None = None) -> Message:
    """An operator rejects a request; the incident is resolved with phase rejected."""
    authorize(Action.REJECT, actor, ctx.operators())
    alloc = ctx.get(ir)
    if alloc.is_quota_override:
        return quota_requests.reject(ctx, alloc, actor, reason)
    expect_phase(alloc, Phase.REQUESTED, "rejected")
    why = Reason(ReasonCode.REJECTED_OPERATOR, f"reason: {reason}" if reason else "no reason given")
    rejected = ctx.step(actor, Step.REJECTED, reason_trail.detail(why))
    updated = ctx.write(alloc, Phase.REJECTED, reason_trail.fields(why, ctx.now()), step=rejected)
    update_operator_message(ctx, updated, f"Rejected by {mention(actor)}" + (f": {inert(reason)}" if reason else ""))
    ctx.tell(updated.requester, messages.rejected_notice(updated, actor, reason, ctx.links_for(updated)))
    return messages.rejected_reply(updated, ctx.links_for(updated))


def expect_phase(alloc: Allocation, phase: Phase, verb: str) -> None:
    """Conflict naming who decided, unless the lease is in `phase`."""
    if alloc.phase is not phase:
        who = alloc.approved_by
        # An error is shown inert as a whole (messages.error_message): the approver is named, not mentioned.
        by = f" (approved by {who if who == POLICY_APPROVER else f'operator {who}'})" if who else ""
        raise Conflict(f"{alloc.ir_label} cannot be {verb}: it is already {alloc.phase.value}{by}")


def undecided(alloc: Allocation) -> bool:
    """A request nobody (policy or operator) has decided yet."""
    return (
        alloc.state is not State.RESOLVED
        and alloc.phase is Phase.REQUESTED
        and not alloc.approved_by
        and not alloc.slack_message
    )


def _asked(request: GpuRequest) -> str:
    """`4x H100 in onprem-hpc for 7 days, team nlp, project llm-ko`: what a request asked for, for its history."""
    return (
        f"{request.gpu_count}x {request.gpu_model} in {request.environment} for {request.duration_days} days, "
        f"team {request.team}, project {request.project}"
    )
