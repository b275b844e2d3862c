"""Sandbox module: the Slack Web API methods gpufarm calls, response_url sinks, and simulated Slack users.

Answer shapes follow the contract fixtures (tests/fixtures/slack, copied from contracts/slack). Errors are HTTP 200
`{"ok": false, "error": ...}` as Slack sends them; 429 comes from the sandbox's fault injection. Simulated users
(`POST /_sandbox/slack/commands` and `/interactions`) sign and POST real-shaped slash commands and interaction payloads
to the app, so the app's ingress is exercised exactly as Slack would exercise it.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, quote_plus, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field
from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, form_or_json, json_object, json_response, slack_error

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox

# The fake workspace every contract fixture uses.
TEAM_ID = "T0000000001"
TEAM_DOMAIN = "fake-workspace"
TEAM_NAME = "Fake Workspace"
APP_ID = "A0000000001"
BOT_ID = "B0000000001"
BOT_USER = "U0000000009"
BOT_NAME = "gpu-bot"
VERIFICATION_TOKEN = "fake-verification-token"
DEFAULT_CHANNEL = "C0000000001"
DEFAULT_USERGROUP = "S0000000001"

TRIGGER_TTL_S = 3.0  # trigger_id lives 3 s and works once
RESPONSE_URL_USES = 5  # response_url: at most 5 uses within 30 minutes
RESPONSE_URL_TTL_S = 1800.0
ACK_DEADLINE_MS = 3000  # Slack shows "operation_timeout" after 3 s
DISPATCH_TIMEOUT_S = 10.0
MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_VIEW_BYTES = 250_000
MAX_TEXT = 40_000
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_VIEW_TITLE = 24
MAX_PRIVATE_METADATA = 3000
MAX_MESSAGES_KEPT = 10_000

TRIGGER_RE = re.compile(r"^\d+\.\d+\.[0-9a-f]+$")
USER_RE = re.compile(r"^[UW][A-Z0-9]{2,20}$")
CHANNEL_RE = re.compile(r"^[CGD][A-Z0-9]{2,20}$")
USERGROUP_RE = re.compile(r"^S[A-Z0-9]{2,20}$")

BLOCK_TYPES = frozenset(
    {"section", "divider", "image", "actions", "context", "input", "header", "rich_text", "file", "video", "markdown"}
)
ELEMENT_TYPES = frozenset(
    {
        "button",
        "checkboxes",
        "datepicker",
        "datetimepicker",
        "email_text_input",
        "image",
        "multi_static_select",
        "multi_external_select",
        "multi_users_select",
        "multi_conversations_select",
        "multi_channels_select",
        "number_input",
        "overflow",
        "plain_text_input",
        "radio_buttons",
        "rich_text_input",
        "static_select",
        "external_select",
        "users_select",
        "conversations_select",
        "channels_select",
        "timepicker",
        "url_text_input",
        "file_input",
        "workflow_button",
    }
)
TEXT_TYPES = frozenset({"plain_text", "mrkdwn"})
BOT_PROFILE = {
    "id": BOT_ID,
    "app_id": APP_ID,
    "name": BOT_NAME,
    "icons": {
        "image_36": "https://a.slack-edge.com/80588/img/plugins/app/bot_36.png",
        "image_48": "https://a.slack-edge.com/80588/img/plugins/app/bot_48.png",
        "image_72": "https://a.slack-edge.com/80588/img/plugins/app/service_72.png",
    },
    "deleted": False,
    "team_id": TEAM_ID,
}


class SlackFailure(Exception):
    """Raised inside a Web API method: answered as Slack's `{"ok": false, "error": code, ...extra}` with HTTP 200."""

    def __init__(self, code: str, **extra: Any) -> None:
        super().__init__(code)
        self.code = code
        self.extra = extra


# -- Block Kit checks ------------------------------------------------------------------------------------------------


def _text_object_errors(obj: Any, pointer: str, *, limit: int, plain_only: bool = False) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in (("plain_text",) if plain_only else TEXT_TYPES):
        return [f"failed to match all allowed schemas [json-pointer:{pointer}]"]
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return [f"must be a non-empty string [json-pointer:{pointer}/text]"]
    if len(text) > limit:
        return [f"must be less than {limit + 1} characters [json-pointer:{pointer}/text]"]
    return []


def _element_errors(element: Any, pointer: str) -> list[str]:
    if not isinstance(element, dict) or element.get("type") not in ELEMENT_TYPES:
        return [f"failed to match all allowed schemas [json-pointer:{pointer}]"]
    action_id = element.get("action_id")
    if action_id is not None and (not isinstance(action_id, str) or len(action_id) > 255):
        return [f"must be a string of at most 255 characters [json-pointer:{pointer}/action_id]"]
    if element["type"] == "button":
        return _text_object_errors(element.get("text"), f"{pointer}/text", limit=75, plain_only=True)
    return []


def _section_errors(block: dict[str, Any], pointer: str) -> list[str]:
    errors: list[str] = []
    if "text" not in block and "fields" not in block:
        errors.append(f"must provide either text or fields [json-pointer:{pointer}]")
    if "text" in block:
        errors += _text_object_errors(block["text"], f"{pointer}/text", limit=MAX_SECTION_TEXT)
    fields = block.get("fields")
    if fields is not None:
        if not isinstance(fields, list) or len(fields) > 10:
            errors.append(f"must be an array of at most 10 items [json-pointer:{pointer}/fields]")
        else:
            for i, item in enumerate(fields):
                errors += _text_object_errors(item, f"{pointer}/fields/{i}", limit=2000)
    if "accessory" in block:
        errors += _element_errors(block["accessory"], f"{pointer}/accessory")
    return errors


def _header_errors(block: dict[str, Any], pointer: str) -> list[str]:
    return _text_object_errors(block.get("text"), f"{pointer}/text", limit=MAX_HEADER_TEXT, plain_only=True)


def _actions_errors(block: dict[str, Any], pointer: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements or len(elements) > 25:
        return [f"must be an array of 1 to 25 items [json-pointer:{pointer}/elements]"]
    return [e for i, element in enumerate(elements) for e in _element_errors(element, f"{pointer}/elements/{i}")]


def _context_errors(block: dict[str, Any], pointer: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements or len(elements) > 10:
        return [f"must be an array of 1 to 10 items [json-pointer:{pointer}/elements]"]
    return [
        f"failed to match all allowed schemas [json-pointer:{pointer}/elements/{i}]"
        for i, element in enumerate(elements)
        if not isinstance(element, dict) or element.get("type") not in (*TEXT_TYPES, "image")
    ]


def _input_errors(block: dict[str, Any], pointer: str) -> list[str]:
    errors = _text_object_errors(block.get("label"), f"{pointer}/label", limit=2000, plain_only=True)
    return errors + _element_errors(block.get("element"), f"{pointer}/element")


def _image_errors(block: dict[str, Any], pointer: str) -> list[str]:
    if block.get("image_url") or block.get("slack_file"):
        return []
    return [f"must provide image_url or slack_file [json-pointer:{pointer}]"]


def _rich_text_errors(block: dict[str, Any], pointer: str) -> list[str]:
    if isinstance(block.get("elements"), list):
        return []
    return [f"must be an array [json-pointer:{pointer}/elements]"]


_BLOCK_CHECKS: dict[str, Callable[[dict[str, Any], str], list[str]]] = {
    "section": _section_errors,
    "header": _header_errors,
    "actions": _actions_errors,
    "context": _context_errors,
    "input": _input_errors,
    "image": _image_errors,
    "rich_text": _rich_text_errors,
}


def _block_errors(block: Any, pointer: str) -> list[str]:
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        return [f"failed to match all allowed schemas [json-pointer:{pointer}]"]
    errors: list[str] = []
    block_id = block.get("block_id")
    if block_id is not None and (not isinstance(block_id, str) or not block_id or len(block_id) > 255):
        errors.append(f"must be a string of 1 to 255 characters [json-pointer:{pointer}/block_id]")
    check = _BLOCK_CHECKS.get(block["type"])
    return errors + (check(block, pointer) if check else [])


def block_errors(blocks: Any, *, pointer: str = "/blocks", max_blocks: int = MAX_MESSAGE_BLOCKS) -> list[str]:
    """Basic Block Kit validation as Slack reports it: `<reason> [json-pointer:/blocks/N/...]` strings."""
    if not isinstance(blocks, list):
        return [f"must be an array [json-pointer:{pointer}]"]
    if len(blocks) > max_blocks:
        return [f"no more than {max_blocks} items allowed [json-pointer:{pointer}]"]
    errors: list[str] = []
    seen: set[str] = set()
    for i, block in enumerate(blocks):
        errors += _block_errors(block, f"{pointer}/{i}")
        block_id = block.get("block_id") if isinstance(block, dict) else None
        if isinstance(block_id, str):
            if block_id in seen:
                errors.append(f"duplicate block_id [json-pointer:{pointer}/{i}/block_id]")
            seen.add(block_id)
    return errors


def view_errors(view: Any) -> list[str]:
    """Validation of a modal/home view as views.open reports it (in `response_metadata.messages`)."""
    if not isinstance(view, dict):
        return ["must be an object [json-pointer:/view]"]
    errors: list[str] = []
    kind = view.get("type")
    if kind not in ("modal", "home"):
        errors.append("failed to match all allowed schemas [json-pointer:/view/type]")
    if kind == "modal":
        errors += _text_object_errors(view.get("title"), "/view/title", limit=MAX_VIEW_TITLE, plain_only=True)
    for key in ("submit", "close"):
        if view.get(key) is not None:
            errors += _text_object_errors(view[key], f"/view/{key}", limit=MAX_VIEW_TITLE, plain_only=True)
    errors += block_errors(view.get("blocks"), pointer="/view/blocks", max_blocks=MAX_VIEW_BLOCKS)
    raw_blocks = view.get("blocks")
    blocks: list[Any] = raw_blocks if isinstance(raw_blocks, list) else []
    has_input = any(isinstance(b, dict) and b.get("type") == "input" for b in blocks)
    if kind == "modal" and has_input and view.get("submit") is None:
        errors.append("must provide submit when view contains input blocks [json-pointer:/view/submit]")
    for key, limit in (("private_metadata", MAX_PRIVATE_METADATA), ("callback_id", 255), ("external_id", 255)):
        value = view.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            errors.append(f"must be a string of at most {limit} characters [json-pointer:/view/{key}]")
    return errors


def _decorate(obj: Any) -> Any:
    """Slack's echo of your blocks: `emoji: true` on plain_text and `verbatim: false` on mrkdwn when absent."""
    if isinstance(obj, list):
        return [_decorate(item) for item in obj]
    if isinstance(obj, dict):
        out = {key: _decorate(value) for key, value in obj.items()}
        if out.get("type") == "plain_text" and "text" in out:
            out.setdefault("emoji", True)
        elif out.get("type") == "mrkdwn" and "text" in out:
            out.setdefault("verbatim", False)
        return out
    return obj


def _echo_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    echoed: list[dict[str, Any]] = _decorate(blocks)
    for block in echoed:
        # Slack assigns a block_id to every block that has none.
        block.setdefault("block_id", secrets.token_urlsafe(4))
    return echoed


def _rich_text(text: str) -> list[dict[str, Any]]:
    """The block Slack derives from a text-only post."""
    return [
        {
            "type": "rich_text",
            "block_id": secrets.token_urlsafe(4),
            "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}],
        }
    ]


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes")


def _block_text(blocks: Iterable[Any]) -> str:
    """Every string inside the blocks, for `contains=` searches."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            out.append(node)

    walk(list(blocks))
    return "\n".join(out)


# -- wire encoding of what Slack sends to apps -----------------------------------------------------------------------


def encode_form(fields: Iterable[tuple[str, str]]) -> bytes:
    """Slack's PHP-style form encoding: space as `+`, `/` as `%2F`, `:` as `%3A`."""
    return urlencode(list(fields), quote_via=quote_plus).encode()


def encode_payload(payload: dict[str, Any]) -> bytes:
    """An interaction body: `payload=` + URL-encoded compact JSON with Slack's escaped forward slashes."""
    compact = json.dumps(payload, separators=(",", ":")).replace("/", "\\/")
    return b"payload=" + quote_plus(compact).encode()


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """`X-Slack-Signature` for a body (HMAC-SHA256 over `v0:<ts>:<body>`, via slack_sdk)."""
    from slack_sdk.signature import SignatureVerifier

    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    return signature


# -- state ----------------------------------------------------------------------------------------------------------


@dataclass
class StoredMessage:
    """One message as a Slack user would see it, with its edit history."""

    seq: int
    kind: str  # message | dm | ephemeral | response | ack
    channel: str
    user: str  # who posted (the bot for app posts)
    target: str | None  # who sees it (ephemeral / response / ack) or the DM's other party
    text: str
    blocks: list[dict[str, Any]]
    ts: str
    thread_ts: str | None = None
    response_type: str | None = None
    deleted: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Shape of `GET /_sandbox/slack/messages`."""
        return {
            "seq": self.seq,
            "kind": self.kind,
            "channel": self.channel,
            "user": self.user,
            "target": self.target,
            "text": self.text,
            "blocks": self.blocks,
            "ts": self.ts,
            "thread_ts": self.thread_ts,
            "response_type": self.response_type,
            "deleted": self.deleted,
            "edited": bool(self.history),
            "history": self.history,
        }

    def echo(self) -> dict[str, Any]:
        """The `message` object Slack returns and puts into block_actions payloads."""
        out: dict[str, Any] = {
            "bot_id": BOT_ID,
            "type": "message",
            "text": self.text,
            "user": self.user,
            "ts": self.ts,
            "app_id": APP_ID,
            "blocks": self.blocks,
            "team": TEAM_ID,
        }
        if self.thread_ts:
            out["thread_ts"] = self.thread_ts
        return out


@dataclass
class Trigger:
    """A trigger_id handed to the app with a command or click."""

    trigger_id: str
    user: str
    issued: float
    used: bool = False


@dataclass
class StoredView:
    """A modal opened by views.open (and updated or pushed since)."""

    id: str
    user: str
    view: dict[str, Any]
    hash: str
    root_view_id: str
    previous_view_id: str | None = None
    status: str = "open"  # open | closed
    errors: dict[str, str] = field(default_factory=dict)
    state_values: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The view object Slack returns from views.open / views.update and puts into view payloads."""
        v = self.view
        return {
            "id": self.id,
            "team_id": TEAM_ID,
            "type": v.get("type", "modal"),
            "blocks": v.get("blocks", []),
            "private_metadata": v.get("private_metadata", ""),
            "callback_id": v.get("callback_id", ""),
            "state": {"values": self.state_values},
            "hash": self.hash,
            "title": v.get("title"),
            "clear_on_close": bool(v.get("clear_on_close", False)),
            "notify_on_close": bool(v.get("notify_on_close", False)),
            "close": v.get("close"),
            "submit": v.get("submit"),
            "previous_view_id": self.previous_view_id,
            "root_view_id": self.root_view_id,
            "app_id": APP_ID,
            "external_id": v.get("external_id", ""),
            "app_installed_team_id": TEAM_ID,
            "bot_id": BOT_ID,
        }

    def inspect(self) -> dict[str, Any]:
        """Sandbox view of the modal: the Slack object plus who has it open, its status and shown errors."""
        return {**self.to_json(), "user": self.user, "status": self.status, "errors": self.errors}


@dataclass
class ResponseSink:
    """A response_url: where it posts, for whom, and how often it was used."""

    token: str
    channel: str
    user: str
    created: float
    source_ts: str | None = None  # the message that holds the clicked button (replace/delete_original)
    uses: int = 0
    last_ts: str | None = None  # the last message posted through this URL (replace_original without a source)


# -- control-plane bodies --------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UserSpec(_Strict):
    """A seeded workspace member."""

    id: str = Field(pattern=USER_RE.pattern)
    name: str = Field(min_length=1, max_length=80)
    real_name: str | None = Field(default=None, max_length=120)
    display_name: str | None = Field(default=None, max_length=80)
    email: str | None = Field(default=None, max_length=254)
    tz: str = "America/Los_Angeles"
    tz_label: str = "Pacific Standard Time"
    tz_offset: int = -28800
    is_bot: bool = False
    is_admin: bool = False
    deleted: bool = False


class ChannelSpec(_Strict):
    """A seeded channel."""

    id: str = Field(pattern=r"^[CG][A-Z0-9]{2,20}$")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]{0,79}$")
    is_private: bool = False


class UsergroupSpec(_Strict):
    """A seeded user group (e.g. the GPU operators)."""

    id: str = Field(pattern=USERGROUP_RE.pattern)
    handle: str = Field(pattern=r"^[a-z0-9][a-z0-9._\-]{0,79}$")
    name: str | None = Field(default=None, max_length=80)
    users: list[str] = Field(default_factory=list)


class UsersBody(_Strict):
    """`POST /_sandbox/slack/users`."""

    users: list[UserSpec] = Field(min_length=1)


class ChannelsBody(_Strict):
    """`POST /_sandbox/slack/channels`."""

    channels: list[ChannelSpec] = Field(min_length=1)


class UsergroupsBody(_Strict):
    """`POST /_sandbox/slack/usergroups`."""

    usergroups: list[UsergroupSpec] = Field(min_length=1)


class CommandBody(_Strict):
    """`POST /_sandbox/slack/commands`: a user types a slash command."""

    user: str = Field(pattern=USER_RE.pattern)
    channel: str = DEFAULT_CHANNEL
    command: str = Field(default="/gpu", pattern=r"^/[a-z0-9_\-]{1,31}$")
    text: str = Field(default="", max_length=4000)
    url: str


class InteractionBody(_Strict):
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


class TriggerBody(_Strict):
    """`POST /_sandbox/slack/triggers`: mint a trigger_id for a test that calls the ingress directly."""

    user: str = Field(default="U0000000001", pattern=USER_RE.pattern)


@dataclass
class Dispatch:
    """What happened when the sandbox, acting as Slack, POSTed to the app."""

    status: int | None
    body: str
    content_type: str
    latency_ms: float
    error: str | None = None

    def json_body(self) -> Any:
        """The ack parsed as JSON, or None."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


# -- the module ------------------------------------------------------------------------------------------------------


class SlackModule(BaseModule):
    """Slack Web API, response_url sinks and simulated users; every message is kept for inspection."""

    name = "slack"

    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__(sandbox)
        self.users: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.usergroups: dict[str, dict[str, Any]] = {}
        self.messages: list[StoredMessage] = []
        self.views: dict[str, StoredView] = {}
        self.triggers: dict[str, Trigger] = {}
        self.sinks: dict[str, ResponseSink] = {}
        self.deliveries: list[dict[str, Any]] = []
        self._seq = 0
        self._view_seq = 0
        self.reset()

    # -- wiring ----------------------------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Web API methods (Bearer token), response_url sinks (no auth) and the `/_sandbox/slack/` control plane."""
        methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "views.open": self._views_open,
            "views.update": self._views_update,
            "users.info": self._users_info,
            "conversations.open": self._conversations_open,
            "usergroups.users.list": self._usergroups_users_list,
        }
        routes = [
            Route(f"/slack/api/{method}", ("GET", "POST"), self._web_api(impl), Auth.SLACK)
            for method, impl in methods.items()
        ]
        return [
            *routes,
            Route("/slack/response/<token>", ("POST",), self._response_url, Auth.NONE),
            Route("/_sandbox/slack/messages", ("GET",), self._messages_get, Auth.NONE),
            Route("/_sandbox/slack/views", ("GET",), self._views_get, Auth.NONE),
            Route("/_sandbox/slack/users", ("POST",), self._users_post, Auth.NONE),
            Route("/_sandbox/slack/channels", ("POST",), self._channels_post, Auth.NONE),
            Route("/_sandbox/slack/usergroups", ("POST",), self._usergroups_post, Auth.NONE),
            Route("/_sandbox/slack/triggers", ("POST",), self._triggers_post, Auth.NONE),
            Route("/_sandbox/slack/commands", ("POST",), self._commands_post, Auth.NONE),
            Route("/_sandbox/slack/interactions", ("POST",), self._interactions_post, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget everything and re-seed the fixtures' workspace."""
        with self.sb.lock:
            self.users.clear()
            self.channels.clear()
            self.usergroups.clear()
            self.messages.clear()
            self.views.clear()
            self.triggers.clear()
            self.sinks.clear()
            self.deliveries.clear()
            self._seq = 0
            self._view_seq = 0
            for spec in (
                UserSpec(id="U0000000001", name="fake.user", real_name="Fake User"),
                UserSpec(id="U0000000002", name="other.user", real_name="Other User"),
                UserSpec(id=BOT_USER, name=BOT_NAME, real_name="GPU Bot", is_bot=True),
            ):
                self.users[spec.id] = self._user_object(spec)
            self.channels[DEFAULT_CHANNEL] = self._channel_object(ChannelSpec(id=DEFAULT_CHANNEL, name="gpu-ops"))
            # The local function host's default operators group; a test replaces it with its own members.
            self.usergroups[DEFAULT_USERGROUP] = {
                "id": DEFAULT_USERGROUP,
                "handle": "gpu-operators",
                "name": "GPU operators",
                "users": ["U0000000002"],
            }

    def dump(self) -> dict[str, Any]:
        """Directory, messages, views and deliveries; response_url tokens are capabilities and never shown."""
        with self.sb.lock:
            return {
                "users": sorted(self.users),
                "channels": {cid: c["name"] for cid, c in self.channels.items()},
                "usergroups": {gid: {"handle": g["handle"], "users": g["users"]} for gid, g in self.usergroups.items()},
                "messages": [m.to_json() for m in self.messages],
                "views": [v.inspect() for v in self.views.values()],
                "response_urls": {"count": len(self.sinks), "uses": sum(s.uses for s in self.sinks.values())},
                "deliveries": list(self.deliveries),
            }

    # -- helpers -----------------------------------------------------------------------------------------------------

    def _next_ts(self) -> str:
        # Unique and increasing within a run, on the sandbox clock: "<epoch seconds>.<6-digit sequence>".
        self._seq += 1
        return f"{int(self.sb.clock.now())}.{self._seq % 1_000_000:06d}"

    def _user_object(self, spec: UserSpec) -> dict[str, Any]:
        real_name = spec.real_name or spec.name
        display = spec.display_name if spec.display_name is not None else spec.name
        image = f"https://avatars.example.invalid/fake/{spec.id.lower()}.jpg"
        return {
            "id": spec.id,
            "team_id": TEAM_ID,
            "name": spec.name,
            "deleted": spec.deleted,
            "color": "9f69e7",
            "real_name": real_name,
            "tz": spec.tz,
            "tz_label": spec.tz_label,
            "tz_offset": spec.tz_offset,
            "profile": {
                "avatar_hash": "ge3b51ca72de",
                "status_text": "",
                "status_emoji": "",
                "real_name": real_name,
                "display_name": display,
                "real_name_normalized": real_name,
                "display_name_normalized": display,
                "email": spec.email or f"{spec.name}@example.invalid",
                **{f"image_{size}": image for size in ("original", "24", "32", "48", "72", "192", "512")},
                "team": TEAM_ID,
            },
            "is_admin": spec.is_admin,
            "is_owner": False,
            "is_primary_owner": False,
            "is_restricted": False,
            "is_ultra_restricted": False,
            "is_bot": spec.is_bot,
            "updated": int(self.sb.clock.now()),
            "is_app_user": False,
            "has_2fa": False,
        }

    @staticmethod
    def _channel_object(spec: ChannelSpec) -> dict[str, Any]:
        return {"id": spec.id, "name": spec.name, "is_channel": True, "is_private": spec.is_private}

    @staticmethod
    def dm_channel(user: str) -> str:
        """The DM channel id of the bot with a user (stable: U0000000001 -> D0000000001)."""
        return "D" + user[1:]

    def _resolve_channel(self, value: Any) -> str:
        """A channel id, `#name`, name, DM id or user id (posts to the DM) -> channel id; else channel_not_found."""
        if not isinstance(value, str) or not value:
            raise SlackFailure("channel_not_found")
        if value in self.channels:
            return value
        if value.startswith("D") and ("U" + value[1:]) in self.users:
            return value
        if value in self.users:
            return self.dm_channel(value)
        name = value.removeprefix("#")
        for cid, channel in self.channels.items():
            if channel["name"] == name:
                return cid
        raise SlackFailure("channel_not_found")

    def _user(self, value: Any) -> dict[str, Any]:
        user = self.users.get(value) if isinstance(value, str) else None
        if user is None:
            raise SlackFailure("user_not_found")
        return user

    @staticmethod
    def _json_arg(args: dict[str, Any], name: str, error: str) -> Any:
        value = args.get(name)
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise SlackFailure(
                    error, response_metadata={"messages": [f"[ERROR] invalid JSON [json-pointer:/{name}]"]}
                ) from None
        return value

    def _message_content(self, args: dict[str, Any]) -> tuple[str, list[dict[str, Any]] | None]:
        """text and blocks of a post, validated as chat.postMessage does."""
        blocks = self._json_arg(args, "blocks", "invalid_blocks") if args.get("blocks") not in (None, "") else None
        if blocks is not None:
            errors = block_errors(blocks)
            if errors:
                raise SlackFailure(
                    "invalid_blocks", errors=errors, response_metadata={"messages": [f"[ERROR] {e}" for e in errors]}
                )
        text = args.get("text")
        text = text if isinstance(text, str) else ("" if text is None else str(text))
        if not text and not blocks:
            raise SlackFailure("no_text")
        if len(text) > MAX_TEXT:
            raise SlackFailure("msg_too_long")
        return text, blocks

    def _store(self, message: StoredMessage) -> StoredMessage:
        self.messages.append(message)
        if len(self.messages) > MAX_MESSAGES_KEPT:
            del self.messages[0]
        return message

    def _find_message(self, channel: str, ts: str) -> StoredMessage | None:
        """Any message shown in a channel (ephemeral ones too: their buttons and response_urls work)."""
        for message in reversed(self.messages):
            if message.channel == channel and message.ts == ts:
                return message
        return None

    @staticmethod
    def _updatable(message: StoredMessage) -> bool:
        # chat.update edits what the bot posted for everyone; ephemeral messages only change via response_url.
        return message.kind in ("message", "dm") or message.response_type == "in_channel"

    def _new_message(
        self,
        kind: str,
        channel: str,
        text: str,
        blocks: list[dict[str, Any]] | None,
        *,
        user: str = BOT_USER,
        target: str | None = None,
        thread_ts: str | None = None,
        response_type: str | None = None,
    ) -> StoredMessage:
        ts = self._next_ts()
        shown = _echo_blocks(blocks) if blocks else _rich_text(text)
        return self._store(
            StoredMessage(
                seq=self._seq,
                kind=kind,
                channel=channel,
                user=user,
                target=target,
                text=text,
                blocks=shown,
                ts=ts,
                thread_ts=thread_ts,
                response_type=response_type,
            )
        )

    @staticmethod
    def _rewrite(message: StoredMessage, text: str, blocks: list[dict[str, Any]] | None, edited_ts: str) -> None:
        message.history.append({"text": message.text, "blocks": message.blocks, "replaced_at": edited_ts})
        message.text = text
        message.blocks = _echo_blocks(blocks) if blocks else _rich_text(text)

    def _new_trigger(self, user: str) -> str:
        # Slack's format: digits.digits.hex (views.open rejects anything else as invalid_trigger_id).
        trigger_id = f"{int(self.sb.clock.now() * 1000)}.{self._seq:010d}.{secrets.token_hex(16)}"
        self.triggers[trigger_id] = Trigger(trigger_id, user, self.sb.clock.now())
        return trigger_id

    def _new_sink(self, channel: str, user: str, source_ts: str | None = None) -> str:
        token = secrets.token_urlsafe(18)
        self.sinks[token] = ResponseSink(token, channel, user, self.sb.clock.now(), source_ts)
        return f"{self.sb.base_url}/slack/response/{token}"

    # -- Web API -----------------------------------------------------------------------------------------------------

    def _web_api(self, impl: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Request], Response]:
        def handler(request: Request) -> Response:
            args = form_or_json(request)
            try:
                with self.sb.lock:
                    body = impl(args)
            except SlackFailure as exc:
                return slack_error(exc.code, 200, **exc.extra)
            return json_response({"ok": True, **body})

        return handler

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"https://{TEAM_DOMAIN}.slack.com/",
            "team": TEAM_NAME,
            "user": BOT_NAME,
            "team_id": TEAM_ID,
            "user_id": BOT_USER,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._resolve_channel(args.get("channel"))
        text, blocks = self._message_content(args)
        thread_ts = args.get("thread_ts") or None
        dm = channel.startswith("D")
        message = self._new_message(
            "dm" if dm else "message",
            channel,
            text,
            blocks,
            target="U" + channel[1:] if dm else None,
            thread_ts=str(thread_ts) if thread_ts else None,
        )
        echo = {**message.echo(), "bot_profile": {**BOT_PROFILE, "updated": int(self.sb.clock.now())}}
        return {"channel": channel, "ts": message.ts, "message": echo}

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._resolve_channel(args.get("channel"))
        ts = args.get("ts")
        if not isinstance(ts, str) or not ts:
            raise SlackFailure("message_not_found")
        message = self._find_message(channel, ts)
        if message is None or message.deleted or not self._updatable(message):
            raise SlackFailure("message_not_found")
        if message.user != BOT_USER:
            raise SlackFailure("cant_update_message")
        text, blocks = self._message_content(args)
        edited_ts = self._next_ts()
        self._rewrite(message, text, blocks, edited_ts)
        echo = {**message.echo(), "edited": {"user": BOT_USER, "ts": edited_ts}}
        return {"channel": channel, "ts": ts, "text": text, "message": echo}

    def _chat_post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._resolve_channel(args.get("channel"))
        user = self._user(args.get("user"))["id"]
        text, blocks = self._message_content(args)
        thread_ts = args.get("thread_ts") or None
        message = self._new_message(
            "ephemeral", channel, text, blocks, target=user, thread_ts=str(thread_ts) if thread_ts else None
        )
        return {"message_ts": message.ts}

    def _parse_view(self, args: dict[str, Any]) -> dict[str, Any]:
        view = self._json_arg(args, "view", "invalid_arguments")
        if view is None:
            raise SlackFailure(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing required field: view"]}
            )
        if len(json.dumps(view, separators=(",", ":")).encode()) > MAX_VIEW_BYTES:
            raise SlackFailure("view_too_large")
        errors = view_errors(view)
        if errors:
            raise SlackFailure("invalid_arguments", response_metadata={"messages": [f"[ERROR] {e}" for e in errors]})
        assert isinstance(view, dict)
        return view

    def _new_hash(self) -> str:
        return f"{int(self.sb.clock.now())}.{secrets.token_hex(4)}"

    def _views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        trigger_id = args.get("trigger_id")
        if not isinstance(trigger_id, str) or not TRIGGER_RE.match(trigger_id):
            raise SlackFailure("invalid_trigger_id")
        trigger = self.triggers.get(trigger_id)
        if trigger is None:
            raise SlackFailure("invalid_trigger_id")
        if trigger.used:
            raise SlackFailure("exchanged_trigger_id")
        if self.sb.clock.now() - trigger.issued > TRIGGER_TTL_S:
            raise SlackFailure("expired_trigger_id")
        view = self._parse_view(args)
        trigger.used = True
        self._view_seq += 1
        view_id = f"V{self._view_seq:010d}"
        stored = StoredView(view_id, trigger.user, copy.deepcopy(_decorate(view)), self._new_hash(), view_id)
        self.views[view_id] = stored
        return {"view": stored.to_json()}

    def _views_update(self, args: dict[str, Any]) -> dict[str, Any]:
        view_id, external_id = args.get("view_id"), args.get("external_id")
        if not view_id and not external_id:
            raise SlackFailure(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing view_id or external_id"]}
            )
        stored = self.views.get(view_id) if isinstance(view_id, str) else None
        if stored is None and external_id:
            stored = next((v for v in self.views.values() if v.view.get("external_id") == external_id), None)
        if stored is None:
            raise SlackFailure("not_found")
        expected = args.get("hash")
        if expected and expected != stored.hash:
            raise SlackFailure("hash_conflict")
        view = self._parse_view(args)
        stored.view = copy.deepcopy(_decorate(view))
        stored.hash = self._new_hash()
        stored.errors = {}
        stored.state_values = {}
        return {"view": stored.to_json()}

    def _users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"user": self._user(args.get("user"))}

    def _conversations_open(self, args: dict[str, Any]) -> dict[str, Any]:
        users = args.get("users")
        channel = args.get("channel")
        if channel and not users:
            cid = self._resolve_channel(channel)
            return {"channel": {"id": cid}}
        if not users:
            raise SlackFailure("users_list_not_supplied")
        ids = users if isinstance(users, list) else [u.strip() for u in str(users).split(",") if u.strip()]
        if len(ids) != 1:
            # Group DMs are not something gpufarm opens; Slack would create an mpim.
            raise SlackFailure("not_enough_users" if not ids else "too_many_users")
        user = self._user(ids[0])["id"]
        dm = self.dm_channel(user)
        if _truthy(args.get("return_im", False)):
            full = {
                "id": dm,
                "created": int(self.sb.clock.now()),
                "is_im": True,
                "is_org_shared": False,
                "user": user,
                "last_read": "0000000000.000000",
                "latest": None,
                "unread_count": 0,
                "unread_count_display": 0,
                "is_open": True,
                "priority": 0,
            }
            return {"no_op": True, "already_open": True, "channel": full}
        return {"channel": {"id": dm}}

    def _usergroups_users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        group_id = args.get("usergroup")
        if not group_id:
            raise SlackFailure(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing required field: usergroup"]}
            )
        group = self.usergroups.get(str(group_id))
        if group is None:
            raise SlackFailure("no_such_subteam")
        return {"users": list(group["users"])}

    # -- response_url sinks --------------------------------------------------------------------------------------

    def _response_url(self, request: Request, token: str) -> Response:
        fault = self.sb.faults.pick(request.path)
        if fault is not None:
            response = _text(fault, "rate_limited" if fault == 429 else "service_unavailable")
            if fault == 429:
                response.headers["Retry-After"] = "1"
            return response
        body = _webhook_body(request)
        if body is None:
            return _text(400, "invalid_payload")
        with self.sb.lock:
            sink = self.sinks.get(token)
            if sink is None:
                return _text(404, "no_service")
            if self.sb.clock.now() - sink.created > RESPONSE_URL_TTL_S:
                return _text(404, "expired_url")
            if sink.uses >= RESPONSE_URL_USES:
                return _text(404, "used_url")
            return self._use_sink(sink, body)

    def _use_sink(self, sink: ResponseSink, body: dict[str, Any]) -> Response:
        original_ts = sink.source_ts or sink.last_ts
        original = self._find_message(sink.channel, original_ts) if original_ts else None
        if _truthy(body.get("delete_original", False)):
            sink.uses += 1
            if original is not None:
                original.deleted = True
            return _text(200, "ok")
        try:
            text, blocks = self._message_content(body)
        except SlackFailure as exc:
            return _text(400, exc.code)
        sink.uses += 1
        if _truthy(body.get("replace_original", False)) and original is not None and not original.deleted:
            self._rewrite(original, text, blocks, self._next_ts())
            return _text(200, "ok")
        response_type = "in_channel" if body.get("response_type") == "in_channel" else "ephemeral"
        thread_ts = body.get("thread_ts")
        message = self._new_message(
            "response",
            sink.channel,
            text,
            blocks,
            target=sink.user,
            thread_ts=str(thread_ts) if thread_ts else None,
            response_type=response_type,
        )
        sink.last_ts = message.ts
        return _text(200, "ok")

    # -- inspection and seeding ----------------------------------------------------------------------------------

    def _messages_get(self, request: Request) -> Response:
        channel = request.args.get("channel")
        user = request.args.get("user")
        contains = request.args.get("contains")
        kind = request.args.get("kind")
        with self.sb.lock:
            found = [m.to_json() for m in self.find_messages(channel=channel, user=user, contains=contains, kind=kind)]
        return json_response({"messages": found})

    def find_messages(
        self,
        *,
        channel: str | None = None,
        user: str | None = None,
        contains: str | None = None,
        kind: str | None = None,
    ) -> list[StoredMessage]:
        """Messages in order, filtered: user matches the poster or the person it was shown to."""
        with self.sb.lock:
            out = []
            for m in self.messages:
                if channel and m.channel != channel:
                    continue
                if user and user not in (m.user, m.target):
                    continue
                if kind and m.kind != kind:
                    continue
                if contains and contains not in m.text and contains not in _block_text(m.blocks):
                    continue
                out.append(m)
            return out

    def _views_get(self, request: Request) -> Response:
        with self.sb.lock:
            return json_response({"views": [v.inspect() for v in self.views.values()]})

    def _users_post(self, request: Request) -> Response:
        body = UsersBody.model_validate(json_object(request))
        with self.sb.lock:
            for spec in body.users:
                self.users[spec.id] = self._user_object(spec)
        return json_response({"ok": True, "users": [u.id for u in body.users]})

    def _channels_post(self, request: Request) -> Response:
        body = ChannelsBody.model_validate(json_object(request))
        with self.sb.lock:
            for spec in body.channels:
                self.channels[spec.id] = self._channel_object(spec)
        return json_response({"ok": True, "channels": [c.id for c in body.channels]})

    def _usergroups_post(self, request: Request) -> Response:
        body = UsergroupsBody.model_validate(json_object(request))
        with self.sb.lock:
            unknown = sorted({u for g in body.usergroups for u in g.users} - set(self.users))
            if unknown:
                raise ApiError(400, f"unknown users (seed them first): {', '.join(unknown)}")
            for spec in body.usergroups:
                self.usergroups[spec.id] = {
                    "id": spec.id,
                    "handle": spec.handle,
                    "name": spec.name or spec.handle,
                    "users": list(dict.fromkeys(spec.users)),
                }
        return json_response({"ok": True, "usergroups": [g.id for g in body.usergroups]})

    def _triggers_post(self, request: Request) -> Response:
        body = TriggerBody.model_validate(json_object(request))
        with self.sb.lock:
            self._known_user(body.user)
            return json_response({"trigger_id": self._new_trigger(body.user)})

    def _known_user(self, user: str) -> dict[str, Any]:
        found = self.users.get(user)
        if found is None:
            raise ApiError(400, f"unknown user {user}: seed it with POST /_sandbox/slack/users")
        return found

    def _known_channel(self, channel: str) -> tuple[str, str]:
        try:
            cid = self._resolve_channel(channel)
        except SlackFailure:
            raise ApiError(400, f"unknown channel {channel}: seed it with POST /_sandbox/slack/channels") from None
        name = self.channels[cid]["name"] if cid in self.channels else "directmessage"
        return cid, name

    # -- simulated users -----------------------------------------------------------------------------------------

    def _signed_post(self, url: str, body: bytes) -> Dispatch:
        """POST as Slack does: form body, Slack's headers, a fresh signature on the sandbox clock; 10 s timeout."""
        timestamp = str(int(self.sb.clock.now()))
        headers = {
            "Accept": "application/json,*/*",
            "Content-Type": "application/x-www-form-urlencoded",
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": sign(self.sb.slack_signing_secret, timestamp, body),
        }
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - scheme checked
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=DISPATCH_TIMEOUT_S) as response:  # noqa: S310
                status, data, ctype = response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, data, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        except (OSError, ValueError) as exc:
            latency = (time.perf_counter() - started) * 1000
            # What a Slack user sees when the app cannot be reached or is too slow.
            code = "operation_timeout" if isinstance(exc, TimeoutError) else "dispatch_failed"
            return Dispatch(None, "", "", round(latency, 1), f"{code}: {type(exc).__name__}")
        latency = (time.perf_counter() - started) * 1000
        return Dispatch(status, data.decode("utf-8", "replace"), ctype or "", round(latency, 1))

    @staticmethod
    def _check_url(url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ApiError(400, "url must be an http(s) URL of the app")

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
        with self.sb.lock:
            self.deliveries.append(entry)
            if len(self.deliveries) > MAX_MESSAGES_KEPT:
                del self.deliveries[0]

    def _commands_post(self, request: Request) -> Response:
        body = CommandBody.model_validate(json_object(request))
        self._check_url(body.url)
        with self.sb.lock:
            user = self._known_user(body.user)
            channel_id, channel_name = self._known_channel(body.channel)
            response_url = self._new_sink(channel_id, body.user)
            trigger_id = self._new_trigger(body.user)
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
        result = self._signed_post(body.url, form)
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
        with self.sb.lock:
            message = self._new_message("ack", channel, text, blocks, target=user, response_type=response_type)
            sink = self.sinks.get(token)
            if sink is not None:
                # replace_original through the command's response_url rewrites this ack, as in Slack.
                sink.last_ts = message.ts

    def _interactions_post(self, request: Request) -> Response:
        body = InteractionBody.model_validate(json_object(request))
        self._check_url(body.url)
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
        with self.sb.lock:
            if body.view_id:
                payload, user_id = self._view_click(body, body.action_id)
            else:
                payload, user_id = self._message_click(body, body.action_id)
        # The app is called without holding the sandbox lock: it calls back into this sandbox while answering.
        result = self._signed_post(body.url, encode_payload(payload))
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
        channel_id, channel_name = self._known_channel(body.channel)
        message = self._find_message(channel_id, body.message_ts)
        if message is None or message.deleted:
            raise ApiError(400, f"no message {body.message_ts} in {channel_id}")
        user = self._known_user(body.user or "U0000000001")
        action = _find_action(message.blocks, action_id, body.block_id, body.value)
        if action is None:
            raise ApiError(400, f"message {message.ts} has no element with action_id {action_id}")
        action["action_ts"] = self._next_ts()
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
            "trigger_id": self._new_trigger(user["id"]),
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel_id, "name": channel_name},
            "message": message.echo(),
            "state": {"values": {}},
            "response_url": self._new_sink(channel_id, user["id"], message.ts),
            "actions": [action],
        }
        return payload, user["id"]

    def _view_click(self, body: InteractionBody, action_id: str) -> tuple[dict[str, Any], str]:
        """The block_actions payload for a click inside an open modal (no response_url: views have none)."""
        stored = self._open_view(body.view_id)
        user = self._known_user(body.user or stored.user)
        action = _find_action(stored.view.get("blocks", []), action_id, body.block_id, body.value)
        if action is None:
            raise ApiError(400, f"view {stored.id} has no element with action_id {action_id}")
        action["action_ts"] = self._next_ts()
        payload: dict[str, Any] = {
            "type": "block_actions",
            "user": self._user_ref(user),
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": {"type": "view", "view_id": stored.id},
            "trigger_id": self._new_trigger(user["id"]),
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "enterprise": None,
            "is_enterprise_install": False,
            "view": stored.to_json(),
            "actions": [action],
        }
        return payload, user["id"]

    def _open_view(self, view_id: str | None) -> StoredView:
        stored = self.views.get(view_id or "")
        if stored is None:
            raise ApiError(400, f"no view {view_id}")
        if stored.status != "open":
            raise ApiError(400, f"view {view_id} is closed")
        return stored

    def _view_submission(self, body: InteractionBody) -> Response:
        with self.sb.lock:
            stored = self._open_view(body.view_id)
            user = self._known_user(body.user or stored.user)
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
                        "response_url": self._new_sink(channel, user["id"]),
                    }
                )
            trigger_id = self._new_trigger(user["id"])
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
        result = self._signed_post(body.url, encode_payload(payload))
        self._record_delivery("view_submission", user["id"], body.url, result)
        with self.sb.lock:
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
        action = ack.get("response_action") if isinstance(ack, dict) else None
        if action == "errors" and isinstance(ack, dict) and isinstance(ack.get("errors"), dict):
            inputs = {b.get("block_id") for b in stored.view.get("blocks", []) if b.get("type") == "input"}
            if not ack["errors"] or not set(ack["errors"]) <= inputs:
                # Slack rejects errors keyed by anything but the view's input block_ids.
                return "failed"
            stored.errors = {str(k): str(v) for k, v in ack["errors"].items()}
            return "errors"
        if action in ("update", "push") and isinstance(ack, dict):
            view = ack.get("view")
            if not isinstance(view, dict) or view_errors(view):
                return "failed"
            if action == "update":
                stored.view = copy.deepcopy(_decorate(view))
                stored.hash = self._new_hash()
                stored.errors = {}
                stored.state_values = {}
                return "updated"
            self._view_seq += 1
            new_id = f"V{self._view_seq:010d}"
            self.views[new_id] = StoredView(
                new_id,
                stored.user,
                copy.deepcopy(_decorate(view)),
                self._new_hash(),
                stored.root_view_id,
                previous_view_id=stored.id,
            )
            return "pushed"
        if action == "clear":
            for view_obj in self.views.values():
                if view_obj.root_view_id == stored.root_view_id:
                    view_obj.status = "closed"
            return "cleared"
        # Any other body on a view_submission is an invalid ack: Slack keeps the modal open with an error.
        return "failed"

    def _view_closed(self, body: InteractionBody) -> Response:
        with self.sb.lock:
            stored = self._open_view(body.view_id)
            user = self._known_user(body.user or stored.user)
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
        result = self._signed_post(body.url, encode_payload(payload))
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


# -- helpers for interactions ----------------------------------------------------------------------------------------


def _text(status: int, body: str) -> Response:
    """Slack's webhook answers: a short plain-text body."""
    return Response(body, status=status, content_type="text/plain; charset=utf-8")


def _webhook_body(request: Request) -> dict[str, Any] | None:
    """A response_url body: JSON, or a form with a `payload` JSON field as incoming webhooks accept."""
    data = request.get_data(cache=True)
    text = data.decode("utf-8", "replace").strip()
    if (request.mimetype or "").lower() == "application/x-www-form-urlencoded":
        text = parse_qs(text).get("payload", [""])[-1]
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


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
