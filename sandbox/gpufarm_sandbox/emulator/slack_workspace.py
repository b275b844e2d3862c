"""The Slack sandbox's workspace: its fixed ids, what it stores (messages, views, triggers, response_urls) and the
bodies that seed its directory."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
# The scopes the sandbox's bot token holds: those slack/manifest.yaml asks for (a unit test holds them equal).
# Every Web API answer names them in `x-oauth-scopes`, as Slack's do.
BOT_SCOPES = (
    "commands",
    "chat:write",
    "im:write",
    "files:write",
    "users:read",
    "usergroups:read",
    "channels:read",
)
# The team user groups config/farm.example.yaml names (teams.<name>.members), with the demo's researchers in them:
# alice (U0000000001) in nlp, bob (U0000000003) in vision, carol (U0000000004) in speech. (id, handle, members)
TEAM_USERGROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("S0000000011", "team-nlp", ("U0000000001",)),
    ("S0000000012", "team-vision", ("U0000000003",)),
    ("S0000000013", "team-speech", ("U0000000004",)),
)
MAX_MESSAGES_KEPT = 10_000

TRIGGER_RE = re.compile(r"^\d+\.\d+\.[0-9a-f]+$")
USER_RE = re.compile(r"^[UW][A-Z0-9]{2,20}$")
CHANNEL_RE = re.compile(r"^[CGD][A-Z0-9]{2,20}$")
USERGROUP_RE = re.compile(r"^S[A-Z0-9]{2,20}$")
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
    files: list[str] = field(default_factory=list)  # ids of the files shared with this message

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
            **({"files": list(self.files)} if self.files else {}),
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


class StrictBody(BaseModel):
    """A control-plane body: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class UserSpec(StrictBody):
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


class ChannelSpec(StrictBody):
    """A seeded channel."""

    id: str = Field(pattern=r"^[CG][A-Z0-9]{2,20}$")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]{0,79}$")
    is_private: bool = False
    # Whether the bot is in it (conversations.info's `is_member`; a private channel hides from a non-member).
    is_member: bool = True


class UsergroupSpec(StrictBody):
    """A seeded user group (e.g. the GPU operators)."""

    id: str = Field(pattern=USERGROUP_RE.pattern)
    handle: str = Field(pattern=r"^[a-z0-9][a-z0-9._\-]{0,79}$")
    name: str | None = Field(default=None, max_length=80)
    users: list[str] = Field(default_factory=list)


class UsersBody(StrictBody):
    """`POST /_sandbox/slack/users`."""

    users: list[UserSpec] = Field(min_length=1)


class ChannelsBody(StrictBody):
    """`POST /_sandbox/slack/channels`."""

    channels: list[ChannelSpec] = Field(min_length=1)


class UsergroupsBody(StrictBody):
    """`POST /_sandbox/slack/usergroups`."""

    usergroups: list[UsergroupSpec] = Field(min_length=1)


class TriggerBody(StrictBody):
    """`POST /_sandbox/slack/triggers`: mint a trigger_id for a test that calls the ingress directly."""

    user: str = Field(default="U0000000001", pattern=USER_RE.pattern)
