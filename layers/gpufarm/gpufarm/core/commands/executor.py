"""The one writer per incident: incident commands sent to the pool's queue group, and run there one at a time.

`submit` is what the Slack worker, the idle alert and the sync call: with a queue the command joins the incident's
pool group (the answer comes later, from the consumer); without one (a deployment with no concurrent writer, the
unit tests) it runs at once. `execute` is what the queue consumer calls: the use case re-reads the incident,
decides and writes, and the user is told what happened, which after a race is what the earlier command left (a
release then an extend: the extend is answered "IR-n has ended ...; nothing to extend"). A new request is a
create command in its pool's group too, so overlapping deliveries of one Slack request make one incident. Every
write of a command records its id in the incident (gpufarm.core.commands.record), so a redelivered command is answered
with what it did instead of being applied twice. docs/design.md, rule 7.
"""

from __future__ import annotations

import logging

from gpufarm.core.accounting import gpu_hours
from gpufarm.core.chat import messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.commands.record import ledgered
from gpufarm.core.config.farm import FarmConfigError
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.policy import Verdict
from gpufarm.core.idle import alerts, keeps
from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotAllowed, NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, GpuRequest
from gpufarm.core.kernel.serial import SQUATTER_OPS, IncidentCommand, Op, pool_group
from gpufarm.core.leases import ending, extension, profile_runs, queries, requests
from gpufarm.core.squatters import alerts as squatter_alerts
from gpufarm.core.sync import expiry

log = logging.getLogger(__name__)

# Commands from a monitor or the sync: nobody to answer.
_UNATTENDED = frozenset({Op.IDLE, Op.BUSY, Op.EXPIRE, Op.REMIND, Op.ACCRUE, *SQUATTER_OPS})


def submit(ctx: LeaseContext, command: IncidentCommand, *, group: str | None = None) -> str | None:
    """Queue the command in its incident's pool group; None when queued, else what running it now did.

    The pool is read from the incident (never from the caller), so every write to one incident shares one group;
    a create's pool is its request's, the pool its incident will have. NotFound when the IR does not exist;
    UpstreamError when Datadog or the queue failed (nothing was queued).
    """
    if group is None:
        group = command.group() or pool_group(queries.allocation(ctx, command.incident).environment)
    if ctx.queue is None:
        return execute(ctx, command, redelivered_on_failure=False)
    ctx.queue.send(command.to_body(), group=group, dedup_id=command.dedup_id())
    log.info("queued %s for %s in group %s", command.op.value, _target(command), group)
    return None


def request(ctx: LeaseContext, gpu_request: GpuRequest, *, response_url: str | None, origin: str) -> Message | None:
    """A new request: refuse at once what can never fit, else queue its create command in the pool's group.

    Returns the answer when there is one now (the up-front refusal); None when the create was queued (or, with
    no queue, ran and answered itself). The consumer finds the request's incident by request id or creates it,
    then decides it, one command at a time per pool: overlapping deliveries of one Slack request share the
    create's dedup id (SQS drops the twin), and a retry after the dedup window finds the incident by request id.
    """
    # Membership first, and never skipped: a request is not accepted for a team Slack cannot vouch the user is in
    # (NotAllowed; MembershipUnavailable, an UpstreamError with a retry hint, when Slack fails).
    requests.check_requester(ctx, gpu_request)
    try:
        decision = requests.precheck(ctx, gpu_request)
    except UpstreamError as exc:
        # The up-front check only spares an incident for what can never fit; the decision that counts runs in
        # the group and refuses that too, so a Datadog hiccup here must not lose the request.
        log.warning("up-front check of request %s skipped: %s", gpu_request.request_id, exc)
    else:
        if decision.verdict is Verdict.REFUSE:
            return messages.refused(decision.reason)
    command = IncidentCommand(
        op=Op.CREATE,
        request=gpu_request,
        actor=gpu_request.requester,
        response_url=response_url,
        reply_to=gpu_request.requester,
        origin=origin,
    )
    submit(ctx, command)
    return None


def execute(ctx: LeaseContext, command: IncidentCommand, *, redelivered_on_failure: bool = True) -> str:
    """Run one command against the incident as it is now and answer its sender; returns what it did, for the log.

    Domain refusals (not allowed, gone, not in a state for this) are answers, not failures: the message is not
    redelivered. UpstreamError propagates so the queue redelivers; a redelivery of a command whose write already
    landed finds its id in the incident and answers with what it did (gpufarm.core.commands.record). For the same reason
    an answer Slack did not take fails the command when the queue redelivers it (`redelivered_on_failure`): the
    redelivery only answers. Run at once (no queue), a lost answer is logged instead.
    """
    if command.unheld_squatter and command.squatter is not None:
        # No incident to record it in: the queue's dedup id (the alert's id, transition and time) made it one post.
        return squatter_alerts.unheld_alert(ctx, command.squatter) if command.op is Op.SQUATTER else "nothing to do"
    run, ledger = ledgered(ctx, command)
    try:
        if command.op is not Op.CREATE and ledger.applied():
            message, summary = _replayed(ctx, Allocation.from_record(ledger.read()), command)
        else:
            message, summary = _run(run, command)
    except UpstreamError:
        raise
    except GpufarmError as exc:
        if isinstance(exc, FarmConfigError):
            # The user reads a generic answer; the operators need the key to fix (e.g. an unknown team user group).
            log.error("%s for %s: %s", command.op.value, _target(command), exc)  # noqa: TRY400 - no traceback needed
        message = messages.error_message(_describe(exc))
        summary = f"refused: {_describe(exc)}"
    if message is not None:
        answer(ctx, command, message, strict=redelivered_on_failure)
    return summary[:300]


def _run(ctx: LeaseContext, cmd: IncidentCommand) -> tuple[Message | None, str]:
    actor = cmd.actor or ""
    if cmd.op is Op.CREATE:
        assert cmd.request is not None
        # In the group no twin creates at the same time; the lowest-IR rule of create_request stays a backstop
        # for a search index that lags. decide_request decides what is undecided and names what is not.
        alloc, _ = requests.create_request(ctx, cmd.request)
        message = requests.decide_request(ctx, alloc.ir)
        return message, message.text[:200]
    ir = cmd.incident
    if cmd.op in _UNATTENDED:
        return None, _unattended(ctx, cmd)
    if not actor:
        raise ValidationFailed("actor", f"a {cmd.op.value} command names who acts")
    if cmd.op is Op.DECIDE:
        message = requests.decide_request(ctx, ir)
    elif cmd.op is Op.APPROVE:
        message = requests.approve(ctx, ir, actor)
    elif cmd.op is Op.REJECT:
        message = requests.reject(ctx, ir, actor, cmd.reason)
    elif cmd.op is Op.RELEASE:
        message = ending.release(ctx, ir, actor)
    elif cmd.op is Op.EXTEND:
        message = extension.extend(ctx, ir, actor, cmd.days)
    elif cmd.op is Op.KEEP:
        message = keeps.keep(ctx, ir, actor)
    elif cmd.op is Op.EXEMPT:
        message = keeps.exempt(ctx, ir, actor, cmd.days, cmd.reason)
    elif cmd.op is Op.PROFILE:
        if cmd.profile is None:
            raise ValidationFailed("profile", "a profile command carries the stored run")
        alloc = queries.allocation(ctx, ir)
        message = profile_runs.record(ctx.incidents, ctx.clock, alloc, actor, cmd.profile, links=ctx.links_for(alloc))
    else:
        message = ending.force_reclaim(ctx, ir, actor, cmd.reason)
    return message, message.text[:200]


def _unattended(ctx: LeaseContext, cmd: IncidentCommand) -> str:
    """A command from a monitor or the sync: nobody to answer, what it did for the log."""
    ir = cmd.incident
    if cmd.op is Op.ACCRUE:
        if cmd.accrue is None:
            raise ValidationFailed("accrue", "an accrue command carries its time and measurement")
        scope = cmd.accrue
        return gpu_hours.record_accrual(
            ctx, ir, scope.until, gpu_hours.scope_busy(scope), gpu_hours.scope_idle_held(scope)
        ).action
    if cmd.op is Op.IDLE:
        return alerts.idle_triggered(ctx, ir, cmd.idle).action
    if cmd.op is Op.BUSY:
        return alerts.idle_recovered(ctx, ir, cmd.idle).action
    if cmd.op is Op.REMIND:
        return expiry.remind(ctx, ir).action
    if cmd.op in SQUATTER_OPS:
        if cmd.squatter is None:
            raise ValidationFailed("squatter", "a squatter command carries the monitor group that fired")
        if cmd.op is Op.SQUATTER:
            return squatter_alerts.squatter_alerted(ctx, ir, cmd.squatter).action
        return squatter_alerts.squatter_cleared(ctx, ir, cmd.squatter).action
    return expiry.expire(ctx, ir).action


def _replayed(ctx: LeaseContext, alloc: Allocation, cmd: IncidentCommand) -> tuple[Message | None, str]:
    """What a command that already applied did, said again from the incident it left (nothing written)."""
    links = ctx.links_for(alloc)
    if cmd.op in _UNATTENDED:
        return None, f"already applied ({alloc.phase.value})"
    if cmd.op is Op.DECIDE:
        if alloc.state is not State.RESOLVED:
            approved = alloc.phase is not Phase.REQUESTED
            return messages.request_created(alloc, approved=approved, reason="decided", links=links), "again"
        message = messages.ended_reply(alloc, links)
    elif cmd.op is Op.APPROVE:
        message = messages.approved_reply(alloc, links)
    elif cmd.op is Op.REJECT:
        message = messages.rejected_reply(alloc, links)
    elif cmd.op in (Op.RELEASE, Op.FORCE_RECLAIM):
        reason = alloc.reclaim_reason.value if alloc.reclaim_reason else None
        message = messages.releasing_reply(alloc, reason, links)
    elif cmd.op is Op.EXTEND:
        message = messages.extended_reply(alloc, None, links)
    elif cmd.op is Op.EXEMPT:
        message = keeps.exempted_reply(alloc, links)
    elif cmd.op is Op.PROFILE and cmd.profile is not None:
        message = profile_runs.recorded_reply(alloc, cmd.profile, links)
    else:
        message = keeps.kept_reply(alloc, links=links)
    return message, f"already applied: {message.text}"[:200]


def answer(ctx: LeaseContext, command: IncidentCommand, message: Message, *, strict: bool = False) -> None:
    """Tell the command's sender: through its response_url when it has one, else by DM.

    strict: a failed answer that may pass later raises (the queue redelivers the command, which then only
    answers); otherwise it is logged, since the incident already says what happened.
    """
    try:
        if command.response_url:
            ctx.chat.respond(command.response_url, message.text, message.blocks or None)
        elif command.reply_to:
            ctx.chat.tell_user(command.reply_to, message.text, message.blocks or None)
    except UpstreamError as exc:
        if strict and _may_pass_later(exc):
            raise
        log.warning("could not answer %s for %s: %s", command.op.value, _target(command), exc)


def _may_pass_later(exc: UpstreamError) -> bool:
    """False for a refusal that redelivery cannot change (an expired or used-up response_url: a 4xx but 429)."""
    status = getattr(exc, "status", None)  # the Slack adapter's errors carry the HTTP status when there was one
    return not isinstance(status, int) or status == 429 or status >= 500


def _target(command: IncidentCommand) -> str:
    if command.request is not None:
        return f"request {command.request.request_id}"
    return f"IR-{command.ir}"


def _describe(exc: GpufarmError) -> str:
    if isinstance(exc, ValidationFailed):
        return exc.message
    if isinstance(exc, NotAllowed | NotFound | Conflict):
        return str(exc)
    return "something went wrong inside gpufarm; the GPU operators can find the details in the function logs"
