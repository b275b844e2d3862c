"""What Slack sends the ingress (slash commands, interactivity payloads, Events API deliveries), read by bounded
plain readers, and the ingress → worker hand-off payload.

Only the fields gpufarm reads are taken; Slack adds fields over time, so extra ones are ignored. Every field is
checked for its type, length and shape (ids, URLs) before anything reads it; anything that does not fit raises
Malformed, which the ingress answers with HTTP 400, never an exception further in. No pydantic here: the ingress
reads these on every request, and the validation framework's import and model building were most of what a cold
ingress paid beyond a Bolt app (benchmarks/RESULTS.md, "Slack ingress"). The worker validates the hand-off again
with its own model (gpufarm.handlers.slack_events.Job).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufarm.handlers.http import SLACK_MAX_BODY_BYTES

USER_ID = re.compile(r"[UW][A-Z0-9]{2,20}")
CHANNEL_ID = re.compile(r"[CDG][A-Z0-9]{2,20}")
HTTP_URL = re.compile(r"https?://[^\s]{1,2000}")
MAX_ACTIONS = 10


class Malformed(ValueError):
    """A Slack body that is not what its type says; `field` names the first part that is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise Malformed(where, "must be an object")
    return value


def _text(
    data: Mapping[str, Any],
    name: str,
    *,
    default: str | None = None,
    required: bool = True,
    min_length: int = 0,
    max_length: int,
    shape: re.Pattern[str] | None = None,
) -> Any:
    """A string field of at most `max_length` characters (matching `shape` as a whole when given); `default` when
    absent, None when absent and not `required`; an explicit null only where the field is optional."""
    if name not in data:
        if default is not None:
            return default
        if required:
            raise Malformed(name, "is missing")
        return None
    value = data[name]
    if value is None and not required and default is None:
        return None
    if not isinstance(value, str):
        raise Malformed(name, "must be a string")
    if not min_length <= len(value) <= max_length:
        raise Malformed(name, f"must be {min_length}-{max_length} characters")
    if shape is not None and not shape.fullmatch(value):
        raise Malformed(name, "has the wrong shape")
    return value


def _optional(data: Mapping[str, Any], name: str, **rules: Any) -> str | None:
    value: str | None = _text(data, name, required=False, **rules)
    return value


def _kind(data: Mapping[str, Any], expected: str) -> None:
    if data.get("type") != expected:
        raise Malformed("type", f"must be {expected}")


@dataclass(frozen=True)
class SlashCommand:
    """A slash command's form fields (`application/x-www-form-urlencoded`)."""

    command: str
    text: str
    user_id: str
    channel_id: str
    response_url: str
    trigger_id: str
    team_id: str | None = None

    @classmethod
    def read(cls, form: Mapping[str, Any]) -> SlashCommand:
        """The command in `form`, or Malformed."""
        return cls(
            command=_text(form, "command", max_length=40),
            # As long as the ingress's body bound lets it be: a text past the command's own bound (2,000
            # characters) gets parse_command's ephemeral answer, where failing here would be an HTTP 400 Slack
            # shows as a failed command.
            text=_text(form, "text", default="", max_length=SLACK_MAX_BODY_BYTES),
            user_id=_text(form, "user_id", max_length=21, shape=USER_ID),
            channel_id=_text(form, "channel_id", max_length=21, shape=CHANNEL_ID),
            response_url=_text(form, "response_url", max_length=2008, shape=HTTP_URL),
            trigger_id=_text(form, "trigger_id", min_length=1, max_length=200),
            team_id=_optional(form, "team_id", max_length=40),
        )


def _user(payload: Mapping[str, Any]) -> str:
    user = _object(payload.get("user"), "user")
    value: str = _text(user, "id", max_length=21, shape=USER_ID)
    return value


@dataclass(frozen=True)
class BlockAction:
    """One clicked element."""

    action_id: str
    block_id: str | None = None
    value: str | None = None

    @classmethod
    def read(cls, data: object) -> BlockAction:
        """One element of `actions`, or Malformed."""
        action = _object(data, "actions")
        return cls(
            action_id=_text(action, "action_id", max_length=255),
            block_id=_optional(action, "block_id", max_length=255),
            value=_optional(action, "value", max_length=2000),
        )


@dataclass(frozen=True)
class Container:
    """The surface holding the clicked element."""

    type: str = "message"
    message_ts: str | None = None
    channel_id: str | None = None

    @classmethod
    def read(cls, data: object) -> Container | None:
        """`container`, None when absent or null, or Malformed."""
        if data is None:
            return None
        container = _object(data, "container")
        return cls(
            type=_text(container, "type", default="message", max_length=40),
            message_ts=_optional(container, "message_ts", max_length=40),
            channel_id=_optional(container, "channel_id", max_length=21, shape=CHANNEL_ID),
        )


@dataclass(frozen=True)
class BlockActions:
    """A button click (`block_actions`)."""

    user_id: str
    actions: tuple[BlockAction, ...]
    response_url: str | None = None
    channel_id: str | None = None
    container: Container | None = None
    trigger_id: str | None = None

    @classmethod
    def read(cls, payload: Mapping[str, Any]) -> BlockActions:
        """The click in `payload`, or Malformed."""
        _kind(payload, "block_actions")
        actions = payload.get("actions")
        if not isinstance(actions, list) or not 1 <= len(actions) <= MAX_ACTIONS:
            raise Malformed("actions", f"must be a list of 1-{MAX_ACTIONS} actions")
        channel = payload.get("channel")
        return cls(
            user_id=_user(payload),
            actions=tuple(BlockAction.read(action) for action in actions),
            response_url=_optional(payload, "response_url", max_length=2008, shape=HTTP_URL),
            channel_id=(
                None if channel is None else _text(_object(channel, "channel"), "id", max_length=21, shape=CHANNEL_ID)
            ),
            container=Container.read(payload.get("container")),
            trigger_id=_optional(payload, "trigger_id", max_length=200),
        )


@dataclass(frozen=True)
class View:
    """The parts of a modal gpufarm reads: `state.values` is block id → action id → the element's value object."""

    id: str
    callback_id: str = ""
    private_metadata: str = ""
    values: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def read(cls, data: object) -> View:
        """`view`, or Malformed."""
        view = _object(data, "view")
        return cls(
            id=_text(view, "id", min_length=1, max_length=40),
            callback_id=_text(view, "callback_id", default="", max_length=255),
            private_metadata=_text(view, "private_metadata", default="", max_length=3000),
            values=_state_values(view.get("state")),
        )


def _state_values(state: object) -> dict[str, dict[str, dict[str, Any]]]:
    if state is None:
        return {}
    values = _object(state, "view.state").get("values", {})
    blocks = _object(values, "view.state.values")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for block_id, elements in blocks.items():
        by_action = _object(elements, "view.state.values")
        out[block_id] = {}
        for action_id, element in by_action.items():
            out[block_id][action_id] = dict(_object(element, "view.state.values"))
    return out


@dataclass(frozen=True)
class ViewSubmission:
    """The modal's Submit (`view_submission`)."""

    user_id: str
    view: View

    @classmethod
    def read(cls, payload: Mapping[str, Any]) -> ViewSubmission:
        """The submission in `payload`, or Malformed."""
        _kind(payload, "view_submission")
        return cls(user_id=_user(payload), view=View.read(payload.get("view")))


@dataclass(frozen=True)
class ViewClosed:
    """The modal's Cancel (`view_closed`, sent because the modal sets notify_on_close)."""

    user_id: str
    view: View

    @classmethod
    def read(cls, payload: Mapping[str, Any]) -> ViewClosed:
        """The closed view in `payload`, or Malformed."""
        _kind(payload, "view_closed")
        return cls(user_id=_user(payload), view=View.read(payload.get("view")))


@dataclass(frozen=True)
class AppHomeOpened:
    """Slack's `app_home_opened` event: a user opened one of the app's tabs."""

    user: str
    tab: str = "home"
    channel: str | None = None

    @classmethod
    def read(cls, event: Mapping[str, Any]) -> AppHomeOpened:
        """The event, or Malformed."""
        _kind(event, "app_home_opened")
        return cls(
            user=_text(event, "user", max_length=21, shape=USER_ID),
            tab=_text(event, "tab", default="home", max_length=20),
            channel=_optional(event, "channel", max_length=21, shape=CHANNEL_ID),
        )


@dataclass(frozen=True)
class EventCallback:
    """An Events API delivery (`event_callback`); its `event` is read by its own type's reader."""

    event: Mapping[str, Any]
    event_id: str | None = None

    @classmethod
    def read(cls, payload: Mapping[str, Any]) -> EventCallback:
        """The delivery, or Malformed."""
        _kind(payload, "event_callback")
        if "event" not in payload:
            raise Malformed("event", "is missing")
        return cls(event=_object(payload["event"], "event"), event_id=_optional(payload, "event_id", max_length=100))


def url_verification_challenge(payload: Mapping[str, Any]) -> str:
    """The Events API's handshake (`url_verification`, when the Request URL is saved): its challenge."""
    _kind(payload, "url_verification")
    challenge: str = _text(payload, "challenge", min_length=1, max_length=200)
    return challenge


def job(kind: str, user: str, **fields: Any) -> dict[str, Any]:
    """What the ingress hands to the worker (gpufarm.handlers.slack_events.Job, which the worker validates):
    who asked, where to answer, and what; fields left None are left out."""
    return {"kind": kind, "user": user} | {name: value for name, value in fields.items() if value is not None}


def request_id(kind: str, unique: str) -> str:
    """Idempotency key of a Slack request: a hash of its trigger_id (command) or view id (modal)."""
    digest = hashlib.sha256(f"{kind}:{unique}".encode()).hexdigest()[:32]
    return f"slack-{kind}-{digest}"
