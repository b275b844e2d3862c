"""The Slack worker (async invoke from the ingress): do the part that touches Datadog, then answer the user.

Answers go to the command's response_url when there is one (slash commands, button clicks), else to the user
by DM (modal submissions). Domain errors become a plain sentence for the user; nothing half-done is left
because every use case reads, decides and writes the incident once. The invoke is not retried (the template's
EventInvokeConfig sets MaximumRetryAttempts 0), and a repeated invoke of a request finds its incident by
request_id instead of creating another.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpufarm.core import views
from gpufarm.core.commands import Command, Verb
from gpufarm.core.errors import GpufarmError, UpstreamError, ValidationFailed
from gpufarm.core.model import GpuRequest
from gpufarm.core.service import GpuFarm
from gpufarm.core.views import Message
from gpufarm.handlers import runtime as rt
from gpufarm.handlers import telemetry
from gpufarm.handlers.slack_events import Job

log = logging.getLogger(__name__)


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
    try:
        message = dispatch(runtime.service(), job)
        ok = True
    except GpufarmError as exc:
        if isinstance(exc, UpstreamError | rt.ConfigurationError):
            log.error("%s for %s failed: %s", job.kind, job.user, exc)  # noqa: TRY400 - message is enough
        message = views.error_message(rt.describe(exc))
        ok = False
    except Exception:
        log.exception("%s for %s failed unexpectedly", job.kind, job.user)
        message = views.error_message(rt.describe(RuntimeError()))
        ok = False
    reply(runtime, job, message)
    return {"ok": ok, "kind": job.kind, "text": message.text[:200]}


def dispatch(svc: GpuFarm, job: Job) -> Message:
    """Call the use case the job names."""
    if job.kind == "request":
        try:
            request = GpuRequest.model_validate(job.request or {})
        except ValidationError:
            raise ValidationFailed("request", "the request was malformed; please ask again") from None
        if request.requester != job.user:
            raise ValidationFailed("request", "the request names another requester")
        # Quota and pool checks read Datadog, so they happen here rather than in the ingress.
        svc.farm.environment(request.environment)
        svc.farm.team(request.team)
        return svc.submit_request(request)
    if job.kind == "action":
        return _action(svc, job)
    return _command(svc, job, Command.from_payload(job.command or {}))


def _command(svc: GpuFarm, job: Job, cmd: Command) -> Message:
    ir = cmd.ir or 0
    telemetry.correlate(ir=cmd.ir)
    if cmd.verb is Verb.STATUS:
        return svc.status(ir)
    if cmd.verb is Verb.LIST:
        return svc.list_allocations(cmd.scope.value if cmd.scope else "mine", job.user, cmd.team)
    if cmd.verb is Verb.QUOTA:
        return svc.quota(cmd.team)
    if cmd.verb is Verb.RELEASE:
        return svc.release(ir, job.user)
    if cmd.verb is Verb.EXTEND:
        return svc.extend(ir, job.user, cmd.days)
    if cmd.verb is Verb.APPROVE:
        return svc.approve(ir, job.user)
    if cmd.verb is Verb.REJECT:
        return svc.reject(ir, job.user, cmd.reason)
    if cmd.verb is Verb.RECLAIM:
        return svc.force_reclaim(ir, job.user, cmd.reason)
    return views.help_message()


def _action(svc: GpuFarm, job: Job) -> Message:
    ir = job.ir or 0
    handlers = {
        views.ACTION_APPROVE: lambda: svc.approve(ir, job.user),
        views.ACTION_REJECT: lambda: svc.reject(ir, job.user),
        views.ACTION_RELEASE: lambda: svc.release(ir, job.user),
        views.ACTION_EXTEND: lambda: svc.extend(ir, job.user),
        views.ACTION_KEEP: lambda: svc.keep(ir, job.user),
    }
    call = handlers.get(job.action or "")
    if call is None:
        raise ValidationFailed("action", "that button is not one of gpufarm's")
    return call()


def reply(runtime: rt.Runtime, job: Job, message: Message) -> None:
    """Answer the user: through the response_url when the job has one, else by DM."""
    try:
        chat = runtime.chat()
        if job.response_url:
            chat.respond(job.response_url, message.text, message.blocks or None)
        else:
            chat.tell_user(job.user, message.text, message.blocks or None)
    except GpufarmError as exc:
        # The incident already says what happened; a lost answer must not fail (and replay) the job.
        log.warning("could not answer %s: %s", job.user, exc)
