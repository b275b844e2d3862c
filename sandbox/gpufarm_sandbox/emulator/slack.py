"""Sandbox module: the Slack Web API methods gpufarm calls, response_url sinks, and the Slack control plane.

Answer shapes follow the contract fixtures (tests/fixtures/slack, copied from contracts/slack). Errors are HTTP 200
`{"ok": false, "error": ...}` as Slack sends them; 429 comes from the sandbox's fault injection. Block Kit checks live
in `slack_blockkit`, the workspace's ids and stored objects in `slack_workspace`, and the simulated users who sign and
POST real-shaped slash commands and interactions to the app in `slack_users`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.slack_app import SlackApp
from gpufarm_sandbox.emulator.slack_blockkit import (
    MAX_VIEW_BYTES,
    decorate,
    view_errors,
)
from gpufarm_sandbox.emulator.slack_files import SlackFiles
from gpufarm_sandbox.emulator.slack_page import SlackPage
from gpufarm_sandbox.emulator.slack_state import SlackState
from gpufarm_sandbox.emulator.slack_users import SimulatedUsers
from gpufarm_sandbox.emulator.slack_workspace import (
    BOT_ID,
    BOT_NAME,
    BOT_PROFILE,
    BOT_USER,
    TEAM_DOMAIN,
    TEAM_ID,
    TEAM_NAME,
    TRIGGER_RE,
    ChannelsBody,
    ResponseSink,
    SlackFailure,
    StoredView,
    TriggerBody,
    UsergroupsBody,
    UsersBody,
)
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, form_or_json, json_object, json_response, slack_error

SCOPES_HEADER = "x-oauth-scopes"
TRIGGER_TTL_S = 3.0  # trigger_id lives 3 s and works once
RESPONSE_URL_USES = 5  # response_url: at most 5 uses within 30 minutes
RESPONSE_URL_TTL_S = 1800.0


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
        self.state = SlackState(context)
        self.simulated = SimulatedUsers(context, self.state)
        self.files = SlackFiles(context, self.state)
        # The installed app (its Request URL, kept across resets) and the page that plays its users.
        self.app = SlackApp(context, self.state)
        self.page = SlackPage(context, self.state, self.app)
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
            "views.publish": self._views_publish,
            "users.info": self._users_info,
            "conversations.open": self._conversations_open,
            "conversations.info": self._conversations_info,
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
            *self.app.routes(),
            *self.page.routes(),
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
            self.state.reset()
            self.files.reset()

    def dump(self) -> dict[str, Any]:
        """Directory, messages, views and deliveries; response_url tokens are capabilities and never shown."""
        with self.ctx.lock:
            return {
                "users": sorted(self.state.users),
                "channels": {cid: c["name"] for cid, c in self.state.channels.items()},
                "usergroups": {
                    gid: {"handle": g["handle"], "users": g["users"]} for gid, g in self.state.usergroups.items()
                },
                "messages": [m.to_json() for m in self.state.messages],
                "views": [v.inspect() for v in self.state.views.values()],
                "response_urls": {
                    "count": len(self.state.sinks),
                    "uses": sum(s.uses for s in self.state.sinks.values()),
                },
                "deliveries": list(self.state.deliveries),
                "files": self.files.dump(),
            }

    # -- helpers -----------------------------------------------------------------------------------------------------

    # -- Web API -----------------------------------------------------------------------------------------------------

    def _web_api(self, impl: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Request], Response]:
        def handler(request: Request) -> Response:
            args = form_or_json(request)
            try:
                with self.ctx.lock:
                    scopes = ",".join(self.state.scopes)
                    body = impl(args)
            except SlackFailure as exc:
                response = slack_error(exc.code, 200, **exc.extra)
            else:
                response = json_response({"ok": True, **body})
            # Slack names the token's scopes on every Web API answer, errors included.
            response.headers[SCOPES_HEADER] = scopes
            return response

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
        channel = self.state.resolve_channel(args.get("channel"))
        text, blocks = self.state.message_content(args)
        thread_ts = args.get("thread_ts") or None
        dm = channel.startswith("D")
        message = self.state.new_message(
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
        channel = self.state.resolve_channel(args.get("channel"))
        ts = args.get("ts")
        if not isinstance(ts, str) or not ts:
            raise SlackFailure("message_not_found")
        message = self.state.find_message(channel, ts)
        if message is None or message.deleted or not self.state.updatable(message):
            raise SlackFailure("message_not_found")
        if message.user != BOT_USER:
            raise SlackFailure("cant_update_message")
        text, blocks = self.state.message_content(args)
        edited_ts = self.state.next_ts()
        self.state.rewrite(message, text, blocks, edited_ts)
        echo = {**message.echo(), "edited": {"user": BOT_USER, "ts": edited_ts}}
        return {"channel": channel, "ts": ts, "text": text, "message": echo}

    def _chat_post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self.state.resolve_channel(args.get("channel"))
        user = self.state.user(args.get("user"))["id"]
        text, blocks = self.state.message_content(args)
        thread_ts = args.get("thread_ts") or None
        message = self.state.new_message(
            "ephemeral", channel, text, blocks, target=user, thread_ts=str(thread_ts) if thread_ts else None
        )
        return {"message_ts": message.ts}

    def _parse_view(self, args: dict[str, Any]) -> dict[str, Any]:
        view = self.state.json_arg(args, "view", "invalid_arguments")
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

    def _views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        trigger_id = args.get("trigger_id")
        if not isinstance(trigger_id, str) or not TRIGGER_RE.match(trigger_id):
            raise SlackFailure("invalid_trigger_id")
        trigger = self.state.triggers.get(trigger_id)
        if trigger is None:
            raise SlackFailure("invalid_trigger_id")
        if trigger.used:
            raise SlackFailure("exchanged_trigger_id")
        if self.ctx.clock.now() - trigger.issued > TRIGGER_TTL_S:
            raise SlackFailure("expired_trigger_id")
        view = self._parse_view(args)
        trigger.used = True
        view_id = self.state.next_view_id()
        stored = StoredView(view_id, trigger.user, copy.deepcopy(decorate(view)), self.state.new_hash(), view_id)
        self.state.views[view_id] = stored
        return {"view": stored.to_json()}

    def _views_update(self, args: dict[str, Any]) -> dict[str, Any]:
        view_id, external_id = args.get("view_id"), args.get("external_id")
        if not view_id and not external_id:
            raise SlackFailure(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing view_id or external_id"]}
            )
        stored = self.state.views.get(view_id) if isinstance(view_id, str) else None
        if stored is None and external_id:
            stored = next((v for v in self.state.views.values() if v.view.get("external_id") == external_id), None)
        if stored is None:
            raise SlackFailure("not_found")
        expected = args.get("hash")
        if expected and expected != stored.hash:
            raise SlackFailure("hash_conflict")
        view = self._parse_view(args)
        stored.view = copy.deepcopy(decorate(view))
        stored.hash = self.state.new_hash()
        stored.errors = {}
        stored.state_values = {}
        return {"view": stored.to_json()}

    def _views_publish(self, args: dict[str, Any]) -> dict[str, Any]:
        """A user's App Home: the whole view replaces the last one; a stale `hash` is a hash_conflict."""
        user = self.state.user(args.get("user_id"))["id"]
        view = self._parse_view(args)
        if view.get("type") != "home":
            raise SlackFailure(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] views.publish takes a home view"]}
            )
        known = self.state.views.get(self.state.homes.get(user, ""))
        expected = args.get("hash")
        if known is not None and expected and expected != known.hash:
            raise SlackFailure("hash_conflict")
        view_id = known.id if known is not None else self.state.next_view_id()
        stored = StoredView(view_id, user, copy.deepcopy(decorate(view)), self.state.new_hash(), view_id)
        self.state.views[view_id] = stored
        self.state.homes[user] = view_id
        return {"view": stored.to_json()}

    def _users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"user": self.state.user(args.get("user"))}

    def _conversations_open(self, args: dict[str, Any]) -> dict[str, Any]:
        users = args.get("users")
        channel = args.get("channel")
        if channel and not users:
            cid = self.state.resolve_channel(channel)
            return {"channel": {"id": cid}}
        if not users:
            raise SlackFailure("users_list_not_supplied")
        ids = users if isinstance(users, list) else [u.strip() for u in str(users).split(",") if u.strip()]
        if len(ids) != 1:
            # Group DMs are not something gpufarm opens; Slack would create an mpim.
            raise SlackFailure("not_enough_users" if not ids else "too_many_users")
        user = self.state.user(ids[0])["id"]
        dm = self.state.dm_channel(user)
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

    def _conversations_info(self, args: dict[str, Any]) -> dict[str, Any]:
        channel_id = args.get("channel")
        if not isinstance(channel_id, str) or not channel_id:
            raise SlackFailure("channel_not_found")
        stored = self.state.channels.get(channel_id)
        needed = "groups:read" if stored is not None and stored["is_private"] else "channels:read"
        if needed not in self.state.scopes:
            raise SlackFailure("missing_scope", needed=needed, provided=",".join(self.state.scopes))
        # A private channel is invisible to a bot that is not in it, as in Slack.
        if stored is None or (stored["is_private"] and not stored["is_member"]):
            raise SlackFailure("channel_not_found")
        return {"channel": self._channel_info(stored)}

    def _channel_info(self, stored: dict[str, Any]) -> dict[str, Any]:
        """A channel as conversations.info describes it (tests/fixtures/slack/web_api/conversations.info.ok.json)."""
        private = bool(stored["is_private"])
        created = int(self.ctx.clock.now())
        return {
            "id": stored["id"],
            "name": stored["name"],
            "is_channel": not private,
            "is_group": private,
            "is_im": False,
            "is_mpim": False,
            "is_private": private,
            "created": created,
            "is_archived": False,
            "is_general": False,
            "unlinked": 0,
            "name_normalized": stored["name"],
            "is_shared": False,
            "is_org_shared": False,
            "is_pending_ext_shared": False,
            "pending_shared": [],
            "context_team_id": TEAM_ID,
            "updated": created * 1000,
            "parent_conversation": None,
            "creator": "U0000000002",
            "is_ext_shared": False,
            "shared_team_ids": [TEAM_ID],
            "pending_connected_team_ids": [],
            "is_member": bool(stored["is_member"]),
            "last_read": "0000000000.000000",
            "topic": {"value": "", "creator": "", "last_set": 0},
            "purpose": {"value": "", "creator": "", "last_set": 0},
            "previous_names": [],
        }

    def _usergroups_users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        group_id = args.get("usergroup")
        if not group_id:
            raise SlackFailure(
                "invalid_arguments", response_metadata={"messages": ["[ERROR] missing required field: usergroup"]}
            )
        group = self.state.usergroups.get(str(group_id))
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
            sink = self.state.sinks.get(token)
            if sink is None:
                return _text(404, "no_service")
            if self.ctx.clock.now() - sink.created > RESPONSE_URL_TTL_S:
                return _text(404, "expired_url")
            if sink.uses >= RESPONSE_URL_USES:
                return _text(404, "used_url")
            return self._use_sink(sink, body)

    def _use_sink(self, sink: ResponseSink, body: dict[str, Any]) -> Response:
        original_ts = sink.source_ts or sink.last_ts
        original = self.state.find_message(sink.channel, original_ts) if original_ts else None
        if _truthy(body.get("delete_original", False)):
            sink.uses += 1
            if original is not None:
                original.deleted = True
            return _text(200, "ok")
        try:
            text, blocks = self.state.message_content(body)
        except SlackFailure as exc:
            return _text(400, exc.code)
        sink.uses += 1
        if _truthy(body.get("replace_original", False)) and original is not None and not original.deleted:
            self.state.rewrite(original, text, blocks, self.state.next_ts())
            return _text(200, "ok")
        response_type = "in_channel" if body.get("response_type") == "in_channel" else "ephemeral"
        thread_ts = body.get("thread_ts")
        message = self.state.new_message(
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
            found = [
                m.to_json() for m in self.state.find_messages(channel=channel, user=user, contains=contains, kind=kind)
            ]
        return json_response({"messages": found})

    def _views_get(self, request: Request) -> Response:
        with self.ctx.lock:
            return json_response({"views": [v.inspect() for v in self.state.views.values()]})

    def _users_post(self, request: Request) -> Response:
        body = UsersBody.model_validate(json_object(request))
        with self.ctx.lock:
            for spec in body.users:
                self.state.users[spec.id] = self.state.user_object(spec)
        return json_response({"ok": True, "users": [u.id for u in body.users]})

    def _channels_post(self, request: Request) -> Response:
        body = ChannelsBody.model_validate(json_object(request))
        with self.ctx.lock:
            for spec in body.channels:
                self.state.channels[spec.id] = self.state.channel_object(spec)
        return json_response({"ok": True, "channels": [c.id for c in body.channels]})

    def _usergroups_post(self, request: Request) -> Response:
        body = UsergroupsBody.model_validate(json_object(request))
        with self.ctx.lock:
            unknown = sorted({u for g in body.usergroups for u in g.users} - set(self.state.users))
            if unknown:
                raise ApiError(400, f"unknown users (seed them first): {', '.join(unknown)}")
            for spec in body.usergroups:
                self.state.usergroups[spec.id] = {
                    "id": spec.id,
                    "handle": spec.handle,
                    "name": spec.name or spec.handle,
                    "users": list(dict.fromkeys(spec.users)),
                }
        return json_response({"ok": True, "usergroups": [g.id for g in body.usergroups]})

    def _triggers_post(self, request: Request) -> Response:
        body = TriggerBody.model_validate(json_object(request))
        with self.ctx.lock:
            self.state.known_user(body.user)
            return json_response({"trigger_id": self.state.new_trigger(body.user)})


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
