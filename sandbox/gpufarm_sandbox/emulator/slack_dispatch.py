"""How the sandbox, acting as Slack, calls the app: Slack's wire encodings, its signature, and one signed POST
(slash commands and interactions as forms, Events API callbacks as JSON), with what the app answered."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, urlencode, urlsplit

from gpufarm_sandbox.emulator.web import ApiError

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.context import SandboxContext

ACK_DEADLINE_MS = 3000  # Slack shows "operation_timeout" after 3 s
DISPATCH_TIMEOUT_S = 10.0
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"

# -- wire encoding of what Slack sends to apps -----------------------------------------------------------------------


def encode_form(fields: Iterable[tuple[str, str]]) -> bytes:
    """Slack's PHP-style form encoding: space as `+`, `/` as `%2F`, `:` as `%3A`."""
    return urlencode(list(fields), quote_via=quote_plus).encode()


def encode_payload(payload: dict[str, Any]) -> bytes:
    """An interaction body: `payload=` + URL-encoded compact JSON with Slack's escaped forward slashes."""
    compact = json.dumps(payload, separators=(",", ":")).replace("/", "\\/")
    return b"payload=" + quote_plus(compact).encode()


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """`X-Slack-Signature` for a body (HMAC-SHA256 over `v0:<ts>:<body>`, via slack_sdk)."""
    from slack_sdk.signature import SignatureVerifier

    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    return signature


@dataclass
class Dispatch:
    """What happened when the sandbox, acting as Slack, POSTed to the app."""

    status: int | None
    body: str
    content_type: str
    latency_ms: float
    error: str | None = None

    def json_body(self) -> Any:
        """The ack parsed as JSON, or None."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def check_url(url: str) -> None:
    """A 400 unless `url` is an http(s) URL (where the app is)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ApiError(400, "url must be an http(s) URL of the app")


def signed_post(ctx: SandboxContext, url: str, body: bytes, content_type: str = FORM) -> Dispatch:
    """POST as Slack does: Slack's headers, a fresh signature on the sandbox clock; 10 s timeout."""
    timestamp = str(int(ctx.clock.now()))
    headers = {
        "Accept": "application/json,*/*",
        "Content-Type": content_type,
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": sign(ctx.slack_signing_secret, timestamp, body),
    }
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - scheme checked
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=DISPATCH_TIMEOUT_S) as response:  # noqa: S310
            status, data, ctype = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, data, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    except (OSError, ValueError) as exc:
        latency = (time.perf_counter() - started) * 1000
        # What a Slack user sees when the app cannot be reached or is too slow.
        code = "operation_timeout" if isinstance(exc, TimeoutError) else "dispatch_failed"
        return Dispatch(None, "", "", round(latency, 1), f"{code}: {type(exc).__name__}")
    latency = (time.perf_counter() - started) * 1000
    return Dispatch(status, data.decode("utf-8", "replace"), ctype or "", round(latency, 1))
