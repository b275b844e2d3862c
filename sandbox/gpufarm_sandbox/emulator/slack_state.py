"""The Slack workspace the sandbox keeps: its directory (users, channels, user groups), the messages and views shown,
trigger_ids and response_url sinks, and the ids it hands out. The Web API (`slack`), the simulated users
(`slack_users`) and file uploads (`slack_files`) all read and change it under the sandbox lock."""

from __future__ import annotations

import json
import secrets
from typing import Any

from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.slack_blockkit import block_errors, block_text, echo_blocks, rich_text
from gpufarm_sandbox.emulator.slack_workspace import (
    BOT_NAME,
    BOT_SCOPES,
    BOT_USER,
    DEFAULT_CHANNEL,
    DEFAULT_USERGROUP,
    MAX_MESSAGES_KEPT,
    TEAM_ID,
    TEAM_USERGROUPS,
    ChannelSpec,
    ResponseSink,
    SlackFailure,
    StoredMessage,
    StoredView,
    Trigger,
    UserSpec,
)
from gpufarm_sandbox.emulator.web import ApiError

MAX_TEXT = 40_000


class SlackState:
    """Directory, messages, views, triggers, sinks and deliveries of the one workspace (guarded by the sandbox lock)."""

    def __init__(self, context: SandboxContext) -> None:
        self.ctx = context
        self.users: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.usergroups: dict[str, dict[str, Any]] = {}
        self.messages: list[StoredMessage] = []
        self.views: dict[str, StoredView] = {}
        # Each user's App Home (views.publish): the id of its stored view.
        self.homes: dict[str, str] = {}
        self.triggers: dict[str, Trigger] = {}
        self.sinks: dict[str, ResponseSink] = {}
        self.deliveries: list[dict[str, Any]] = []
        # The bot token's scopes (a test narrows them to play a token that lacks some).
        self.scopes: list[str] = []
        self._seq = 0
        self._view_seq = 0
        self.reset()

    def reset(self) -> None:
        """Forget everything and re-seed the fixtures' workspace."""
        with self.ctx.lock:
            self.users.clear()
            self.channels.clear()
            self.usergroups.clear()
            self.messages.clear()
            self.views.clear()
            self.homes.clear()
            self.triggers.clear()
            self.sinks.clear()
            self.deliveries.clear()
            self.scopes = list(BOT_SCOPES)
            self._seq = 0
            self._view_seq = 0
            for spec in (
                UserSpec(id="U0000000001", name="fake.user", real_name="Fake User"),
                UserSpec(id="U0000000002", name="other.user", real_name="Other User"),
                UserSpec(id=BOT_USER, name=BOT_NAME, real_name="GPU Bot", is_bot=True),
            ):
                self.users[spec.id] = self.user_object(spec)
            self.channels[DEFAULT_CHANNEL] = self.channel_object(ChannelSpec(id=DEFAULT_CHANNEL, name="gpu-ops"))
            # The local function host's default operators group; a test replaces it with its own members.
            self.usergroups[DEFAULT_USERGROUP] = {
                "id": DEFAULT_USERGROUP,
                "handle": "gpu-operators",
                "name": "GPU operators",
                "users": ["U0000000002"],
            }
            # The example farm's teams name these groups as their members (a test may replace them).
            for group_id, handle, members in TEAM_USERGROUPS:
                self.usergroups[group_id] = {"id": group_id, "handle": handle, "name": handle, "users": list(members)}

    def next_ts(self) -> str:
        """A message ts of this workspace."""
        # Unique and increasing within a run, on the sandbox clock: "<epoch seconds>.<6-digit sequence>".
        self._seq += 1
        return f"{int(self.ctx.clock.now())}.{self._seq % 1_000_000:06d}"

    def user_object(self, spec: UserSpec) -> dict[str, Any]:
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
            "updated": int(self.ctx.clock.now()),
            "is_app_user": False,
            "has_2fa": False,
        }

    @staticmethod
    def channel_object(spec: ChannelSpec) -> dict[str, Any]:
        return {
            "id": spec.id,
            "name": spec.name,
            "is_channel": True,
            "is_private": spec.is_private,
            "is_member": spec.is_member,
        }

    @staticmethod
    def dm_channel(user: str) -> str:
        """The DM channel id of the bot with a user (stable: U0000000001 -> D0000000001)."""
        return "D" + user[1:]

    def resolve_channel(self, value: Any) -> str:
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

    def user(self, value: Any) -> dict[str, Any]:
        user = self.users.get(value) if isinstance(value, str) else None
        if user is None:
            raise SlackFailure("user_not_found")
        return user

    @staticmethod
    def json_arg(args: dict[str, Any], name: str, error: str) -> Any:
        value = args.get(name)
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise SlackFailure(
                    error, response_metadata={"messages": [f"[ERROR] invalid JSON [json-pointer:/{name}]"]}
                ) from None
        return value

    def message_content(self, args: dict[str, Any]) -> tuple[str, list[dict[str, Any]] | None]:
        """text and blocks of a post, validated as chat.postMessage does."""
        blocks = self.json_arg(args, "blocks", "invalid_blocks") if args.get("blocks") not in (None, "") else None
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

    def find_message(self, channel: str, ts: str) -> StoredMessage | None:
        """Any message shown in a channel (ephemeral ones too: their buttons and response_urls work)."""
        for message in reversed(self.messages):
            if message.channel == channel and message.ts == ts:
                return message
        return None

    @staticmethod
    def updatable(message: StoredMessage) -> bool:
        # chat.update edits what the bot posted for everyone; ephemeral messages only change via response_url.
        return message.kind in ("message", "dm") or message.response_type == "in_channel"

    def new_message(
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
        """Store a message the bot (or a user) posted, with the blocks Slack would show."""
        ts = self.next_ts()
        shown = echo_blocks(blocks) if blocks else rich_text(text)
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
    def rewrite(message: StoredMessage, text: str, blocks: list[dict[str, Any]] | None, edited_ts: str) -> None:
        message.history.append({"text": message.text, "blocks": message.blocks, "replaced_at": edited_ts})
        message.text = text
        message.blocks = echo_blocks(blocks) if blocks else rich_text(text)

    def next_view_id(self) -> str:
        """A fresh view id, as views.open and a pushed view get."""
        self._view_seq += 1
        return f"V{self._view_seq:010d}"

    def new_trigger(self, user: str) -> str:
        """A trigger_id for a user's command or click, usable once within 3 s."""
        # Slack's format: digits.digits.hex (views.open rejects anything else as invalid_trigger_id).
        trigger_id = f"{int(self.ctx.clock.now() * 1000)}.{self._seq:010d}.{secrets.token_hex(16)}"
        self.triggers[trigger_id] = Trigger(trigger_id, user, self.ctx.clock.now())
        return trigger_id

    def new_sink(self, channel: str, user: str, source_ts: str | None = None) -> str:
        """A response_url that posts to a channel for a user (and can replace the message at source_ts)."""
        token = secrets.token_urlsafe(18)
        self.sinks[token] = ResponseSink(token, channel, user, self.ctx.clock.now(), source_ts)
        return f"{self.ctx.base_url}/slack/response/{token}"

    def new_hash(self) -> str:
        """A view hash, new on every change of the view."""
        return f"{int(self.ctx.clock.now())}.{secrets.token_hex(4)}"

    def find_messages(
        self,
        *,
        channel: str | None = None,
        user: str | None = None,
        contains: str | None = None,
        kind: str | None = None,
    ) -> list[StoredMessage]:
        """Messages in order, filtered: user matches the poster or the person it was shown to."""
        with self.ctx.lock:
            out = []
            for m in self.messages:
                if channel and m.channel != channel:
                    continue
                if user and user not in (m.user, m.target):
                    continue
                if kind and m.kind != kind:
                    continue
                if contains and contains not in m.text and contains not in block_text(m.blocks):
                    continue
                out.append(m)
            return out

    def known_user(self, user: str) -> dict[str, Any]:
        """A seeded member, or a 400 that says how to seed it."""
        found = self.users.get(user)
        if found is None:
            raise ApiError(400, f"unknown user {user}: seed it with POST /_sandbox/slack/users")
        return found

    def known_channel(self, channel: str) -> tuple[str, str]:
        """Channel id and name of a seeded channel or DM, or a 400 that says how to seed it."""
        try:
            cid = self.resolve_channel(channel)
        except SlackFailure:
            raise ApiError(400, f"unknown channel {channel}: seed it with POST /_sandbox/slack/channels") from None
        name = self.channels[cid]["name"] if cid in self.channels else "directmessage"
        return cid, name
