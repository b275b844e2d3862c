"""The Slack worker (async invoke from the ingress): do the part that touches Datadog, then answer the user.

Reads (status, list, quota, budget, help) are answered here. Changes to an incident are not made here: each becomes an
incident command queued in the incident's pool group (gpufarm.core.commands.executor), and the queue consumer answers
once it has run, so two actions on one incident never interleave (docs/design.md, rule 7). A new request is
refused here only when it can never fit; otherwise it becomes a create command in its pool's group (dedup id from
the Slack request id), whose consumer finds the incident by request_id or creates it and decides it, so
overlapping deliveries of one request make one incident. Answers go to the command's response_url when there is
one (slash commands, button clicks), else to the user by DM (modal submissions). The invoke is not retried (the
template's EventInvokeConfig sets MaximumRetryAttempts 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from gpufarm.adapters import time_budget
from gpufarm.core.chat import block_kit, messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.command_text import Command, Verb
from gpufarm.core.commands import executor
from gpufarm.core.config.farm import FarmConfigError
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError, ValidationFailed
from gpufarm.core.kernel.model import GpuRequest
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.leases import notices
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import runtime as rt
from gpufarm.handlers import telemetry
from gpufarm.handlers.slack_events import Job
from gpufarm.reporting.slack import report_answer

log = logging.getLogger(__name__)

# Rounds of the Slack adapter's retries an answer gets, and the pause between them (the worker has 60 s).
REPLY_ROUNDS = 2
REPLY_PAUSE_S = 1.0


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Run one hand-off; returns a small summary (logged by Lambda, asserted by tests)."""
    try:
        job = Job.model_validate(event)
    except ValidationError as exc:
        log.error("malformed worker payload: %d problem(s)", exc.error_count())  # noqa: TRY400 - no user data in logs
        return {"ok": False, "error": "malformed payload"}
    request_id = (job.request or {}).get("request_id")
    telemetry.correlate(slack_user=job.user, ir=job.ir, request_id=request_id if isinstance(request_id, str) else None)
    try:
        runtime = rt.current()
    except rt.ConfigurationError as exc:
        # No runtime, no Slack client to answer with: one line for operators, a failure for the DLQ.
        raise rt.misconfigured("slack worker", exc) from None
    if job.kind == "home":
        return _home(runtime, job.user)
    try:
        message = dispatch(runtime.service(), job)
        ok = True
    except GpufarmError as exc:
        if isinstance(exc, UpstreamError | rt.ConfigurationError | FarmConfigError):
            log.error("%s for %s failed: %s", job.kind, job.user, exc)  # noqa: TRY400 - message is enough
        message = messages.error_message(rt.describe(exc))
        ok = False
    except Exception:
        log.exception("%s for %s failed unexpectedly", job.kind, job.user)
        message = messages.error_message(rt.describe(RuntimeError()))
        ok = False
    if message is None:
        # Queued: the queue consumer answers once the command has run.
        return {"ok": ok, "kind": job.kind, "queued": True}
    # The answer may use the reserve the work left it (gpufarm.adapters.time_budget).
    with time_budget.for_answer():
        reply(runtime, job, message)
    return {"ok": ok, "kind": job.kind, "text": message.text[:200]}


def _home(runtime: rt.Runtime, user: str) -> dict[str, Any]:
    """Publish the user's App Home; a failure is logged (the next opening or change publishes again)."""
    try:
        runtime.service().publish_home(user)
    except GpufarmError as exc:
        log.warning("could not publish %s's Home: %s", user, exc)
        return {"ok": False, "kind": "home", "error": rt.describe(exc)[:200]}
    return {"ok": True, "kind": "home"}


def dispatch(svc: GpuFarm, job: Job) -> Message | None:
    """Call the use case the job names; None when a command was queued (its answer comes from the consumer)."""
    if job.kind == "request":
        try:
            request = GpuRequest.model_validate(job.request or {})
        except ValidationError:
            raise ValidationFailed("request", "the request was malformed; please ask again") from None
        if request.requester != job.user:
            raise ValidationFailed("request", "the request names another requester")
        # Quota and pool checks read Datadog, so they happen here rather than in the ingress.
        svc.context.farm.environment(request.environment)
        svc.context.farm.team(request.team)
        return executor.request(svc.context, request, response_url=job.response_url, origin=request.request_id)
    if job.kind == "action":
        return _action(svc, job)
    return _command(svc, job, Command.from_payload(job.command or {}))


def _command(svc: GpuFarm, job: Job, cmd: Command) -> Message | None:
    telemetry.correlate(ir=cmd.ir)
    answer = _ANSWERS.get(cmd.verb)
    if answer is not None:
        return answer(svc, job, cmd)
    if cmd.verb is Verb.REQUEST:
        return _request_for_my_team(svc, job, cmd)
    if cmd.verb is Verb.RESERVE:
        return _reserve(svc, job, cmd)
    ir = cmd.ir or 0
    if cmd.verb is Verb.RELEASE and not cmd.confirmed:
        # Giving GPUs back cannot be undone: the answer is a Release button Slack confirms (`now` skips it). The
        # button shows the lease, so only those who may see it get one.
        alloc = svc.visible_allocation(ir, job.user)
        return notices.release_confirm(alloc, svc.context.links_for(alloc))
    op = COMMAND_OPS.get(cmd.verb)
    if op is None:
        return messages.help_message()
    return _submit(svc, job, op, ir, days=cmd.days, reason=cmd.reason)


def _why(svc: GpuFarm, job: Job, cmd: Command) -> Message:
    # Each command's own logic is imported when it runs.
    from gpufarm.core.leases import why

    return why.why(svc.context, cmd.ir or 0, job.user)


def _quota(svc: GpuFarm, job: Job, cmd: Command) -> Message:
    if cmd.args is None:
        return svc.quota(cmd.team)
    from gpufarm.core.accounting import quota_requests  # imported when a quota change is asked

    return quota_requests.ask(svc.context, job.user, cmd.args, request_id=cmd.request_id or "")


def _calendar(svc: GpuFarm, job: Job, cmd: Command) -> Message:
    from gpufarm.core.calendar.view import calendar_answer  # imported when the calendar is asked

    return calendar_answer(svc.context, cmd.environment, cmd.gpu_model)


# The commands answered from what the worker reads, without a command to the lease's pool.
_ANSWERS: dict[Verb, Callable[[GpuFarm, Job, Command], Message]] = {
    Verb.STATUS: lambda svc, job, cmd: svc.status(cmd.ir or 0, job.user),
    Verb.WHY: _why,
    Verb.LIST: lambda svc, job, cmd: svc.list_allocations(cmd.scope.value if cmd.scope else "mine", job.user, cmd.team),
    Verb.QUOTA: _quota,
    Verb.BUDGET: lambda svc, job, cmd: svc.budget(job.user, cmd.team),
    Verb.CALENDAR: _calendar,
    Verb.REPORT: lambda svc, job, cmd: report_answer(svc.context, job.user, cmd.team),
    # Answered through the response_url, ephemeral: the token is the asker's alone (reply never posts it).
    Verb.PROFILE_TOKEN: lambda svc, job, cmd: svc.profile_token(cmd.ir or 0, job.user, upload_token_key()),
}


def upload_token_key() -> bytes:
    """The key upload tokens are signed with (`upload_token_secret`); ConfigurationMissing naming it when unset."""
    return rt.current().settings.require("upload_token_secret").encode()


def _request_for_my_team(svc: GpuFarm, job: Job, cmd: Command) -> Message | None:
    """An inline request without `team=`: the user's only team, or an answer listing their teams to choose from."""
    # One invocation's reads: the team is picked and then checked with one read of each user group.
    with svc.context.reading():
        team = svc.context.membership().team_for_request(job.user, None)
        request = build_request(
            {**(cmd.args or {}), "team": team},
            svc.context.farm,
            requester=job.user,
            channel=job.channel,
            request_id=cmd.request_id or "",
        )
        return executor.request(svc.context, request, response_url=job.response_url, origin=request.request_id)


def _reserve(svc: GpuFarm, job: Job, cmd: Command) -> Message | None:
    """A booking: the team named or the user's only one, the window validated, then decided in the pool's group."""
    from gpufarm.core.calendar.asking import build_reservation  # imported when a booking is asked

    args = cmd.args or {}
    with svc.context.reading():
        team = svc.context.membership().team_for_request(job.user, args.get("team"))
        request = build_reservation(
            {**args, "team": team},
            svc.context.farm,
            requester=job.user,
            channel=job.channel,
            request_id=cmd.request_id or "",
        )
        return executor.request(svc.context, request, response_url=job.response_url, origin=request.request_id)


def _action(svc: GpuFarm, job: Job) -> Message | None:
    op = ACTION_OPS.get(job.action or "")
    if op is None:
        raise ValidationFailed("action", "that button is not one of gpufarm's")
    return _submit(svc, job, op, job.ir or 0, days=job.days, reason=job.reason)


# The verbs and buttons that change an incident, and the incident command each one becomes.
COMMAND_OPS = {
    Verb.RELEASE: Op.RELEASE,
    Verb.EXTEND: Op.EXTEND,
    Verb.APPROVE: Op.APPROVE,
    Verb.REJECT: Op.REJECT,
    Verb.RECLAIM: Op.FORCE_RECLAIM,
    Verb.EXEMPT: Op.EXEMPT,
}
ACTION_OPS = {
    block_kit.ACTION_APPROVE: Op.APPROVE,
    block_kit.ACTION_REJECT: Op.REJECT,
    block_kit.ACTION_RELEASE: Op.RELEASE,
    block_kit.ACTION_EXTEND: Op.EXTEND,
    block_kit.ACTION_KEEP: Op.KEEP,
    block_kit.ACTION_RECLAIM: Op.FORCE_RECLAIM,
    block_kit.ACTION_EXEMPT: Op.EXEMPT,
}


def _submit(
    svc: GpuFarm, job: Job, op: Op, ir: int, *, days: int | None = None, reason: str | None = None
) -> Message | None:
    if ir < 1:
        raise ValidationFailed("ir", "say which allocation, e.g. IR-123")
    try:
        command = IncidentCommand(
            op=op,
            ir=ir,
            actor=job.user,
            days=days,
            reason=reason,
            response_url=job.response_url,
            reply_to=job.user,
            # The response_url already makes each Slack delivery unique; a click also has its message's ts.
            origin=job.message_ts or "",
        )
    except ValidationError:
        raise ValidationFailed("command", "that command's arguments are out of range") from None
    executor.submit(svc.context, command)
    return None


def reply(runtime: rt.Runtime, job: Job, message: Message) -> None:
    """Answer the user: through the response_url when the job has one, else by DM.

    Nothing redelivers a worker invoke, so an answer Slack refused through all of the adapter's bounded retries
    gets one more round after a pause (a refusal made no incident: this answer is all the user will see).
    """
    for attempt in range(1, REPLY_ROUNDS + 1):
        try:
            chat = runtime.chat()
            if job.response_url:
                chat.respond(job.response_url, message.text, message.blocks or None)
            else:
                chat.tell_user(job.user, message.text, message.blocks or None)
        except GpufarmError as exc:
            if attempt == REPLY_ROUNDS or not isinstance(exc, UpstreamError) or not time_budget.allows(REPLY_PAUSE_S):
                # The incident (if any) already says what happened; a lost answer must not fail the job.
                log.warning("could not answer %s: %s", job.user, exc)
                return
            time.sleep(REPLY_PAUSE_S)
        else:
            return
