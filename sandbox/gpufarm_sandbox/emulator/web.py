"""HTTP plumbing shared by the sandbox's API modules: routes, bodies, Datadog and Slack answer shapes."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qs

import zstandard
from werkzeug.datastructures import Headers
from werkzeug.wrappers import Request, Response

# Datadog's documented payload limits for metric intake.
MAX_COMPRESSED_BYTES = 512_000
MAX_DECOMPRESSED_BYTES = 5_242_880


class Auth(StrEnum):
    """Which credentials a route needs, as the real service asks for them."""

    NONE = "none"
    DD_API = "dd_api"  # DD-API-KEY only (metric and event intake)
    DD_APP = "dd_app"  # DD-API-KEY and DD-APPLICATION-KEY (everything else)
    SLACK = "slack"  # Authorization: Bearer xoxb-...


Handler = Callable[..., Response]


@dataclass(frozen=True)
class Route:
    """One endpoint: a werkzeug rule string, its methods, handler and auth."""

    path: str
    methods: tuple[str, ...]
    handler: Handler
    auth: Auth = Auth.DD_APP


class ApiError(Exception):
    """Raised inside a handler to answer with an error in the right dialect."""

    def __init__(self, status: int, *messages: str) -> None:
        super().__init__(messages[0] if messages else str(status))
        self.status = status
        self.messages = list(messages) or [_REASONS.get(status, "Error")]


_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    429: "Too many requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer (compact, as Datadog sends)."""
    data = json.dumps(body, separators=(",", ":"))
    return Response(data, status=status, headers=Headers(headers or {}), content_type="application/json")


def empty_response(status: int = 204) -> Response:
    """No body (204 on deletes)."""
    return Response(b"", status=status)


def dd_error(status: int, *messages: str, headers: dict[str, str] | None = None) -> Response:
    """Datadog's error shape: `{"errors": ["..."]}`."""
    return json_response({"errors": list(messages) or [_REASONS.get(status, "Error")]}, status, headers)


def slack_error(code: str, status: int = 200, **extra: Any) -> Response:
    """Slack's error shape: HTTP 200 (429 when rate limited) with `{"ok": false, "error": code}`."""
    return json_response({"ok": False, "error": code, **extra}, status)


def raw_body(request: Request) -> bytes:
    """Request body with Content-Encoding (gzip, deflate, zstd1) undone and Datadog's size limits enforced."""
    data = request.get_data(cache=True)
    encoding = (request.headers.get("Content-Encoding") or "").lower().strip()
    if not encoding or encoding == "identity":
        return data
    if len(data) > MAX_COMPRESSED_BYTES:
        raise ApiError(413, "Payload too large")
    try:
        if encoding == "gzip":
            out = gzip.decompress(data)
        elif encoding == "deflate":
            out = _inflate(data)
        elif encoding == "zstd1":
            out = _unzstd(data)
        else:
            raise ApiError(415, f"Unsupported Content-Encoding: {encoding}")
    except (OSError, EOFError, zlib.error, zstandard.ZstdError):
        raise ApiError(400, "Invalid compressed payload") from None
    if len(out) > MAX_DECOMPRESSED_BYTES:
        raise ApiError(413, "Payload too large")
    return out


def _unzstd(data: bytes) -> bytes:
    # Datadog's v2 series intake takes `Content-Encoding: zstd1` (MetricContentEncoding.ZSTD1). Read at most one
    # byte past the limit, whatever size the frame claims, so a small bomb never expands in memory.
    with zstandard.ZstdDecompressor().stream_reader(data) as reader:
        chunks = []
        left = MAX_DECOMPRESSED_BYTES + 1
        while left > 0 and (chunk := reader.read(left)):
            chunks.append(chunk)
            left -= len(chunk)
    return b"".join(chunks)


def _inflate(data: bytes) -> bytes:
    # Clients send zlib-wrapped deflate; accept raw deflate too, as Datadog's intake does.
    try:
        return zlib.decompress(data)
    except zlib.error:
        return zlib.decompress(data, -zlib.MAX_WBITS)


def json_body(request: Request, *, required: bool = True) -> Any:
    """Parse a JSON body; a malformed one is Datadog's 400, never a 500."""
    data = raw_body(request)
    if not data.strip():
        if required:
            raise ApiError(400, "Invalid JSON: empty body")
        return None
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "Invalid JSON") from None


def json_object(request: Request) -> dict[str, Any]:
    """A JSON body that must be an object."""
    body = json_body(request)
    if not isinstance(body, dict):
        raise ApiError(400, "Invalid JSON: expected an object")
    return body


def form_or_json(request: Request) -> dict[str, Any]:
    """Slack Web API arguments: JSON body, form body and query string all accepted, as Slack does."""
    args: dict[str, Any] = dict(request.args.items())
    data = request.get_data(cache=True)
    ctype = (request.mimetype or "").lower()
    if data:
        if ctype == "application/json":
            try:
                body = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                raise ApiError(400, "invalid_json") from None
            if isinstance(body, dict):
                args.update(body)
        else:
            parsed = parse_qs(data.decode("utf-8", "replace"), keep_blank_values=True)
            args.update({k: v[-1] for k, v in parsed.items()})
    return args


def query_int(
    request: Request, name: str, default: int | None = None, *, minimum: int = 0, maximum: int | None = None
) -> int | None:
    """An integer query parameter with bounds, or Datadog's 400."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"Invalid parameter {name}: not an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise ApiError(400, f"Invalid parameter {name}: out of range")
    return value
