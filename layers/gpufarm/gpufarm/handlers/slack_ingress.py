"""The Slack ingress (Function URL): verify, answer inside 3 seconds, hand the slow part to slack_worker.

Order matters: `ssl_check` pings are answered before the signature check (Slack may send them unsigned, as Bolt
handles them); every other request must carry a valid, fresh signature or gets 401 and nothing happens. A bare
`/gpu request` opens the modal here, because its trigger_id expires after 3 seconds. Everything that touches
Datadog goes to the worker through the async invoker. This module never imports datadog_api_client
(tests/unit/test_ingress_imports.py checks it in a fresh process).

What a request needs is imported when it runs, not with this module: a click, a `/gpu release` or a forged
request never loads the farm's models, the request model or the message builders; an inline `/gpu request`
loads the farm and the policy (to answer a bad request at once), the form loads the modal. Slack's inputs are
read by plain bounded readers (slack_inputs), not pydantic models. A command the ingress only hands off needs
nothing here but its verb in command_text and a line in _working_text; one that must answer from the farm at
once imports what it uses inside its own function, as _inline_request does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from gpufarm.core.chat import reason_form, replies
from gpufarm.core.chat.actions import ACTIONS
from gpufarm.core.chat.command_text import Command, Verb, parse_command
from gpufarm.core.chat.escape import inert
from gpufarm.core.kernel import bounded
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError, ValidationFailed
from gpufarm.core.kernel.ir import parse_ir
from gpufarm.handlers import http, snapstart, telemetry
from gpufarm.handlers import runtime as rt
from gpufarm.handlers.slack_inputs import (
    AppHomeOpened,
    BlockActions,
    EventCallback,
    Malformed,
    SlashCommand,
    ViewClosed,
    ViewSubmission,
    job,
    request_id,
    url_verification_challenge,
)

if TYPE_CHECKING:
    from gpufarm.core.config.farm import FarmConfig
    from gpufarm.core.kernel.model import GpuRequest

log = logging.getLogger(__name__)

# The AWS services a cold request calls: SSM (the secret and the farm YAML in one call) and Lambda (the hand-off).
COLD_PATH_SERVICES = ("ssm", "lambda")

SLASH_COMMAND = "/gpu"
# Errors shown under a modal field name an input block (modal.FORM_BLOCKS); these others land on the first one.
_OTHER_FIELD_BLOCK = {"request": "project", "text": "project"}


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Answer one Slack request (slash command or interactivity payload)."""
    try:
        if not http.is_url_event(event):
            return http.error(400, "not a Function URL event")
        if http.method(event) != "POST":
            return http.error(405, "Slack requests are POSTs")
        body = http.raw_body(event, http.SLACK_MAX_BODY_BYTES)
        headers = http.headers(event)
        if _is_json(headers):
            return _event(body, headers)
        form = _form(body)
        if form.get("ssl_check") == "1":
            return http.respond(200)
        runtime = rt.current()
        if not runtime.signature_check().verify(body, headers):
            log.warning("rejected a Slack request with a missing, forged or stale signature")
            return http.error(401, "invalid signature")
        retry = _retry(headers)
        if "payload" in form:
            answer = _interaction(runtime, form["payload"])
        elif "command" in form:
            answer = _slash_command(runtime, form)
        else:
            return http.error(400, "neither a slash command nor an interactivity payload")
        return _no_more_retries(answer) if retry else answer
    except http.BadRequest as exc:
        return http.error(exc.status, exc.reason)
    except rt.ConfigurationError as exc:
        # One line naming what is missing (never a value); the caller learns nothing of the deployment.
        log.error("slack ingress misconfigured: %s", exc)  # noqa: TRY400 - no traceback for a missing setting
        return http.error(500, "gpufarm is not configured")
    except UpstreamError as exc:
        log.error("slack ingress could not read its configuration: %s", exc)  # noqa: TRY400
        return http.error(503, "gpufarm is unavailable")


def _before_snapshot() -> None:
    rt.prepare_for_snapshot(COLD_PATH_SERVICES)


# SnapStart (template.yaml): clients and modules go into the snapshot; secrets and the farm are read after restore.
snapstart.register(before_snapshot=_before_snapshot, after_restore=rt.after_restore)


# -- slash commands ---------------------------------------------------------------------------------------------


def _slash_command(runtime: rt.Runtime, form: dict[str, str]) -> dict[str, Any]:
    try:
        cmd_form = SlashCommand.read(form)
    except Malformed:
        return http.error(400, "malformed slash command")
    if cmd_form.command != SLASH_COMMAND:
        return _ephemeral(f"gpufarm only answers {SLASH_COMMAND}, not {cmd_form.command[:20]}")
    try:
        command = parse_command(cmd_form.text)
    except ValidationFailed as exc:
        return _ephemeral(replies.error_text(exc.message) + "\nTry `/gpu help`.")
    telemetry.correlate(slack_user=cmd_form.user_id, ir=command.ir)
    if command.verb is Verb.HELP:
        return _ephemeral(replies.help_text(command.unknown))
    if command.opens_modal:
        return _open_modal(runtime, cmd_form)
    if command.verb is Verb.REQUEST:
        return _inline_request(runtime, cmd_form, command)
    if command.verb is Verb.QUOTA and command.args is not None:
        # A quota change: the trigger_id names it, so Slack's retry of the same command creates one override.
        command = replace(command, request_id=request_id("quota", cmd_form.trigger_id))
    return _hand_off_command(runtime, _command_job(cmd_form, command), _working_text(command))


def _open_modal(runtime: rt.Runtime, form: SlashCommand) -> dict[str, Any]:
    from gpufarm.core.chat import modal

    try:
        view = modal.request_modal(runtime.farm(), channel=form.channel_id)
        runtime.ingress_chat().open_view(form.trigger_id, view)
    except rt.ConfigurationError:
        raise
    except UpstreamError as exc:
        log.warning("views.open failed: %s", exc)
        return _ephemeral(
            "I could not open the request form in time. Try again, or use the inline form: "
            "`/gpu request 8 H100 project=... team=... env=...`"
        )
    except GpufarmError as exc:
        return _ephemeral(replies.error_text(rt.describe(exc)))
    return http.respond(200)


def _inline_request(runtime: rt.Runtime, form: SlashCommand, command: Command) -> dict[str, Any]:
    if not (command.args or {}).get("team") and _checks_membership(runtime):
        # Which team is the user's only one is Slack's to say (user groups): the worker picks it or asks.
        return _teamless_request(runtime, form, command)
    try:
        request = _slash_request(command.args or {}, runtime.farm(), form)
    except rt.ConfigurationError:
        raise
    except GpufarmError as exc:
        return _ephemeral(replies.error_text(rt.describe(exc)))
    telemetry.correlate(request_id=request.request_id)
    handed = job(
        "request",
        form.user_id,
        channel=form.channel_id,
        response_url=form.response_url,
        request=request.model_dump(mode="json"),
    )
    what = f"{request.gpu_count}x {request.gpu_model} in {request.environment} for {request.team}/{request.project}"
    return _hand_off_command(runtime, handed, f"Requesting {what}…")


def _checks_membership(runtime: rt.Runtime) -> bool:
    try:
        return runtime.farm().membership_checked
    except rt.ConfigurationError:
        raise
    except GpufarmError:
        return False  # the request's own validation below says what is wrong with the farm


def _teamless_request(runtime: rt.Runtime, form: SlashCommand, command: Command) -> dict[str, Any]:
    """Validate all but the team here (at once, with team left to the worker), then hand the command over."""
    args = dict(command.args or {})
    try:
        farm = runtime.farm()
        # Any team stands in for the check of the other fields; the worker validates again with the real one.
        _slash_request({**args, "team": next(iter(sorted(farm.teams)), "")}, farm, form)
    except rt.ConfigurationError:
        raise
    except GpufarmError as exc:
        if not (isinstance(exc, ValidationFailed) and exc.field in ("team", "duration_days")):
            return _ephemeral(replies.error_text(rt.describe(exc)))
    handed = Command(Verb.REQUEST, args=args, request_id=request_id("cmd", form.trigger_id))
    return _hand_off_command(runtime, _command_job(form, handed), "Requesting GPUs for your team…")


def _slash_request(values: Mapping[str, str | None], farm: FarmConfig, form: SlashCommand) -> GpuRequest:
    from gpufarm.core.governance.policy import build_request

    # The trigger_id names the request, so Slack's retry of the same command maps to the same request id.
    return build_request(
        values,
        farm,
        requester=form.user_id,
        channel=form.channel_id,
        request_id=request_id("cmd", form.trigger_id),
    )


def _command_job(form: SlashCommand, command: Command) -> dict[str, Any]:
    return job(
        "command",
        form.user_id,
        channel=form.channel_id,
        response_url=form.response_url,
        command=command.to_payload(),
    )


def _working_text(command: Command) -> str:
    target = f" IR-{command.ir}" if command.ir else ""
    return {
        Verb.RELEASE: f"Releasing{target}…",
        Verb.EXTEND: f"Extending{target}…",
        Verb.APPROVE: f"Approving{target}…",
        Verb.REJECT: f"Rejecting{target}…",
        Verb.RECLAIM: f"Reclaiming{target}…",
    }.get(command.verb, "Looking that up…")


# -- interactivity ----------------------------------------------------------------------------------------------


def _interaction(runtime: rt.Runtime, raw: str) -> dict[str, Any]:
    try:
        payload = bounded.loads(raw, max_bytes=http.SLACK_MAX_BODY_BYTES)
    except bounded.BadJson as exc:
        return http.error(400, f"payload is {exc.reason}")
    if not isinstance(payload, dict):
        return http.error(400, "payload must be an object")
    kind = payload.get("type")
    try:
        if kind == "block_actions":
            return _block_actions(runtime, BlockActions.read(payload))
        if kind == "view_submission":
            return _view_submission(runtime, ViewSubmission.read(payload))
        if kind == "view_closed":
            closed = ViewClosed.read(payload)
            log.info("request form %s closed by %s", closed.view.id, closed.user_id)
            return http.respond(200)
    except Malformed:
        return http.error(400, f"malformed {kind} payload")
    return http.error(400, "unsupported interactivity payload type")


def _block_actions(runtime: rt.Runtime, payload: BlockActions) -> dict[str, Any]:
    action = payload.actions[0]
    if action.action_id not in ACTIONS:
        log.info("ignored click on %s", action.action_id[:60])
        return http.respond(200)
    try:
        ir = parse_ir(action.value or "")
    except ValidationFailed:
        return http.error(400, "the button carries no incident number")
    telemetry.correlate(slack_user=payload.user_id, ir=ir)
    if action.action_id in reason_form.FORMS:
        # Reject, Reclaim and Exempt take a reason: the click opens the form, its submission acts.
        return _open_reason_form(runtime, payload, action.action_id, ir)
    container = payload.container
    channel = payload.channel_id or (container.channel_id if container else None)
    handed = job(
        "action",
        payload.user_id,
        channel=channel,
        response_url=payload.response_url,
        action=action.action_id,
        ir=ir,
        message_ts=container.message_ts if container else None,
    )
    # Slack shows no body for a click, so a failed hand-off can only be its status.
    return _hand_off(runtime, handed, http.respond(200), http.error(503, "gpufarm is unavailable; nothing was changed"))


def _open_reason_form(runtime: rt.Runtime, payload: BlockActions, action_id: str, ir: int) -> dict[str, Any]:
    if not payload.trigger_id:
        return http.error(400, "the click carries no trigger_id")
    try:
        runtime.ingress_chat().open_view(payload.trigger_id, reason_form.modal(action_id, ir))
    except rt.ConfigurationError:
        raise
    except GpufarmError as exc:
        log.warning("views.open failed for the reason form: %s", exc)
        verb = reason_form.FORMS[action_id].submit.lower()
        if payload.response_url:
            try:
                runtime.ingress_chat().respond(
                    payload.response_url,
                    inert(f"I could not open the form in time; use `/gpu {verb} IR-{ir} <reason>`."),
                )
            except GpufarmError:
                log.warning("could not tell %s the reason form failed", payload.user_id)
    return http.respond(200)


def _reason_submitted(runtime: rt.Runtime, payload: ViewSubmission) -> dict[str, Any]:
    view = payload.view
    try:
        form = reason_form.read(view.values, view.private_metadata)
    except ValidationFailed as exc:
        block = exc.field if exc.field in (reason_form.REASON_BLOCK, reason_form.DAYS_BLOCK) else "reason"
        return _field_error(block, exc.message)
    telemetry.correlate(slack_user=payload.user_id, ir=form.ir)
    handed = job("action", payload.user_id, action=form.action, ir=form.ir, reason=form.reason, days=form.days)
    return _hand_off(runtime, handed, http.respond(200), _field_error("reason", _MODAL_UNAVAILABLE))


def _view_submission(runtime: rt.Runtime, payload: ViewSubmission) -> dict[str, Any]:
    from gpufarm.core.chat import modal
    from gpufarm.core.governance.policy import build_request

    view = payload.view
    if view.callback_id == reason_form.REASON_CALLBACK:
        return _reason_submitted(runtime, payload)
    if view.callback_id != modal.REQUEST_CALLBACK:
        return http.error(400, "unknown view")
    values = modal.form_values(view.values)
    try:
        request = build_request(
            values,
            runtime.farm(),
            requester=payload.user_id,
            channel=_metadata_channel(view.private_metadata),
            request_id=request_id("view", view.id),
        )
    except ValidationFailed as exc:
        block = exc.field if exc.field in modal.FORM_BLOCKS else _OTHER_FIELD_BLOCK.get(exc.field, "project")
        return _field_error(block, exc.message)
    except rt.ConfigurationError:
        raise
    except GpufarmError as exc:
        return _field_error("project", rt.describe(exc))
    telemetry.correlate(slack_user=payload.user_id, request_id=request.request_id)
    handed = job("request", payload.user_id, channel=request.channel, request=request.model_dump(mode="json"))
    return _hand_off(runtime, handed, http.respond(200), _field_error("project", _MODAL_UNAVAILABLE))


# -- events -------------------------------------------------------------------------------------------------------


def _is_json(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").split(";")[0].strip().lower() == "application/json"


def _event(body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    """An Events API delivery, signed like every other Slack request: the URL handshake is answered here;
    `app_home_opened` hands the Home to the worker (it reads Datadog); any other event is acknowledged, ignored."""
    runtime = rt.current()
    if not runtime.signature_check().verify(body, headers):
        log.warning("rejected a Slack event with a missing, forged or stale signature")
        return http.error(401, "invalid signature")
    try:
        payload = bounded.loads(body, max_bytes=http.SLACK_MAX_BODY_BYTES)
    except bounded.BadJson as exc:
        return http.error(400, f"event is {exc.reason}")
    if not isinstance(payload, dict):
        return http.error(400, "event must be an object")
    kind = payload.get("type")
    try:
        if kind == "url_verification":
            return http.respond(200, {"challenge": url_verification_challenge(payload)})
        if kind != "event_callback":
            return http.error(400, "unsupported event delivery type")
        callback = EventCallback.read(payload)
        if callback.event.get("type") != "app_home_opened":
            log.info("ignored a %s event", str(callback.event.get("type"))[:40])
            return http.respond(200)
        opened = AppHomeOpened.read(callback.event)
    except Malformed:
        return http.error(400, f"malformed {str(kind)[:40]} event")
    if opened.tab != "home":
        return http.respond(200)  # the Messages tab: nothing to publish
    telemetry.correlate(slack_user=opened.user)
    return _hand_off(runtime, job("home", opened.user), http.respond(200), http.error(503, "gpufarm is unavailable"))


# -- helpers ----------------------------------------------------------------------------------------------------


_MODAL_UNAVAILABLE = "gpufarm is unavailable; try again"


def _hand_off(
    runtime: rt.Runtime, payload: dict[str, Any], handed: dict[str, Any], unavailable: dict[str, Any]
) -> dict[str, Any]:
    """Give the job to the worker and answer `handed`, or `unavailable` when the hand-off failed.

    Every path that acts hands off here, so a failed invoke is logged once and changes nothing; each caller
    chooses the answer Slack shows where that request came from (an ephemeral line, a status, a field error).
    """
    try:
        runtime.invoker().invoke(runtime.worker_function(), payload)
    except UpstreamError as exc:
        log.error("hand-off to the worker failed: %s", exc)  # noqa: TRY400 - the adapter's message says it all
        return unavailable
    return handed


def _hand_off_command(runtime: rt.Runtime, payload: dict[str, Any], working: str) -> dict[str, Any]:
    # A slash command's answer is an ephemeral line: what is being done, or that nothing was.
    unavailable = _ephemeral(replies.error_text("gpufarm is unavailable right now; nothing was changed"))
    return _hand_off(runtime, payload, _ephemeral(replies.working_text(working)), unavailable)


def _field_error(block: str, message: str) -> dict[str, Any]:
    # A modal's error names one input block (Slack shows it under that field and keeps the form open).
    return http.respond(200, {"response_action": "errors", "errors": {block: message[:150]}})


def _ephemeral(text: str) -> dict[str, Any]:
    return http.respond(200, {"response_type": "ephemeral", "text": text})


def _form(body: bytes) -> dict[str, str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise http.BadRequest("body is not UTF-8") from None
    try:
        parsed = parse_qs(text, keep_blank_values=True, strict_parsing=bool(text), max_num_fields=64)
    except ValueError:
        raise http.BadRequest("body is not form-encoded") from None
    return {k: v[-1] for k, v in parsed.items()}


RETRY_NUM_HEADER = "x-slack-retry-num"
RETRY_REASON_HEADER = "x-slack-retry-reason"


def _retry(headers: Mapping[str, str]) -> int:
    """Slack's retry number of this delivery (0 for a first delivery), logged with Slack's reason.

    A retry is the same signed body again, so it carries the original's trigger_id, view id or response_url:
    the request id (slack_events.request_id) and the incident commands' dedup ids come out the same, and the
    worker finds the incident the first delivery created instead of making another.
    """
    raw = headers.get(RETRY_NUM_HEADER)
    if raw is None:
        return 0
    try:
        number = bounded.whole_number(raw, "retry", "the retry number", minimum=0, maximum=100)
    except ValidationFailed:
        number = 1  # a garbled retry header still says Slack is re-sending
    reason = bounded.printable(headers.get(RETRY_REASON_HEADER, "unknown"))
    log.info("Slack retry %d of this request (%s); it maps to the original's request id", number, reason)
    return number


def _no_more_retries(answer: dict[str, Any]) -> dict[str, Any]:
    # The retry is answered like the original; Slack need not send a third copy of what now has an answer.
    if answer.get("statusCode") == 200:
        answer["headers"] = {**answer.get("headers", {}), "X-Slack-No-Retry": "1"}
    return answer


def _metadata_channel(metadata: str) -> str | None:
    try:
        value = bounded.loads(metadata, max_bytes=http.SLACK_MAX_BODY_BYTES) if metadata else {}
    except bounded.BadJson:
        return None
    channel = value.get("channel") if isinstance(value, dict) else None
    return channel if isinstance(channel, str) and channel[:1] in ("C", "D", "G") and channel.isalnum() else None
