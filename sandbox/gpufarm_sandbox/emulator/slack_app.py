"""The Slack app installed in the sandbox's workspace, and the Events API callbacks Slack sends it.

A real app names its Request URL in its manifest (slash commands, interactivity and event subscriptions: gpufarm's
manifest gives all three the ingress's URL); here `POST /_sandbox/slack/app` installs it (the local function host
does so with its ingress), and the Slack page sends what its user does there. `POST /_sandbox/slack/events`
plays the events gpufarm subscribes to: `app_home_opened` when a user opens the app's Home tab, as Slack sends it
(a signed JSON `event_callback` carrying the user's DM channel, the tab and the Home view published so far).
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Literal

from pydantic import Field
from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.slack_dispatch import JSON, check_url, signed_post
from gpufarm_sandbox.emulator.slack_workspace import (
    APP_ID,
    BOT_USER,
    MAX_MESSAGES_KEPT,
    TEAM_ID,
    USER_RE,
    VERIFICATION_TOKEN,
    StrictBody,
)
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_object, json_response

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.context import SandboxContext
    from gpufarm_sandbox.emulator.slack_state import SlackState

EVENTS = ("app_home_opened",)


class AppBody(StrictBody):
    """`POST /_sandbox/slack/app`: install the app (its Request URL for commands, interactivity and events)."""

    request_url: str = Field(max_length=2000)


class EventBody(StrictBody):
    """`POST /_sandbox/slack/events`: a user does what raises an event the app subscribes to."""

    user: str = Field(pattern=USER_RE.pattern)
    type: Literal["app_home_opened"] = "app_home_opened"
    tab: Literal["home", "messages"] = "home"
    url: str | None = Field(default=None, max_length=2000)


class SlackApp:
    """The installed app's Request URL (kept across resets, as an installation is) and its event callbacks."""

    def __init__(self, context: SandboxContext, state: SlackState) -> None:
        self.ctx = context
        self.state = state
        self.request_url: str | None = None

    def routes(self) -> list[Route]:
        """The app's installation and the events it is sent."""
        return [
            Route("/_sandbox/slack/app", ("GET",), self._app_get, Auth.NONE),
            Route("/_sandbox/slack/app", ("POST",), self._app_post, Auth.NONE),
            Route("/_sandbox/slack/events", ("POST",), self._events_post, Auth.NONE),
        ]

    def install(self, request_url: str) -> None:
        """Install the app with its Request URL."""
        check_url(request_url)
        self.request_url = request_url

    def _app_get(self, request: Request) -> Response:
        return json_response({"request_url": self.request_url, "events": list(EVENTS)})

    def _app_post(self, request: Request) -> Response:
        body = AppBody.model_validate(json_object(request))
        self.install(body.request_url)
        return json_response({"ok": True, "request_url": self.request_url})

    def _events_post(self, request: Request) -> Response:
        body = EventBody.model_validate(json_object(request))
        url = body.url or self.request_url
        if not url:
            raise ApiError(400, "no app is installed: POST /_sandbox/slack/app {request_url} first, or pass url")
        check_url(url)
        with self.ctx.lock:
            self.state.known_user(body.user)
            home = self.state.views.get(self.state.homes.get(body.user, ""))
            event: dict[str, object] = {
                "type": body.type,
                "user": body.user,
                "channel": self.state.dm_channel(body.user),
                "tab": body.tab,
                "event_ts": self.state.next_ts(),
            }
            if home is not None:
                event["view"] = home.to_json()
            payload = {
                "token": VERIFICATION_TOKEN,
                "team_id": TEAM_ID,
                "api_app_id": APP_ID,
                "event": event,
                "type": "event_callback",
                "event_id": "Ev" + secrets.token_hex(5).upper(),
                "event_time": int(self.ctx.clock.now()),
                "authorizations": [
                    {"team_id": TEAM_ID, "user_id": BOT_USER, "is_bot": True, "is_enterprise_install": False}
                ],
                "is_ext_shared_channel": False,
            }
        result = signed_post(self.ctx, url, json.dumps(payload, separators=(",", ":")).encode(), JSON)
        with self.ctx.lock:
            self.state.deliveries.append(
                {
                    "kind": f"event:{body.type}",
                    "user": body.user,
                    "url": url,
                    "status": result.status,
                    "latency_ms": result.latency_ms,
                    "error": result.error,
                    "late": False,
                }
            )
            if len(self.state.deliveries) > MAX_MESSAGES_KEPT:
                del self.state.deliveries[0]
        return json_response(
            {"status": result.status, "body": result.body, "latency_ms": result.latency_ms, "error": result.error}
        )
