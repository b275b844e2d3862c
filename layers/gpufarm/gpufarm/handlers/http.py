"""Lambda Function URL events (payload format 2.0) in and out, without any framework on the Slack ingress path."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from gpufarm.core.kernel import bounded

# Per endpoint (each caller passes its own): Slack's bodies are a few kB (a modal submission carries the whole
# view, ~10 kB); Datadog's rendered webhook payloads are under 2 kB. Anything bigger is not ours.
MAX_BODY_BYTES = 256 * 1024
SLACK_MAX_BODY_BYTES = 128 * 1024
WEBHOOK_MAX_BODY_BYTES = 64 * 1024


class BadRequest(Exception):
    """The event cannot be read; answered with `status` and a short reason."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def method(event: Mapping[str, Any]) -> str:
    """The HTTP method of a Function URL event (upper case; '' when absent)."""
    http = (event.get("requestContext") or {}).get("http") or {}
    return str(http.get("method") or "").upper() if isinstance(http, Mapping) else ""


def headers(event: Mapping[str, Any]) -> dict[str, str]:
    """Headers with lower-case names (Function URLs lower-case them; tests and other hosts may not)."""
    raw = event.get("headers") or {}
    if not isinstance(raw, Mapping):
        raise BadRequest("headers must be an object")
    return {str(k).lower(): str(v) for k, v in raw.items()}


def check_size(event: Mapping[str, Any], limit: int) -> None:
    """Refuse (413) a body that cannot fit in `limit` bytes, from its length alone: nothing is decoded or parsed.

    Every public handler calls this (directly or through raw_body) before it reads anything else of the request,
    so an oversize body costs one length comparison (tests/security/test_public_endpoints.py).
    """
    body = event.get("body")
    if body is None:
        return
    if not isinstance(body, str):
        raise BadRequest("body must be a string")
    # Padded base64 of n bytes is exactly 4 * ceil(n / 3) characters; UTF-8 is at least one byte a character.
    bound = 4 * ((limit + 2) // 3) if event.get("isBase64Encoded") else limit
    if len(body) > bound:
        raise BadRequest("body too large", 413)


def raw_body(event: Mapping[str, Any], limit: int = MAX_BODY_BYTES) -> bytes:
    """The exact body bytes (base64 undone when the URL delivered it encoded), at most `limit` bytes (else 413)."""
    check_size(event, limit)
    body = event.get("body")
    if not isinstance(body, str):  # None: check_size refused anything else
        return b""
    if event.get("isBase64Encoded"):
        try:
            data = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("body is not valid base64") from None
    else:
        data = body.encode("utf-8")
    if len(data) > limit:
        raise BadRequest("body too large", 413)
    return data


def json_body(event: Mapping[str, Any], limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """A JSON object body of at most `limit` bytes, nested no deeper than gpufarm.core.kernel.bounded allows."""
    return json_object(raw_body(event, limit), limit)


def json_object(data: bytes, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """Body bytes already read (and bounded) by raw_body, parsed as one JSON object within the same bounds."""
    try:
        value = bounded.loads(data, max_bytes=limit) if data.strip() else None
    except bounded.BadJson as exc:
        raise BadRequest(f"body is {exc.reason}") from None
    if not isinstance(value, dict):
        raise BadRequest("body must be a JSON object")
    return value


def respond(status: int, body: Any = None, extra_headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Function URL response; dict/list bodies become JSON, None an empty body."""
    out_headers = dict(extra_headers or {})
    if body is None:
        text = ""
    elif isinstance(body, str):
        text = body
        out_headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    else:
        text = json.dumps(body, separators=(",", ":"))
        out_headers.setdefault("Content-Type", "application/json")
    return {"statusCode": status, "headers": out_headers, "body": text, "isBase64Encoded": False}


def error(status: int, reason: str) -> dict[str, Any]:
    """A 4xx/5xx with a short JSON reason (never a traceback)."""
    return respond(status, {"error": reason})


def is_url_event(event: Any) -> bool:
    """True for a Function URL / HTTP API v2 event."""
    return (
        isinstance(event, Mapping)
        and isinstance(event.get("requestContext"), Mapping)
        and "http" in event["requestContext"]
    )
