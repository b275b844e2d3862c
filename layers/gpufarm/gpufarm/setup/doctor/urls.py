"""Check 8: each of gpufarm's Function URLs answers a request without credentials with gpufarm's own refusal,
so it is reachable, public and configured: a connection failure, another refusal (a Function URL whose auth is
AWS_IAM answers 403) or a 5xx (a function missing a setting answers 500) is broken."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.setup.doctor.ports import UrlAnswer
from gpufarm.setup.doctor.report import Line, Status

INGRESS = "slack ingress"
INCIDENT = "incident webhook"
IDLE = "idle webhook"
PAGES = "profile pages"
UPLOAD = "profile upload"


@dataclass(frozen=True)
class Knock:
    """What a Function URL is sent (a GET when `body` is None) and the refusal gpufarm answers it with."""

    path: str
    body: bytes | None
    content_type: str
    expected: int


# An unsigned slash command: 401 from the ingress; a webhook call without the token: 401; a link to no run: 403
# (the profile pages check the link only after reading their secret, so a missing one answers 500); a begin
# without an upload token: 401 (after the function has read its token key: a missing one answers 500).
KNOCKS: Mapping[str, Knock] = {
    INGRESS: Knock("", b"command=%2Fgpu&text=help", "application/x-www-form-urlencoded", 401),
    INCIDENT: Knock("", b"{}", "application/json", 401),
    IDLE: Knock("", b"{}", "application/json", 401),
    PAGES: Knock("profiles/gpufarm-doctor?expires=0&sig=0", None, "", 403),
    UPLOAD: Knock("begin", b"{}", "application/json", 401),
}
# Where each URL comes from, for a skipped line.
SOURCES: Mapping[str, str] = {
    INGRESS: "--ingress-url or GPUFARM_SLACK_INGRESS_URL (the stack's SlackIngressUrl)",
    INCIDENT: "--incident-webhook-url, GPUFARM_INCIDENT_WEBHOOK_URL or the webhook gpufarm-incidents",
    IDLE: "--idle-webhook-url, GPUFARM_IDLE_WEBHOOK_URL or the webhook gpufarm-idle",
    PAGES: "GPUFARM_PROFILE_PAGES_URL (only deployments with profiler runs)",
    UPLOAD: "GPUFARM_API_URL (the stack's ProfileUploadUrl; only deployments with profiler runs)",
}


def check_urls(answer: UrlAnswer, urls: Mapping[str, str | None]) -> list[Line]:
    """One line per Function URL, in KNOCKS' order (skipped where none is configured)."""
    return [_check(answer, name, urls.get(name)) for name in KNOCKS]


def _check(answer: UrlAnswer, name: str, url: str | None) -> Line:
    check = f"url {name}"
    if not url:
        return Line(check, Status.SKIPPED, f"not configured: {SOURCES[name]}")
    knock = KNOCKS[name]
    expected = knock.expected
    target = url.rstrip("/") + "/" + knock.path if knock.path else url
    host = urlsplit(url).netloc or url[:60]
    try:
        status, body = answer(target, knock.body, knock.content_type)
    except GpufarmError as exc:
        return Line(check, Status.BROKEN, f"{host}: {exc}")
    said = f" ({body[:80]})" if body else ""
    if status == expected:
        return Line(check, Status.CONFIRMED, f"{host} answers {status} without credentials: reachable")
    if 400 <= status < 500:
        detail = f"{host} answered {status}{said}, gpufarm answers {expected}: is it gpufarm's Function URL, auth NONE?"
    else:
        detail = f"{host} answered {status}{said} where gpufarm answers {expected}"
    return Line(check, Status.BROKEN, detail)
