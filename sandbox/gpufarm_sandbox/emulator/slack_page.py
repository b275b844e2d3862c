"""The Slack page: a Slack-like client of the sandbox's workspace at `/slack`, for people trying gpufarm locally.

Choose who you are (the workspace's members), read channels and your DM with the app, type `/gpu …`, click
buttons, fill modals and open the app's Home tab. The page is static HTML, one vanilla JS file and one stylesheet
(no build step, no CDN) under a strict Content-Security-Policy: no inline script or style, nothing from elsewhere.
It goes through the same path as Slack: what its user does is sent by the sandbox's simulated users
(`/_sandbox/slack/commands`, `/_sandbox/slack/interactions`, `/_sandbox/slack/events`), signed, to the installed
app's Request URL, and what it shows is what the app put into the workspace through the Web API.

`GET /_sandbox/slack/page?user=U…` is the page's one read: the members and channels, and what that user sees:
channel messages, their DM with the app, ephemeral messages shown to them alone (never another's), their open
modal and their Home.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.slack_workspace import BOT_NAME, BOT_USER, USER_RE, StoredMessage
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_response

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.context import SandboxContext
    from gpufarm_sandbox.emulator.slack_app import SlackApp
    from gpufarm_sandbox.emulator.slack_state import SlackState

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
ASSETS = {
    "/slack": ("slack.html", "text/html; charset=utf-8"),
    "/slack/page.js": ("slack.js", "text/javascript; charset=utf-8"),
    "/slack/page.css": ("slack.css", "text/css; charset=utf-8"),
}
MESSAGES_SHOWN = 200  # the newest messages per conversation


def _asset(name: str) -> bytes:
    return resources.files("gpufarm_sandbox.emulator").joinpath("static", name).read_bytes()


class SlackPage:
    """Serves the page and its read of the workspace."""

    def __init__(self, context: SandboxContext, state: SlackState, app: SlackApp) -> None:
        self.ctx = context
        self.state = state
        self.app = app

    def routes(self) -> list[Route]:
        """The page, its script and stylesheet, and its read."""
        return [
            *(Route(path, ("GET",), self._serve(name, ctype), Auth.NONE) for path, (name, ctype) in ASSETS.items()),
            Route("/_sandbox/slack/page", ("GET",), self._page_state, Auth.NONE),
        ]

    @staticmethod
    def _serve(name: str, content_type: str) -> Any:
        def handler(request: Request) -> Response:
            response = Response(_asset(name), content_type=content_type)
            response.headers["Content-Security-Policy"] = CSP
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["Referrer-Policy"] = "no-referrer"
            response.headers["Cache-Control"] = "no-store"
            return response

        return handler

    def _page_state(self, request: Request) -> Response:
        user = request.args.get("user") or ""
        with self.ctx.lock:
            members = [
                {"id": u["id"], "name": u["name"], "real_name": u["real_name"]}
                for u in sorted(self.state.users.values(), key=lambda u: u["id"])
                if not u["is_bot"] and not u["deleted"]
            ]
            out: dict[str, Any] = {
                "app": {"request_url": self.app.request_url},
                "users": members,
                # Each member's user groups by handle (the page labels the GPU operators).
                "usergroups": {g["handle"]: list(g["users"]) for g in self.state.usergroups.values()},
                "channels": [{"id": c["id"], "name": c["name"]} for c in self.state.channels.values()],
                "bot": {"id": BOT_USER, "name": BOT_NAME},
                "clock": self.ctx.clock.now(),
            }
            if not user:
                return json_response(out)
            if not USER_RE.match(user) or user not in self.state.users:
                raise ApiError(400, f"unknown user {user[:30]}")
            out["user"] = user
            out["dm"] = self.state.dm_channel(user)
            out["messages"] = self._visible(user)
            out["modal"] = self._modal(user)
            home = self.state.views.get(self.state.homes.get(user, ""))
            out["home"] = home.to_json() if home is not None else None
        return json_response(out)

    def _visible(self, user: str) -> dict[str, list[dict[str, Any]]]:
        """Per conversation, what `user` sees: channels' messages, their own DM, and what was shown to them alone."""
        dm = self.state.dm_channel(user)
        shown: dict[str, list[dict[str, Any]]] = {cid: [] for cid in self.state.channels}
        shown[dm] = []
        for message in self.state.messages:
            if message.deleted or not _sees(message, user, dm):
                continue
            shown.setdefault(message.channel, []).append(_shown(message))
        return {cid: rows[-MESSAGES_SHOWN:] for cid, rows in shown.items()}

    def _modal(self, user: str) -> dict[str, Any] | None:
        """The user's topmost open modal (the last opened or pushed), with the errors shown on it."""
        mine = [v for v in self.state.views.values() if v.user == user and v.status == "open"]
        modals = [v for v in mine if v.view.get("type", "modal") == "modal"]
        return modals[-1].inspect() if modals else None


def _sees(message: StoredMessage, user: str, dm: str) -> bool:
    if message.channel.startswith("D"):
        return message.channel == dm
    private = message.kind in ("ephemeral", "ack", "response") and message.response_type != "in_channel"
    return message.target == user if private else True


def _shown(message: StoredMessage) -> dict[str, Any]:
    private = message.kind in ("ephemeral", "ack", "response") and message.response_type != "in_channel"
    return {
        "ts": message.ts,
        "user": message.user,
        "text": message.text,
        "blocks": message.blocks,
        "edited": bool(message.history),
        "only_you": private,
        "thread_ts": message.thread_ts,
        "files": list(message.files),
    }
