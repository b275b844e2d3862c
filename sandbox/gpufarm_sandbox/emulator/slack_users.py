"""Simulated Slack users: the sandbox, acting as Slack, signs and POSTs real-shaped slash commands and interaction
payloads (clicks, modal submissions and closes) to the app, then applies the app's ack as Slack would."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field
from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.slack_blockkit import block_errors, decorate, view_errors
from gpufarm_sandbox.emulator.slack_dispatch import (
    ACK_DEADLINE_MS,
    Dispatch,
    check_url,
    encode_form,
    encode_payload,
    signed_post,
)
from gpufarm_sandbox.emulator.slack_workspace import (
    APP_ID,
    DEFAULT_CHANNEL,
    MAX_MESSAGES_KEPT,
    TEAM_DOMAIN,
    TEAM_ID,
    USER_RE,
    VERIFICATION_TOKEN,
    StoredView,
    StrictBody,
)
from gpufarm_sandbox.emulator.web import ApiError, json_object, json_response

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.context import SandboxContext
    from gpufarm_sandbox.emulator.slack_state import SlackState


class CommandBody(StrictBody):
    """`POST /_sandbox/slack/commands`: a user types a slash command."""

    user: str = Field(pattern=USER_RE.pattern)
    channel: str = DEFAULT_CHANNEL
    command: str = Field(default="/gpu", pattern=r"^/[a-z0-9_\-]{1,31}$")
    text: str = Field(default="", max_length=4000)
    url: str


class InteractionBody(StrictBody):
    """`POST /_sandbox/slack/interactions`: a user clicks, submits or closes."""

    type: Literal["block_actions", "view_submission", "view_closed"]
    user: str | None = Field(default=None, pattern=USER_RE.pattern)
    url: str
    channel: str | None = None
    message_ts: str | None = None
    view_id: str | None = None
    action_id: str | None = None
    block_id: str | None = None
    value: str | None = None
    values: dict[str, dict[str, Any]] = Field(default_factory=dict)


class SimulatedUsers:
    """Workspace members acting on the app: `POST /_sandbox/slack/commands` and `/_sandbox/slack/interactions`."""

    def __init__(self, context: SandboxContext, state: SlackState) -> None:
        self.ctx = context
        self.state = state

    def _record_delivery(self, kind: str, user: str, url: str, result: Dispatch) -> None:
        entry = {
            "kind": kind,
            "user": user,
            "url": url,
            "status": result.status,
            "latency_ms": result.latency_ms,
            "error": result.error,
            "late": result.latency_ms > ACK_DEADLINE_MS,
        }
        with self.ctx.lock:
            self.state.deliveries.append(entry)
            if len(self.state.deliveries) > MAX_MESSAGES_KEPT:
                del self.state.deliveries[0]

    def commands_post(self, request: Request) -> Response:
        """`POST /_sandbox/slack/commands`: a member types a slash command; answers with the app's ack."""
        body = CommandBody.model_validate(json_object(request))
        check_url(body.url)
        with self.ctx.lock:
            user = self.state.known_user(body.user)
            channel_id, channel_name = self.state.known_channel(body.channel)
            response_url = self.state.new_sink(channel_id, body.user)
            trigger_id = self.state.new_trigger(body.user)
        form = encode_form(
            [
                ("token", VERIFICATION_TOKEN),
                ("team_id", TEAM_ID),
                ("team_domain", TEAM_DOMAIN),
                ("channel_id", channel_id),
                ("channel_name", channel_name),
                ("user_id", body.user),
                ("user_name", user["name"]),
                ("command", body.command),
                ("text", body.text),
                ("api_app_id", APP_ID),
                ("is_enterprise_install", "false"),
                ("response_url", response_url),
                ("trigger_id", trigger_id),
            ]
        )
        # The app is called without holding the sandbox lock: it calls back into this sandbox while answering.
        result = signed_post(self.ctx, body.url, form)
        self._record_delivery("command", body.user, body.url, result)
        if result.status == 200 and result.latency_ms <= ACK_DEADLINE_MS:
            self._record_ack(result, channel_id, body.user, response_url)
        return json_response(
            {
                "status": result.status,
                "body": result.body,
                "latency_ms": result.latency_ms,
                "error": result.error,
                "response_url": response_url,
                "trigger_id": trigger_id,
            }
        )

    def _record_ack(self, result: Dispatch, channel: str, user: str, response_url: str) -> None:
        """A slash-command ack with content is shown to the user (ephemeral unless `in_channel`)."""
        text: str = ""
        blocks: list[dict[str, Any]] | None = None
        response_type = "ephemeral"
        parsed = result.json_body() if "json" in result.content_type.lower() else None
        if isinstance(parsed, dict):
            text = str(parsed.get("text") or "")
            raw_blocks = parsed.get("blocks")
            blocks = raw_blocks if isinstance(raw_blocks, list) and not block_errors(raw_blocks) else None
            response_type = "in_channel" if parsed.get("response_type") == "in_channel" else "ephemeral"
        elif parsed is None and result.body.strip() and "json" not in result.content_type.lower():
            text = result.body.strip()
        if not text and not blocks:
            return
        token = response_url.rsplit("/", 1)[-1]
        with self.ctx.lock:
            message = self.state.new_message("ack", channel, text, blocks, target=user, response_type=response_type)
            sink = self.state.sinks.get(token)
            if sink is not None:
                # replace_original through the command's response_url rewrites this ack, as in Slack.
                sink.last_ts = message.ts

    def interactions_post(self, request: Request) -> Response:
        """`POST /_sandbox/slack/interactions`: a member clicks, submits or closes a modal."""
        body = InteractionBody.model_validate(json_object(request))
        check_url(body.url)
        if body.type == "block_actions":
            return self._block_actions(body)
        if body.type == "view_submission":
            return self._view_submission(body)
        return self._view_closed(body)

    @staticmethod
    def _user_ref(user: dict[str, Any]) -> dict[str, Any]:
        return {"id": user["id"], "username": user["name"], "name": user["name"], "team_id": TEAM_ID}

    def _block_actions(self, body: InteractionBody) -> Response:
        if not body.action_id:
            raise ApiError(400, "block_actions needs action_id")
        with self.ctx.lock:
            if body.view_id:
                payload, user_id = self._view_click(body, body.action_id)
            else:
                payload, user_id = self._message_click(body, body.action_id)
        # The app is called without holding the sandbox lock: it calls back into this sandbox while answering.
        result = signed_post(self.ctx, body.url, encode_payload(payload))
        self._record_delivery("block_actions", user_id, body.url, result)
        out = {
            "status": result.status,
            "body": result.body,
            "latency_ms": result.latency_ms,
            "error": result.error,
            "trigger_id": payload["trigger_id"],
        }
        if "response_url" in payload:
            out["response_url"] = payload["response_url"]
        return json_response(out)

    def _message_click(self, body: InteractionBody, action_id: str) -> tuple[dict[str, Any], str]:
        """The block_actions payload for a click on a button or select in a message."""
        if not body.channel or not body.message_ts:
            raise ApiError(400, "block_actions needs channel and message_ts (or view_id)")
        channel_id, channel_name = self.state.known_channel(body.channel)
        message = self.state.find_message(channel_id, body.message_ts)
        if message is None or message.deleted:
            raise ApiError(400, f"no message {body.message_ts} in {channel_id}")
        user = self.state.known_user(body.user or "U0000000001")
        action = _find_action(message.blocks, action_id, body.block_id, body.value)
        if action is None:
            raise ApiError(400, f"message {message.ts} has no element with action_id {action_id}")
        action["action_ts"] = self.state.next_ts()
        ephemeral = message.kind in ("ephemeral", "ack", "response") and message.response_type != "in_channel"
        payload: dict[str, Any] = {
            "type": "block_actions",
            "user": self._user_ref(user),
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": {
                "type": "message",
                "message_ts": message.ts,
                "channel_id": channel_id,
                "is_ephemeral": ephemeral,
            },
            "trigger_id": self.state.new_trigger(user["id"]),
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel_id, "name": channel_name},
            "message": message.echo(),
            "state": {"values": {}},
            "response_url": self.state.new_sink(channel_id, user["id"], message.ts),
            "actions": [action],
        }
        return payload, user["id"]

    def _view_click(self, body: InteractionBody, action_id: str) -> tuple[dict[str, Any], str]:
        """The block_actions payload for a click inside an open modal (no response_url: views have none)."""
        stored = self._open_view(body.view_id)
        user = self.state.known_user(body.user or stored.user)
        action = _find_action(stored.view.get("blocks", []), action_id, body.block_id, body.value)
        if action is None:
            raise ApiError(400, f"view {stored.id} has no element with action_id {action_id}")
        action["action_ts"] = self.state.next_ts()
        payload: dict[str, Any] = {
            "type": "block_actions",
            "user": self._user_ref(user),
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": {"type": "view", "view_id": stored.id},
            "trigger_id": self.state.new_trigger(user["id"]),
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "enterprise": None,
            "is_enterprise_install": False,
            "view": stored.to_json(),
            "actions": [action],
        }
        return payload, user["id"]

    def _open_view(self, view_id: str | None) -> StoredView:
        stored = self.state.views.get(view_id or "")
        if stored is None:
            raise ApiError(400, f"no view {view_id}")
        if stored.status != "open":
            raise ApiError(400, f"view {view_id} is closed")
        return stored

    def _view_submission(self, body: InteractionBody) -> Response:
        with self.ctx.lock:
            stored = self._open_view(body.view_id)
            user = self.state.known_user(body.user or stored.user)
            values = _state_values(stored.view, body.values)
            missing = _missing_required(stored.view, values)
            if missing:
                # Slack's client refuses to submit a modal with an empty required input.
                raise ApiError(400, f"required inputs are empty: {', '.join(missing)}")
            stored.state_values = values
            response_urls = []
            for block_id, action_id, channel in _response_url_inputs(stored.view, values):
                response_urls.append(
                    {
                        "block_id": block_id,
                        "action_id": action_id,
                        "channel_id": channel,
                        "response_url": self.state.new_sink(channel, user["id"]),
                    }
                )
            trigger_id = self.state.new_trigger(user["id"])
            payload = {
                "type": "view_submission",
                "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
                "user": self._user_ref(user),
                "api_app_id": APP_ID,
                "token": VERIFICATION_TOKEN,
                "trigger_id": trigger_id,
                "view": stored.to_json(),
                "response_urls": response_urls,
                "is_enterprise_install": False,
                "enterprise": None,
            }
        result = signed_post(self.ctx, body.url, encode_payload(payload))
        self._record_delivery("view_submission", user["id"], body.url, result)
        with self.ctx.lock:
            outcome = self._apply_view_ack(stored, result)
            view = stored.inspect()
        return json_response(
            {
                "status": result.status,
                "body": result.body,
                "latency_ms": result.latency_ms,
                "error": result.error,
                "trigger_id": trigger_id,
                "outcome": outcome,
                "view": view,
                "response_urls": response_urls,
            }
        )

    def _apply_view_ack(self, stored: StoredView, result: Dispatch) -> str:
        """What Slack does with a view_submission ack: close, show errors, update, push or clear."""
        if result.status != 200 or result.latency_ms > ACK_DEADLINE_MS:
            return "failed"  # the modal stays open and shows Slack's generic error
        if not result.body.strip():
            stored.status = "closed"
            return "closed"
        ack = result.json_body()
        if not isinstance(ack, dict):
            return "failed"  # not an ack Slack understands: the modal stays open with an error
        action = ack.get("response_action")
        if action == "errors" and isinstance(ack.get("errors"), dict):
            return _show_errors(stored, ack["errors"])
        if action in ("update", "push"):
            view = ack.get("view")
            if not isinstance(view, dict) or view_errors(view):
                return "failed"
            return self._update_view(stored, view) if action == "update" else self._push_view(stored, view)
        if action == "clear":
            for view_obj in self.state.views.values():
                if view_obj.root_view_id == stored.root_view_id:
                    view_obj.status = "closed"
            return "cleared"
        # Any other body on a view_submission is an invalid ack: Slack keeps the modal open with an error.
        return "failed"

    def _update_view(self, stored: StoredView, view: dict[str, Any]) -> str:
        stored.view = copy.deepcopy(decorate(view))
        stored.hash = self.state.new_hash()
        stored.errors = {}
        stored.state_values = {}
        return "updated"

    def _push_view(self, stored: StoredView, view: dict[str, Any]) -> str:
        new_id = self.state.next_view_id()
        self.state.views[new_id] = StoredView(
            new_id,
            stored.user,
            copy.deepcopy(decorate(view)),
            self.state.new_hash(),
            stored.root_view_id,
            previous_view_id=stored.id,
        )
        return "pushed"

    def _view_closed(self, body: InteractionBody) -> Response:
        with self.ctx.lock:
            stored = self._open_view(body.view_id)
            user = self.state.known_user(body.user or stored.user)
            stored.status = "closed"
            if not stored.view.get("notify_on_close"):
                # Slack only tells the app when the view asked for it.
                return json_response({"status": None, "sent": False, "view": stored.inspect()})
            payload = {
                "type": "view_closed",
                "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
                "user": self._user_ref(user),
                "api_app_id": APP_ID,
                "token": VERIFICATION_TOKEN,
                "view": stored.to_json(),
                "is_cleared": False,
                "is_enterprise_install": False,
                "enterprise": None,
            }
        result = signed_post(self.ctx, body.url, encode_payload(payload))
        self._record_delivery("view_closed", user["id"], body.url, result)
        return json_response(
            {
                "status": result.status,
                "body": result.body,
                "latency_ms": result.latency_ms,
                "error": result.error,
                "sent": True,
            }
        )


def _show_errors(stored: StoredView, errors: dict[Any, Any]) -> str:
    """A `response_action: errors` ack: shown on the view's input blocks, or a failure for any other key."""
    inputs = {b.get("block_id") for b in stored.view.get("blocks", []) if b.get("type") == "input"}
    if not errors or not set(errors) <= inputs:
        # Slack rejects errors keyed by anything but the view's input block_ids.
        return "failed"
    stored.errors = {str(k): str(v) for k, v in errors.items()}
    return "errors"


def _elements(blocks: Iterable[Any]) -> Iterable[tuple[str | None, dict[str, Any]]]:
    for block in blocks:
        if not isinstance(block, dict):
            continue
        block_id = block.get("block_id")
        candidates: list[Any] = []
        if block.get("type") == "actions":
            candidates = list(block.get("elements") or [])
        elif block.get("type") == "section" and "accessory" in block:
            candidates = [block["accessory"]]
        elif block.get("type") == "input" and "element" in block:
            candidates = [block["element"]]
        for element in candidates:
            if isinstance(element, dict):
                yield block_id, element


def _find_action(
    blocks: Iterable[Any], action_id: str, block_id: str | None, value: str | None
) -> dict[str, Any] | None:
    """The `actions[0]` object Slack sends for a click on an element (button, select) of a message or view."""
    for found_block, element in _elements(blocks):
        if element.get("action_id") != action_id or (block_id and found_block != block_id):
            continue
        kind = element.get("type", "button")
        action: dict[str, Any] = {"action_id": action_id, "block_id": found_block}
        if kind == "button":
            action["text"] = element.get("text")
            action["value"] = value if value is not None else element.get("value", "")
            if "style" in element:
                action["style"] = element["style"]
        elif kind in ("static_select", "external_select"):
            option = _option(element, value)
            if option is None:
                return None
            action["selected_option"] = option
        elif value is not None:
            action["value"] = value
        action["type"] = kind
        return action
    return None


def _option(element: dict[str, Any], value: str | None) -> dict[str, Any] | None:
    for option in element.get("options") or []:
        if isinstance(option, dict) and (value is None or option.get("value") == value):
            return {"text": option.get("text"), "value": option.get("value")}
    return None


def _state_values(view: dict[str, Any], given: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`view.state.values`: given state objects as they are; plain strings turned into each element's state shape."""
    inputs = {
        (b.get("block_id"), b["element"].get("action_id")): b["element"]
        for b in view.get("blocks", [])
        if isinstance(b, dict) and b.get("type") == "input" and isinstance(b.get("element"), dict)
    }
    values: dict[str, Any] = {}
    for block_id, actions in given.items():
        for action_id, state in actions.items():
            element = inputs.get((block_id, action_id))
            if element is None:
                raise ApiError(400, f"the view has no input {block_id}/{action_id}")
            values.setdefault(block_id, {})[action_id] = _state_of(element, state)
    return values


def _state_of(element: dict[str, Any], state: Any) -> dict[str, Any]:
    kind = str(element.get("type"))
    if isinstance(state, dict):
        return {"type": kind, **state}
    if state is not None and not isinstance(state, str):
        state = str(state)
    if kind in ("static_select", "external_select"):
        option = _option(element, state) if state else None
        if state and option is None:
            raise ApiError(400, f"{element.get('action_id')}: no option {state!r}")
        return {"type": kind, "selected_option": option}
    if kind == "conversations_select":
        return {"type": kind, "selected_conversation": state}
    if kind == "channels_select":
        return {"type": kind, "selected_channel": state}
    if kind == "users_select":
        return {"type": kind, "selected_user": state}
    if kind == "datepicker":
        return {"type": kind, "selected_date": state}
    return {"type": kind, "value": state}


def _has_value(state: dict[str, Any]) -> bool:
    return any(
        state.get(key)
        for key in (
            "value",
            "selected_option",
            "selected_options",
            "selected_conversation",
            "selected_channel",
            "selected_user",
            "selected_users",
            "selected_date",
        )
    )


def _missing_required(view: dict[str, Any], values: dict[str, Any]) -> list[str]:
    missing = []
    for block in view.get("blocks", []):
        if not isinstance(block, dict) or block.get("type") != "input" or block.get("optional"):
            continue
        element = block.get("element")
        action_id = element.get("action_id") if isinstance(element, dict) else None
        state = values.get(str(block.get("block_id")), {}).get(str(action_id), {})
        if not _has_value(state):
            missing.append(str(block.get("block_id")))
    return missing


def _response_url_inputs(view: dict[str, Any], values: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Inputs with `response_url_enabled` that have a channel chosen: each gets a response_url in the payload."""
    out = []
    for block in view.get("blocks", []):
        element = block.get("element") if isinstance(block, dict) else None
        if not isinstance(element, dict) or not element.get("response_url_enabled"):
            continue
        state = values.get(block.get("block_id"), {}).get(element.get("action_id"), {})
        channel = state.get("selected_conversation") or state.get("selected_channel")
        if channel:
            out.append((str(block.get("block_id")), str(element.get("action_id")), str(channel)))
    return out
