"""Sandbox module: the Slack Web API methods gpufarm calls, response_url sinks, and the Slack control plane.

Answer shapes follow the contract fixtures (tests/fixtures/slack, copied from contracts/slack). Errors are HTTP 200
`{"ok": false, "error": ...}` as Slack sends them; 429 comes from the sandbox's fault injection. Block Kit checks live
in `slack_blockkit`, the workspace's ids and stored objects in `slack_workspace`, and the simulated users who sign and
POST real-shaped slash commands and interactions to the app in `slack_users`.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.slack_blockkit import (
    MAX_VIEW_BYTES,
    block_errors,
    block_text,
    decorate,
    echo_blocks,
    rich_text,
    view_errors,
)
from gpufarm_sandbox.emulator.slack_files import SlackFiles
from gpufarm_sandbox.emulator.slack_users import SimulatedUsers
from gpufarm_sandbox.emulator.slack_workspace import (
    BOT_ID,
    BOT_NAME,
    BOT_PROFILE,
    BOT_USER,
    DEFAULT_CHANNEL,
    DEFAULT_USERGROUP,
    MAX_MESSAGES_KEPT,
    TEAM_DOMAIN,
    TEAM_ID,
    TEAM_NAME,
    TEAM_USERGROUPS,
    TRIGGER_RE,
    ChannelsBody,
    ChannelSpec,
    ResponseSink,
    SlackFailure,
    StoredMessage,
    StoredView,
    Trigger,
    TriggerBody,
    UsergroupsBody,
    UsersBody,
    UserSpec,
)
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, form_or_json, json_object, json_response, slack_error

TRIGGER_TTL_S = 3.0  # trigger_id lives 3 s and works once
RESPONSE_URL_USES = 5  # response_url: at most 5 uses within 30 minutes
RESPONSE_URL_TTL_S = 1800.0
MAX_TEXT = 40_000


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes")


# -- the module ------------------------------------------------------------------------------------------------------


class SlackModule(BaseModule):
    """Slack Web API, response_url sinks and simulated users; every message is kept for inspection."""

    name = "slack"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
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
        self.simulated = SimulatedUsers(self)
        self.files = SlackFiles(self)
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
            "files.getUploadURLExternal": self.files.get_upload_url,
            "files.completeUploadExternal": self.files.complete,
        }
        routes = [
            Route(f"/slack/api/{method}", ("GET", "POST"), self._web_api(impl), Auth.SLACK)
            for method, impl in methods.items()
        ]
        return [
            *routes,
            *self.files.routes(),
            Route("/slack/response/<token>", ("POST",), self._response_url, Auth.NONE),
            Route("/_sandbox/slack/messages", ("GET",), self._messages_get, Auth.NONE),
            Route("/_sandbox/slack/views", ("GET",), self._views_get, Auth.NONE),
            Route("/_sandbox/slack/users", ("POST",), self._users_post, Auth.NONE),
            Route("/_sandbox/slack/channels", ("POST",), self._channels_post, Auth.NONE),
            Route("/_sandbox/slack/usergroups", ("POST",), self._usergroups_post, Auth.NONE),
            Route("/_sandbox/slack/triggers", ("POST",), self._triggers_post, Auth.NONE),
            Route("/_sandbox/slack/commands", ("POST",), self.simulated.commands_post, Auth.NONE),
            Route("/_sandbox/slack/interactions", ("POST",), self.simulated.interactions_post, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget everything and re-seed the fixtures' workspace."""
        with self.ctx.lock:
            self.users.clear()
            self.channels.clear()
            self.usergroups.clear()
            self.messages.clear()
            self.views.clear()
            self.triggers.clear()
            self.sinks.clear()
            self.deliveries.clear()
            self.files.reset()
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
            # The example farm's teams name these groups as their members (a test may replace them).
            for group_id, handle, members in TEAM_USERGROUPS:
                self.usergroups[group_id] = {"id": group_id, "handle": handle, "name": handle, "users": list(members)}

    def dump(self) -> dict[str, Any]:
        """Directory, messages, views and deliveries; response_url tokens are capabilities and never shown."""
        with self.ctx.lock:
            return {
                "users": sorted(self.users),
                "channels": {cid: c["name"] for cid, c in self.channels.items()},
                "usergroups": {gid: {"handle": g["handle"], "users": g["users"]} for gid, g in self.usergroups.items()},
                "messages": [m.to_json() for m in self.messages],
                "views": [v.inspect() for v in self.views.values()],
                "response_urls": {"count": len(self.sinks), "uses": sum(s.uses for s in self.sinks.values())},
                "deliveries": list(self.deliveries),
                "files": self.files.dump(),
            }

    # -- helpers -----------------------------------------------------------------------------------------------------

    def next_ts(self) -> str:
        """A message ts of this workspace."""
        # Unique and increasing within a run, on the sandbox clock: "<epoch seconds>.<6-digit sequence>".
        self._seq += 1
        return f"{int(self.ctx.clock.now())}.{self._seq % 1_000_000:06d}"

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
            "updated": int(self.ctx.clock.now()),
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

    def resolve_channel(self, value: Any) -> str:
        """A channel id, `#name`, name, DM id or user id -> the channel id; SlackFailure(channel_not_found) else."""
        return self._resolve_channel(value)

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

    def find_message(self, channel: str, ts: str) -> StoredMessage | None:
        """Any message shown in a channel (ephemeral ones too: their buttons and response_urls work)."""
        for message in reversed(self.messages):
            if message.channel == channel and message.ts == ts:
                return message
        return None

    @staticmethod
    def _updatable(message: StoredMessage) -> bool:
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
    def _rewrite(message: StoredMessage, text: str, blocks: list[dict[str, Any]] | None, edited_ts: str) -> None:
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

    # -- Web API -----------------------------------------------------------------------------------------------------

    def _web_api(self, impl: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Request], Response]:
        def handler(request: Request) -> Response:
            args = form_or_json(request)
            try:
                with self.ctx.lock:
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
        message = self.new_message(
            "dm" if dm else "message",
            channel,
            text,
            blocks,
            target="U" + channel[1:] if dm else None,
            thread_ts=str(thread_ts) if thread_ts else None,
        )
        echo = {**message.echo(), "bot_profile": {**BOT_PROFILE, "updated": int(self.ctx.clock.now())}}
        return {"channel": channel, "ts": message.ts, "message": echo}

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._resolve_channel(args.get("channel"))
        ts = args.get("ts")
        if not isinstance(ts, str) or not ts:
            raise SlackFailure("message_not_found")
        message = self.find_message(channel, ts)
        if message is None or message.deleted or not self._updatable(message):
            raise SlackFailure("message_not_found")
        if message.user != BOT_USER:
            raise SlackFailure("cant_update_message")
        text, blocks = self._message_content(args)
        edited_ts = self.next_ts()
        self._rewrite(message, text, blocks, edited_ts)
        echo = {**message.echo(), "edited": {"user": BOT_USER, "ts": edited_ts}}
        return {"channel": channel, "ts": ts, "text": text, "message": echo}

    def _chat_post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._resolve_channel(args.get("channel"))
        user = self._user(args.get("user"))["id"]
        text, blocks = self._message_content(args)
        thread_ts = args.get("thread_ts") or None
        message = self.new_message(
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

    def new_hash(self) -> str:
        """A view hash, new on every change of the view."""
        return f"{int(self.ctx.clock.now())}.{secrets.token_hex(4)}"

    def _views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        trigger_id = args.get("trigger_id")
        if not isinstance(trigger_id, str) or not TRIGGER_RE.match(trigger_id):
            raise SlackFailure("invalid_trigger_id")
        trigger = self.triggers.get(trigger_id)
        if trigger is None:
            raise SlackFailure("invalid_trigger_id")
        if trigger.used:
            raise SlackFailure("exchanged_trigger_id")
        if self.ctx.clock.now() - trigger.issued > TRIGGER_TTL_S:
            raise SlackFailure("expired_trigger_id")
        view = self._parse_view(args)
        trigger.used = True
        view_id = self.next_view_id()
        stored = StoredView(view_id, trigger.user, copy.deepcopy(decorate(view)), self.new_hash(), view_id)
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
        stored.view = copy.deepcopy(decorate(view))
        stored.hash = self.new_hash()
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
                "created": int(self.ctx.clock.now()),
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
        fault = self.ctx.faults.pick(request.path)
        if fault is not None:
            if self.ctx.faults.served_first(fault):
                self._post_to_sink(request, token)
            response = _text(fault, "rate_limited" if fault == 429 else "service_unavailable")
            if fault == 429:
                response.headers["Retry-After"] = "1"
            return response
        return self._post_to_sink(request, token)

    def _post_to_sink(self, request: Request, token: str) -> Response:
        body = _webhook_body(request)
        if body is None:
            return _text(400, "invalid_payload")
        with self.ctx.lock:
            sink = self.sinks.get(token)
            if sink is None:
                return _text(404, "no_service")
            if self.ctx.clock.now() - sink.created > RESPONSE_URL_TTL_S:
                return _text(404, "expired_url")
            if sink.uses >= RESPONSE_URL_USES:
                return _text(404, "used_url")
            return self._use_sink(sink, body)

    def _use_sink(self, sink: ResponseSink, body: dict[str, Any]) -> Response:
        original_ts = sink.source_ts or sink.last_ts
        original = self.find_message(sink.channel, original_ts) if original_ts else None
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
            self._rewrite(original, text, blocks, self.next_ts())
            return _text(200, "ok")
        response_type = "in_channel" if body.get("response_type") == "in_channel" else "ephemeral"
        thread_ts = body.get("thread_ts")
        message = self.new_message(
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
        with self.ctx.lock:
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

    def _views_get(self, request: Request) -> Response:
        with self.ctx.lock:
            return json_response({"views": [v.inspect() for v in self.views.values()]})

    def _users_post(self, request: Request) -> Response:
        body = UsersBody.model_validate(json_object(request))
        with self.ctx.lock:
            for spec in body.users:
                self.users[spec.id] = self._user_object(spec)
        return json_response({"ok": True, "users": [u.id for u in body.users]})

    def _channels_post(self, request: Request) -> Response:
        body = ChannelsBody.model_validate(json_object(request))
        with self.ctx.lock:
            for spec in body.channels:
                self.channels[spec.id] = self._channel_object(spec)
        return json_response({"ok": True, "channels": [c.id for c in body.channels]})

    def _usergroups_post(self, request: Request) -> Response:
        body = UsergroupsBody.model_validate(json_object(request))
        with self.ctx.lock:
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
        with self.ctx.lock:
            self.known_user(body.user)
            return json_response({"trigger_id": self.new_trigger(body.user)})

    def known_user(self, user: str) -> dict[str, Any]:
        """A seeded member, or a 400 that says how to seed it."""
        found = self.users.get(user)
        if found is None:
            raise ApiError(400, f"unknown user {user}: seed it with POST /_sandbox/slack/users")
        return found

    def known_channel(self, channel: str) -> tuple[str, str]:
        """Channel id and name of a seeded channel or DM, or a 400 that says how to seed it."""
        try:
            cid = self._resolve_channel(channel)
        except SlackFailure:
            raise ApiError(400, f"unknown channel {channel}: seed it with POST /_sandbox/slack/channels") from None
        name = self.channels[cid]["name"] if cid in self.channels else "directmessage"
        return cid, name


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
