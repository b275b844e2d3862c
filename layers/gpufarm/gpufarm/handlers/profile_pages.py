"""The profile pages function (Function URL): a run's summary page, for a signed link that has not expired.

`GET /profiles/<key>?expires=<epoch>&sig=<hmac>` (gpufarm.profiling.links): the signature (the link key's, or
the previous key's during a rotation) and the bound on a link's life are checked before S3 is asked, so a link
that is not gpufarm's costs no read. What is stored is data, never a page: the run's summary (at most
summary.MAX_BYTES read) is validated against its closed schema and bound to the key's lease and run, and the page
is rendered here by gpufarm's own template, every string escaped (gpufarm.profiling.page); a stored HTML page, JSON
that does not validate or an oversize object is "not a profiler run" (404). The headers keep the page to what it
is: no scripts, nothing loaded from elsewhere, no forms, framing allowed for Datadog's iframe widget. A team's
newest-run link before the team has a run answers a small page saying so (the dashboard's iframe shows it), not an
error. It reads only storage: no Datadog, no Slack, no trace analysis on this path.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from gpufarm.adapters.profile_store import S3ProfileStore
from gpufarm.core.kernel.errors import NotAllowed, NotFound, UpstreamError, ValidationFailed
from gpufarm.handlers import http
from gpufarm.handlers import runtime as rt
from gpufarm.profiling import summary
from gpufarm.profiling.links import LATEST, link_checker
from gpufarm.profiling.page import render_no_run, render_summary

log = logging.getLogger(__name__)

PREFIX = "/profiles/"
# A page link is a GET: its request carries no body, and one that does is refused before anything is read.
MAX_BODY_BYTES = 0
PAGE_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    # The page is inline CSS and SVG only; the dashboard embeds it, so framing is allowed from Datadog.
    # form-action and base-uri do not fall back to default-src: without them a form in a page could post anywhere
    # and a <base> could point its relative links elsewhere, so both are closed explicitly.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "form-action 'none'; base-uri 'none'; "
    "frame-ancestors https://*.datadoghq.com https://*.datadoghq.eu https://*.ddog-gov.com 'self'",
    "Cache-Control": "private, max-age=300",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Serve one run's page, or a short error."""
    if not http.is_url_event(event) or http.method(event) not in ("GET", "HEAD"):
        return http.error(405, "only GET of a profile page link")
    try:
        http.check_size(event, MAX_BODY_BYTES)
    except http.BadRequest as exc:
        return http.error(exc.status, exc.reason)
    path = str(event.get("rawPath") or "")[:600]
    params = event.get("queryStringParameters") or {}
    if not path.startswith(PREFIX) or not isinstance(params, Mapping):
        return http.error(404, "not a profile page")
    key = unquote(path.removeprefix(PREFIX)).rstrip("/")
    try:
        runtime = rt.current()
        settings = runtime.settings
        signer = link_checker(settings)
        signer.check(
            key,
            str(params.get("expires", ""))[:20],
            str(params.get("sig", ""))[:128],
            runtime.clock().now().timestamp(),
        )
        try:
            raw = S3ProfileStore(settings, _bucket(settings.profile_bucket)).summary(key)
        except NotFound:
            if not key.startswith(LATEST):
                raise
            page = render_no_run(key.removeprefix(LATEST))
        else:
            page = render_summary(summary.parse(raw, key))
    except rt.ConfigurationError as exc:
        # Before NotFound (a missing secret is both): the name is for the operators, not the viewer.
        log.error("profile pages misconfigured: %s", exc)  # noqa: TRY400 - no traceback needed
        return http.error(500, "not configured")
    except (ValidationFailed, NotAllowed) as exc:
        return http.error(403, str(exc))
    except NotFound as exc:
        return http.error(404, str(exc))
    except UpstreamError as exc:
        log.warning("profile page %s not served: %s", key[:100], exc)
        return http.error(503, "storage is unavailable; try again shortly")
    return http.respond(200, "" if http.method(event) == "HEAD" else page, PAGE_HEADERS)


def _bucket(name: str | None) -> str:
    if not name:
        raise rt.ConfigurationError("GPUFARM_PROFILE_BUCKET is not set")
    return name
