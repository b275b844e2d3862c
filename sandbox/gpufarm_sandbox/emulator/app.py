"""The sandbox WSGI application: routing, auth, fault injection and the `/_sandbox/` control plane."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from pydantic import ValidationError
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.account import AccountModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.counter import RequestCounter
from gpufarm_sandbox.emulator.dashboard_pages import DashboardPagesModule
from gpufarm_sandbox.emulator.dashboards import DashboardsModule
from gpufarm_sandbox.emulator.events import EventsModule
from gpufarm_sandbox.emulator.faults import FaultSpec
from gpufarm_sandbox.emulator.hosts import HostsModule
from gpufarm_sandbox.emulator.incidents import IncidentsModule
from gpufarm_sandbox.emulator.kube_nodes import KubeNodesModule
from gpufarm_sandbox.emulator.kube_pods import KubePodsModule
from gpufarm_sandbox.emulator.metric_metadata import MetricMetadataModule
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.monitors import MonitorsModule
from gpufarm_sandbox.emulator.pages import PagesModule
from gpufarm_sandbox.emulator.quirks import QUIRKS, parse_quirks
from gpufarm_sandbox.emulator.ratelimit import RateLimiter, RateLimitSpec
from gpufarm_sandbox.emulator.slack import SlackModule
from gpufarm_sandbox.emulator.web import (
    ApiError,
    Auth,
    Route,
    dd_error,
    json_body,
    json_object,
    json_response,
    slack_error,
)
from gpufarm_sandbox.emulator.webhooks import WebhooksModule

log = logging.getLogger("gpufarm_sandbox.emulator")

DEFAULT_DD_API_KEY = "sandbox-dd-api-key"
DEFAULT_DD_APP_KEY = "sandbox-dd-app-key"
DEFAULT_SLACK_TOKEN = "xoxb-sandbox-token"
DEFAULT_SLACK_SIGNING_SECRET = "sandbox-signing-secret-0000000000"


class Module(Protocol):
    """One API area of the sandbox."""

    name: str

    def routes(self) -> list[Route]:
        """Endpoints this module serves."""

    def reset(self) -> None:
        """Forget everything."""

    def dump(self) -> dict[str, Any]:
        """State for `GET /_sandbox/state`."""


class Sandbox:
    """Datadog + Slack in one WSGI app; every module shares the clock, the lock and the fault plan."""

    def __init__(
        self,
        *,
        dd_api_keys: Iterable[str] = (DEFAULT_DD_API_KEY,),
        dd_app_keys: Iterable[str] = (DEFAULT_DD_APP_KEY,),
        slack_tokens: Iterable[str] = (DEFAULT_SLACK_TOKEN,),
        slack_signing_secret: str = DEFAULT_SLACK_SIGNING_SECRET,
        base_url: str = "http://127.0.0.1:8320",
        quirks: str | Iterable[str] = (),
    ) -> None:
        """quirks: the Datadog quirk modes to play (emulator.quirks; names or a comma-separated list, or `all`);
        an unknown name is a ValueError."""
        self.dd_api_keys = frozenset(dd_api_keys)
        self.dd_app_keys = frozenset(dd_app_keys)
        self.slack_tokens = frozenset(slack_tokens)
        self.context = SandboxContext(
            base_url=base_url.rstrip("/"), slack_signing_secret=slack_signing_secret, quirks=parse_quirks(quirks)
        )
        self.clock = self.context.clock
        self.faults = self.context.faults
        self.lock = self.context.lock
        self.requests = RequestCounter()
        self.ratelimits = RateLimiter()
        # Each module gets the shared context and the siblings it reads or notifies, nothing more.
        ctx = self.context
        self.webhooks = WebhooksModule(ctx)
        self.hosts = HostsModule(ctx)
        self.metrics = MetricsModule(ctx, self.hosts)
        self.incidents = IncidentsModule(ctx, self.webhooks)
        self.monitors = MonitorsModule(ctx, self.metrics, self.webhooks)
        self.dashboards = DashboardsModule(ctx)
        self.metric_metadata = MetricMetadataModule(ctx, self.metrics)
        self.events = EventsModule(ctx)
        self.account = AccountModule(ctx)
        # The local view of the stored dashboards (HTML pages, not Datadog's API).
        self.dashboard_pages = DashboardPagesModule(ctx, self.dashboards, self.metrics, self.metric_metadata)
        self.slack = SlackModule(ctx)
        # The incident and metrics pages gpufarm's links open locally (HTML for people, not Datadog's API).
        self.pages = PagesModule(ctx, self.incidents, self.metrics, self.monitors.evaluator, self.slack.state)
        # The Kubernetes API's Node endpoints the node agent's Kubernetes step uses (not Datadog's or Slack's).
        self.kube_nodes = KubeNodesModule(ctx)
        # Its pods, as far as the agent's evictions of squatting pods need them.
        self.kube_pods = KubePodsModule(ctx)
        self.modules: list[Module] = [
            self.webhooks,
            self.hosts,
            self.metrics,
            self.incidents,
            self.monitors,
            self.dashboards,
            self.metric_metadata,
            self.events,
            self.account,
            self.dashboard_pages,
            self.slack,
            self.pages,
            self.kube_nodes,
            self.kube_pods,
        ]
        self._extra: list[Route] = []
        self._build_map()

    @property
    def base_url(self) -> str:
        """Where the sandbox is served; set once a server's port is known."""
        return self.context.base_url

    @base_url.setter
    def base_url(self, url: str) -> None:
        self.context.base_url = url

    @property
    def quirks(self) -> frozenset[str]:
        """The Datadog quirk modes this sandbox plays (emulator.quirks); none by default."""
        return self.context.quirks

    @property
    def slack_signing_secret(self) -> str:
        """Signs the slash commands and clicks the sandbox sends to the app on a simulated user's behalf."""
        return self.context.slack_signing_secret

    # -- wiring -----------------------------------------------------------------------------------

    def add_routes(self, routes: Iterable[Route]) -> None:
        """Serve more endpoints (the local function host mounts `/fn/...` this way)."""
        self._extra.extend(routes)
        self._build_map()

    def serves(self, path: str, method: str = "GET") -> bool:
        """Whether a request for path would reach a route (e.g. a page another module mounts)."""
        return bool(self._map.bind("sandbox.local").test(path, method))

    def _control_routes(self) -> list[Route]:
        return [
            Route("/_sandbox/health", ("GET",), self._health, Auth.NONE),
            Route("/_sandbox/state", ("GET",), self._state, Auth.NONE),
            Route("/_sandbox/reset", ("POST",), self._reset, Auth.NONE),
            Route("/_sandbox/clock", ("GET",), self._clock_get, Auth.NONE),
            Route("/_sandbox/clock", ("POST",), self._clock_post, Auth.NONE),
            Route("/_sandbox/faults", ("GET",), self._faults_get, Auth.NONE),
            Route("/_sandbox/faults", ("POST",), self._faults_post, Auth.NONE),
            Route("/_sandbox/faults", ("DELETE",), self._faults_delete, Auth.NONE),
            Route("/_sandbox/requests", ("GET",), self._requests_get, Auth.NONE),
            Route("/_sandbox/requests", ("DELETE",), self._requests_delete, Auth.NONE),
            Route("/_sandbox/ratelimits", ("GET",), self._ratelimits_get, Auth.NONE),
            Route("/_sandbox/ratelimits", ("POST",), self._ratelimits_post, Auth.NONE),
            Route("/_sandbox/ratelimits", ("DELETE",), self._ratelimits_delete, Auth.NONE),
        ]

    def _build_map(self) -> None:
        routes = self._control_routes() + [r for m in self.modules for r in m.routes()] + self._extra
        self._map = Map([Rule(r.path, methods=list(r.methods), endpoint=r) for r in routes], strict_slashes=False)

    # -- WSGI ---------------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        response = self.handle(request)
        return response(environ, start_response)

    def handle(self, request: Request) -> Response:
        """Route one request through auth, faults and its handler; errors always come in the API's dialect."""
        path = request.path
        slack = path.startswith("/slack/")
        api = path.startswith(("/api/", "/slack/api/"))
        try:
            adapter = self._map.bind_to_environ(request.environ)
            route, args = adapter.match()
        except (NotFound, MethodNotAllowed) as missing:
            if api:
                self.requests.count(request.method, path)
            if isinstance(missing, NotFound):
                return slack_error("unknown_method", 404) if slack else dd_error(404, "Not found")
            return slack_error("method_not_supported", 405) if slack else dd_error(405, "Method Not Allowed")
        assert isinstance(route, Route)
        if api:
            self.requests.count(request.method, route.path)
        denied = self._check_auth(route.auth, request)
        if denied is not None:
            return denied
        # Every Datadog answer past authentication says where its rate limit stands (docs/datadog.md, "Rate limits").
        limit = self.ratelimits.admit(path) if path.startswith("/api/") else None
        if limit is None:
            return self._serve(request, route, args, slack=slack, api=api)
        if not limit.allowed:
            return dd_error(429, "Too many requests", headers=limit.headers())
        response = self._serve(request, route, args, slack=slack, api=api)
        for name, value in limit.headers().items():
            response.headers.setdefault(name, value)  # an injected 429 keeps its own
        return response

    def _serve(self, request: Request, route: Route, args: Mapping[str, Any], *, slack: bool, api: bool) -> Response:
        """Injected faults, then the route's handler; errors in the API's dialect."""
        path = request.path
        if api:
            delay = self.faults.latency_s(path)
            if delay:
                time.sleep(delay)
            status = self.faults.pick(path)
            if status is not None:
                if self.faults.served_first(status):
                    self._handle_route(request, route, args, slack=slack)
                return self._fault_response(status, slack)
        return self._handle_route(request, route, args, slack=slack)

    def _handle_route(self, request: Request, route: Route, args: Mapping[str, Any], *, slack: bool) -> Response:
        path = request.path
        try:
            return route.handler(request, **args)
        except ApiError as exc:
            return slack_error(exc.messages[0], exc.status) if slack else dd_error(exc.status, *exc.messages)
        except ValidationError as exc:
            return slack_error("invalid_arguments", 200) if slack else dd_error(400, *_pydantic_messages(exc))
        except Exception:
            log.exception("sandbox handler failed for %s %s", request.method, path)
            return slack_error("internal_error", 500) if slack else dd_error(500, "Internal Server Error")

    def _check_auth(self, auth: Auth, request: Request) -> Response | None:
        if auth is Auth.NONE:
            return None
        if auth is Auth.SLACK:
            header = request.headers.get("Authorization", "")
            token = header[7:].strip() if header.lower().startswith("bearer ") else request.values.get("token", "")
            if not token:
                return slack_error("not_authed")
            if not _known(token, self.slack_tokens):
                return slack_error("invalid_auth")
            return None
        api_key = request.headers.get("DD-API-KEY", "")
        if not _known(api_key, self.dd_api_keys):
            return dd_error(403, "Forbidden")
        if auth is Auth.DD_APP and not _known(request.headers.get("DD-APPLICATION-KEY", ""), self.dd_app_keys):
            return dd_error(403, "Forbidden")
        return None

    def _fault_response(self, status: int, slack: bool) -> Response:
        if slack:
            if status == 429:
                response = slack_error("ratelimited", 429)
                response.headers["Retry-After"] = "1"
                return response
            return slack_error("fatal_error", status)
        headers: dict[str, str] = {}
        if status == 429:
            headers = {
                "X-RateLimit-Limit": "100",
                "X-RateLimit-Period": "10",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": "1",
                "X-RateLimit-Name": "sandbox_fault",
            }
        return dd_error(status, "Too many requests" if status == 429 else "Internal Server Error", headers=headers)

    # -- control plane ------------------------------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """Every module's state, the clock, the fault plan and the Datadog quirks played."""
        with self.lock:
            out: dict[str, Any] = {m.name: m.dump() for m in self.modules}
        out["clock"] = self._clock_dict()
        out["faults"] = self.faults.dump()
        out["quirks"] = [name for name in QUIRKS if name in self.quirks]
        return out

    def reset(self) -> None:
        """Forget all state, clear faults and return to real time."""
        with self.lock:
            for module in self.modules:
                module.reset()
        self.faults.clear()
        self.clock.reset()
        self.requests.clear()
        self.ratelimits.clear()

    def _health(self, request: Request) -> Response:
        return json_response({"ok": True})

    def _state(self, request: Request) -> Response:
        return json_response(self.dump())

    def _reset(self, request: Request) -> Response:
        self.reset()
        return json_response({"ok": True})

    def _clock_dict(self) -> dict[str, Any]:
        return {"now": self.clock.now(), "iso": self.clock.now_dt().isoformat(), "offset": self.clock.offset}

    def _clock_get(self, request: Request) -> Response:
        return json_response(self._clock_dict())

    def _clock_post(self, request: Request) -> Response:
        body = json_object(request)
        advance = body.get("advance")
        if isinstance(advance, bool) or not isinstance(advance, (int, float)) or advance < 0:
            raise ApiError(400, 'body must be {"advance": <non-negative seconds>}')
        self.clock.advance(float(advance))
        return json_response(self._clock_dict())

    def _faults_get(self, request: Request) -> Response:
        return json_response(self.faults.dump())

    def _faults_post(self, request: Request) -> Response:
        body = json_body(request)
        self.faults.configure(FaultSpec.model_validate(body))
        return json_response(self.faults.dump())

    def _faults_delete(self, request: Request) -> Response:
        self.faults.clear()
        return json_response(self.faults.dump())

    def _requests_get(self, request: Request) -> Response:
        return json_response(self.requests.dump())

    def _requests_delete(self, request: Request) -> Response:
        self.requests.clear()
        return json_response(self.requests.dump())

    def _ratelimits_get(self, request: Request) -> Response:
        return json_response(self.ratelimits.dump())

    def _ratelimits_post(self, request: Request) -> Response:
        try:
            self.ratelimits.configure(RateLimitSpec.model_validate(json_body(request)))
        except ValueError as exc:
            if isinstance(exc, ValidationError):
                raise
            raise ApiError(400, str(exc)) from None
        return json_response(self.ratelimits.dump())

    def _ratelimits_delete(self, request: Request) -> Response:
        self.ratelimits.clear()
        return json_response(self.ratelimits.dump())


def _known(secret: str, allowed: frozenset[str]) -> bool:
    return bool(secret) and any(hmac.compare_digest(secret.encode(), key.encode()) for key in allowed)


def _pydantic_messages(exc: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()] or ["Bad Request"]
