"""The one writer per incident: incident commands sent to the pool's queue group, and run there one at a time.

`submit` is what the Slack worker, the idle alert and the sync call: with a queue the command joins the incident's
pool group (the answer comes later, from the consumer); without one (a deployment with no concurrent writer, the
unit tests) it runs at once. `execute` is what the queue consumer calls: the use case re-reads the incident,
decides and writes, and the user is told what happened, which after a race is what the earlier command left (a
release then an extend: the extend is answered "IR-n has ended ...; nothing to extend"). docs/design.md, rule 7.
"""

from __future__ import annotations

import logging

from gpufarm.core import views
from gpufarm.core.errors import Conflict, GpufarmError, NotAllowed, NotFound, UpstreamError, ValidationFailed
from gpufarm.core.lifecycle import Phase
from gpufarm.core.model import GpuRequest
from gpufarm.core.policy import Verdict
from gpufarm.core.serial import IncidentCommand, Op, pool_group
from gpufarm.core.service import GpuFarm
from gpufarm.core.views import Message

log = logging.getLogger(__name__)


def submit(svc: GpuFarm, command: IncidentCommand, *, group: str | None = None) -> str | None:
    """Queue the command in its incident's pool group; None when queued, else what running it now did.

    The pool is read from the incident (never from the caller), so every write to one incident shares one group.
    NotFound when the IR does not exist; UpstreamError when Datadog or the queue failed (nothing was queued).
    """
    if group is None:
        group = pool_group(svc.allocation(command.ir).environment)
    if svc.queue is None:
        return execute(svc, command)
    svc.queue.send(command.to_body(), group=group, dedup_id=command.dedup_id())
    log.info("queued %s for IR-%d in group %s", command.op.value, command.ir, group)
    return None


def request(svc: GpuFarm, gpu_request: GpuRequest, *, response_url: str | None, origin: str) -> Message | None:
    """A new request: refuse at once what can never fit, create the incident once, queue its decision.

    Returns the answer when there is one now (a refusal, a repeat of a decided request, or the decision itself
    when no queue exists); None when the decision was queued and its answer will come from the consumer.
    """
    decision = svc.precheck(gpu_request)
    if decision.verdict is Verdict.REFUSE:
        return views.refused(decision.reason)
    alloc, undecided = svc.create_request(gpu_request)
    if not undecided:
        if alloc.phase is Phase.REQUESTED and not alloc.approved_by and not alloc.slack_message:
            # A twin delivery lost the race to create: the winner queued the decision and answers.
            return None
        return views.request_created(alloc, approved=alloc.phase is not Phase.REQUESTED, reason="already requested")
    command = IncidentCommand(
        op=Op.DECIDE,
        ir=alloc.ir,
        actor=gpu_request.requester,
        response_url=response_url,
        reply_to=gpu_request.requester,
        origin=origin,
    )
    # Without a queue the decision runs now and answers through the command's reply target itself.
    submit(svc, command, group=pool_group(alloc.environment))
    return None


def execute(svc: GpuFarm, command: IncidentCommand) -> str:
    """Run one command against the incident as it is now and answer its sender; returns what it did, for the log.

    Domain refusals (not allowed, gone, not in a state for this) are answers, not failures: the message is not
    redelivered. UpstreamError propagates so the queue redelivers (each use case re-checks the phase, so a
    redelivery does not apply twice what already happened).
    """
    try:
        message, summary = _run(svc, command)
    except UpstreamError:
        raise
    except GpufarmError as exc:
        message = views.error_message(_describe(exc))
        summary = f"refused: {_describe(exc)}"
    if message is not None:
        answer(svc, command, message)
    return summary[:300]


def _run(svc: GpuFarm, cmd: IncidentCommand) -> tuple[Message | None, str]:
    actor = cmd.actor or ""
    if cmd.op in (Op.IDLE, Op.BUSY, Op.EXPIRE):
        if cmd.op is Op.IDLE:
            outcome = svc.idle_triggered(cmd.ir)
        elif cmd.op is Op.BUSY:
            outcome = svc.idle_recovered(cmd.ir)
        else:
            outcome = svc.expire(cmd.ir)
        return None, outcome.action
    if not actor:
        raise ValidationFailed("actor", f"a {cmd.op.value} command names who acts")
    if cmd.op is Op.DECIDE:
        message = svc.decide_request(cmd.ir)
    elif cmd.op is Op.APPROVE:
        message = svc.approve(cmd.ir, actor)
    elif cmd.op is Op.REJECT:
        message = svc.reject(cmd.ir, actor, cmd.reason)
    elif cmd.op is Op.RELEASE:
        message = svc.release(cmd.ir, actor)
    elif cmd.op is Op.EXTEND:
        message = svc.extend(cmd.ir, actor, cmd.days)
    elif cmd.op is Op.KEEP:
        message = svc.keep(cmd.ir, actor)
    else:
        message = svc.force_reclaim(cmd.ir, actor, cmd.reason)
    return message, message.text[:200]


def answer(svc: GpuFarm, command: IncidentCommand, message: Message) -> None:
    """Tell the command's sender: through its response_url when it has one, else by DM."""
    try:
        if command.response_url:
            svc.chat.respond(command.response_url, message.text, message.blocks or None)
        elif command.reply_to:
            svc.chat.tell_user(command.reply_to, message.text, message.blocks or None)
    except UpstreamError as exc:
        # The incident already says what happened; a lost answer must not fail (and replay) the command.
        log.warning("could not answer %s for IR-%d: %s", command.op.value, command.ir, exc)


def _describe(exc: GpufarmError) -> str:
    if isinstance(exc, ValidationFailed):
        return exc.message
    if isinstance(exc, NotAllowed | NotFound | Conflict):
        return str(exc)
    return "something went wrong inside gpufarm; the GPU operators can find the details in the function logs"
