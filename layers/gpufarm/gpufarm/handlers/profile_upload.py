"""The profile upload function (Function URL): profiler runs onto a lease for whoever holds its upload token.

Researchers' tools hold no Datadog key, link secret or AWS credential (docs/design.md, rule 14): every call carries
`Authorization: Bearer gfu1…` (the token `/gpu profile-token IR-n` gives), and this function does the rest.

- `POST /begin` `{"ir": 12, "batch_size": 32, "runs": [{"name": "run-7", "bytes": 123456, "file": "t.json.gz"}]}`
  → 200 `{"upload": <ticket>, "expires": <epoch>, "put_expires_in": 900, "runs": [{"name", "url"}]}`: PUT each
  trace's bytes to its URL.
- `POST /complete` `{"upload": <ticket>}` → 200 `{"runs": [{"name", "steps", "step_mean_ms", "link", "recorded"}]}`.

The body's size is checked from its length before anything else; then the token is verified (bounded, constant
time) and the lease re-read on both calls (gpufarm.profiling.intake). Refusals, each a short JSON reason, with
nothing stored and the token never echoed or logged: 401 a missing, forged, malformed or expired token or ticket;
403 a valid token that does not hold for this lease now (another lease, a user no longer on it); 409 a lease that
has ended (or an upload completed already); 413 a trace too large, declared or uploaded; 400 anything else wrong
with the request or the trace; 503 when a service failed (try again).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpufarm.adapters.profile_store import S3ProfileStore
from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotAllowed, NotFound, ValidationFailed
from gpufarm.core.kernel.upload_token import Claims, InvalidUploadToken, verify
from gpufarm.handlers import http, telemetry
from gpufarm.handlers import runtime as rt
from gpufarm.profiling import intake
from gpufarm.profiling.links import link_signer
from gpufarm.profiling.tickets import InvalidTicket

log = logging.getLogger(__name__)

# A begin names at most 16 runs (about 2 kB); a complete carries one ticket (at most 8 kB).
MAX_BODY_BYTES = 16 * 1024
ROUTES = ("/begin", "/complete")
# A token is at most upload_token.MAX_TOKEN_CHARS; a longer header is refused before it is looked at.
MAX_HEADER_CHARS = 512
_BEARER = "bearer "
_NO_STORE = {"Cache-Control": "no-store"}


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Begin or complete an upload for the bearer of an upload token."""
    if not http.is_url_event(event) or http.method(event) != "POST":
        return http.error(405, "only POST /begin and POST /complete")
    try:
        http.check_size(event, MAX_BODY_BYTES)
    except http.BadRequest as exc:
        return http.error(exc.status, exc.reason)
    try:
        runtime = rt.current()
        key = runtime.settings.require("upload_token_secret").encode()
    except rt.ConfigurationError as exc:
        log.error("profile upload misconfigured: %s", exc)  # noqa: TRY400 - no traceback needed
        return http.error(500, "not configured")
    route = str(event.get("rawPath") or "").rstrip("/")[-20:]
    if route not in ROUTES:
        return http.error(404, "POST /begin or /complete")
    try:
        claims = verify(_bearer(event), key, runtime.clock().now())
        telemetry.correlate(ir=claims.ir, slack_user=claims.user)
        body = http.json_body(event, MAX_BODY_BYTES)
        answer = _begin(runtime, claims, key, body) if route == "/begin" else _complete(runtime, claims, key, body)
    except (http.BadRequest, GpufarmError) as exc:
        return http.error(*_refusal(exc))
    return http.respond(200, answer, _NO_STORE)


def _refusal(exc: Exception) -> tuple[int, str]:
    """The status and short reason for what stopped a call (the checks' order: the most specific first)."""
    if isinstance(exc, http.BadRequest):
        return exc.status, exc.reason
    if isinstance(exc, (InvalidUploadToken, InvalidTicket)):
        return 401, str(exc)
    if isinstance(exc, rt.ConfigurationError):
        # Before NotFound (a missing setting is both): the name is for the operators, not the caller.
        log.error("profile upload misconfigured: %s", exc)
        return 500, "not configured"
    if isinstance(exc, intake.TooLarge):
        return 413, exc.message
    if isinstance(exc, ValidationFailed):
        return 400, exc.message
    if isinstance(exc, NotAllowed):
        return 403, str(exc)
    if isinstance(exc, Conflict):
        return 409, str(exc)
    if isinstance(exc, NotFound):
        return 404, str(exc)
    log.warning("profile upload not finished: %s", exc)
    return 503, "a service failed; try again shortly"


def _bearer(event: Mapping[str, Any]) -> str:
    value = http.headers(event).get("authorization", "")
    if value[: len(_BEARER)].lower() != _BEARER:
        raise InvalidUploadToken("an upload token is required (Authorization: Bearer gfu1…, from /gpu profile-token)")
    if len(value) > MAX_HEADER_CHARS:
        raise InvalidUploadToken("the upload token is malformed")
    return value[len(_BEARER) :].strip()


def _store(runtime: rt.Runtime) -> S3ProfileStore:
    bucket = runtime.settings.profile_bucket
    if not bucket:
        raise rt.ConfigurationError("GPUFARM_PROFILE_BUCKET is not set")
    return S3ProfileStore(runtime.settings, bucket)


def _begin(runtime: rt.Runtime, claims: Claims, key: bytes, body: dict[str, Any]) -> dict[str, Any]:
    ir, runs, batch = intake.parse_begin(body)
    ctx = runtime.service().context
    return intake.begin(ctx, _store(runtime), claims, key=key, ir=ir, runs=runs, batch=batch).body()


def _complete(runtime: rt.Runtime, claims: Claims, key: bytes, body: dict[str, Any]) -> dict[str, Any]:
    settings = runtime.settings
    if not settings.profile_pages_url:
        raise rt.ConfigurationError("GPUFARM_PROFILE_PAGES_URL is not set")
    svc = runtime.service()
    done = intake.complete(
        svc.context,
        _store(runtime),
        link_signer(settings),
        claims,
        key=key,
        ticket_text=body.get("upload"),
        pages_url=settings.profile_pages_url,
        retention_days=svc.context.farm.profiles.retention_days,
    )
    return {
        "ir": claims.ir,
        "runs": [
            {
                "name": run.run,
                "steps": run.figures.steps,
                "step_mean_ms": run.figures.step_mean_ms,
                "link": run.link,
                "recorded": run.recorded is not None,
            }
            for run in done
        ],
    }
