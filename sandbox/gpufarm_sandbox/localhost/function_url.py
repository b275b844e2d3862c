"""Function URLs as Lambda serves them: the payload format 2.0 event a request becomes, and the HTTP answer a
handler's result becomes."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.localhost.template import FunctionSpec

MAX_SYNC_PAYLOAD = 6 * 1024 * 1024  # Lambda's request/response limit for synchronous invokes and Function URLs
TEXT_TYPES = ("application/json", "application/x-www-form-urlencoded", "application/xml", "application/javascript")


def url_error(status: int, message: str) -> Response:
    """What a Function URL answers when the function cannot (502 for errors, as Lambda does)."""
    return Response(json.dumps({"Message": message}), status=status, content_type="application/json")


def _is_text(content_type: str, encoding: str) -> bool:
    if encoding and encoding.lower() not in ("identity", ""):
        return False
    ctype = content_type.split(";", 1)[0].strip().lower()
    return ctype.startswith("text/") or ctype in TEXT_TYPES or ctype.endswith(("+json", "+xml"))


def _join_multi(pairs: Iterator[tuple[str, str]] | list[tuple[str, str]], *, lower: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in pairs:
        name = key.lower() if lower else key
        out[name] = f"{out[name]},{value}" if name in out else value
    return out


def url_event(request: Request, spec: FunctionSpec, raw_path: str, body: bytes, now: float) -> dict[str, Any]:
    """The Lambda Function URL event (payload format 2.0)."""
    headers = _join_multi(list(request.headers.items()), lower=True)
    cookie_header = headers.pop("cookie", "")
    query = request.query_string.decode("utf-8", "replace")
    url_id = hashlib.sha256(spec.logical_id.encode()).hexdigest()[:32]
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": raw_path,
        "rawQueryString": query,
    }
    cookies = [c.strip() for c in cookie_header.split(";") if c.strip()]
    if cookies:
        event["cookies"] = cookies
    event["headers"] = headers
    params = _join_multi(parse_qsl(query, keep_blank_values=True), lower=False)
    if params:
        event["queryStringParameters"] = params
    event["requestContext"] = {
        "accountId": "anonymous",
        "apiId": url_id,
        "domainName": headers.get("host", "localhost"),
        "domainPrefix": url_id,
        "http": {
            "method": request.method,
            "path": raw_path,
            "protocol": request.environ.get("SERVER_PROTOCOL", "HTTP/1.1"),
            "sourceIp": request.remote_addr or "127.0.0.1",
            "userAgent": headers.get("user-agent", ""),
        },
        "requestId": str(uuid.uuid4()),
        "routeKey": "$default",
        "stage": "$default",
        "time": datetime.fromtimestamp(now, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(now * 1000),
    }
    if body:
        text = None
        if _is_text(headers.get("content-type", ""), headers.get("content-encoding", "")):
            with contextlib.suppress(UnicodeDecodeError):
                text = body.decode("utf-8")
        event["body"] = text if text is not None else base64.b64encode(body).decode()
        event["isBase64Encoded"] = text is None
    else:
        event["isBase64Encoded"] = False
    return event


def url_response(result: Any) -> Response:
    """Map a handler's result to HTTP as Function URLs do (a dict with statusCode, or any JSON as a 200)."""
    if isinstance(result, dict) and "statusCode" in result:
        status = result["statusCode"]
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"statusCode {status!r} is not an HTTP status")
        headers = result.get("headers") or {}
        if not isinstance(headers, dict):
            raise TypeError("headers must be an object")
        body = result.get("body")
        if body is None:
            data = b""
        elif isinstance(body, str):
            data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()
        else:
            data = json.dumps(body).encode()
        response = Response(data, status=status)
        response.headers["Content-Type"] = "application/json"
        for name, value in headers.items():
            response.headers[str(name)] = str(value)
        for cookie in result.get("cookies") or []:
            response.headers.add("Set-Cookie", str(cookie))
        return response
    data = result.encode() if isinstance(result, str) else json.dumps(result).encode()
    return Response(data, status=200, content_type="application/json")
