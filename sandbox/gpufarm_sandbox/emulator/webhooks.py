"""Sandbox module: the Datadog Webhooks integration (v1) and the delivery engine other modules fire into.

Webhooks and custom variables are configured as on Datadog. `fire()` renders the webhook's payload template,
custom headers and URL with the event's variables and the custom variables, then a background worker POSTs it:
15 s timeout, retried on 5xx and connection errors (5 attempts, exponential backoff), 2xx/4xx end it
(docs/datadog.md, "Delivery"). Every attempt is logged with secret custom variable values redacted.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import queue
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_body, json_object, json_response

log = logging.getLogger("gpufarm_sandbox.emulator.webhooks")

API = "/api/v1/integration/webhooks/configuration"

# Datadog's default payload when a webhook has none (as recorded: the API echoes this exact string).
DEFAULT_PAYLOAD = (
    '{"body": "$EVENT_MSG", "last_updated": "$LAST_UPDATED", "event_type": "$EVENT_TYPE", "title": "$EVENT_TITLE", '
    '"date": "$DATE", "org": {"id": "$ORG_ID", "name": "$ORG_NAME"}, "id": "$ID"}'
)
ENCODINGS = ("json", "form")
REDACTED = "***"
ORG_ID = "1"
ORG_NAME = "gpufarm sandbox"

# Custom variable names are upper-case letters, digits and underscores (v1.yaml, WebhooksIntegrationCustomVariable).
_VARIABLE_NAME = re.compile(r"^[A-Z0-9_]+$")
# Webhook names appear in `@webhook-<name>` mentions, so they stay within mention-safe characters.
_WEBHOOK_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_MAX_NAME = 255
_RESPONSE_SNIPPET = 500
_WORKERS = 4


def render_template(template: str, variables: Mapping[str, str]) -> str:
    """Replace `$NAME` occurrences, longest names first; JSON-escape inside string literals, raw elsewhere.

    Raw insertion outside strings is what lets a payload say `"fields": $INCIDENT_FIELDS` and receive a JSON object.
    """
    if not variables or "$" not in template:
        return template
    names = sorted(variables, key=len, reverse=True)
    pattern = re.compile(r"\$(" + "|".join(re.escape(name) for name in names) + ")")
    out: list[str] = []
    in_string = False
    i, n = 0, len(template)
    while i < n:
        ch = template[i]
        if in_string and ch == "\\":
            out.append(template[i : i + 2])
            i += 2
            continue
        if ch == '"':
            in_string = not in_string
        elif ch == "$":
            match = pattern.match(template, i)
            if match:
                value = variables[match.group(1)]
                out.append(json.dumps(value, ensure_ascii=False)[1:-1] if in_string else value)
                i = match.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every secret value occurring in text by `***` (longest first, so overlaps stay hidden)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, REDACTED)
    return text


@dataclass(frozen=True)
class _Job:
    """One rendered delivery, ready to send; the `log_*` copies have secrets redacted."""

    delivery_id: int
    generation: int
    webhook: str
    origin: str
    url: str
    body: bytes
    headers: dict[str, str]
    log_url: str
    log_payload: str
    log_headers: dict[str, str]
    content_type: str
    secrets: tuple[str, ...] = field(default=())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Datadog does not follow redirects for webhooks; a 3xx is an answer, not a hop."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _RenderError(ValueError):
    """A webhook whose rendered URL or headers cannot be sent; logged as a failed delivery."""


class WebhooksModule(BaseModule):
    """Webhooks integration API of the sandbox plus the asynchronous delivery engine."""

    name = "webhooks"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self.timeout_s = 15.0
        self.max_attempts = 5
        # Short backoff keeps tests fast; Datadog's own spacing is not documented.
        self.backoff_s = 0.2
        self._webhooks: dict[str, dict[str, Any]] = {}
        self._variables: dict[str, dict[str, Any]] = {}
        self._log: list[dict[str, Any]] = []
        self._log_lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0
        self._generation = 0
        self._next_delivery = 1
        self._cancel = threading.Event()
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._workers: list[threading.Thread] = []
        self._workers_lock = threading.Lock()
        self._opener = urllib.request.build_opener(_NoRedirect)

    # -- module protocol ------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Webhooks, custom variables, and the delivery log."""
        return [
            Route(f"{API}/webhooks", ("POST",), self._create_webhook),
            Route(f"{API}/webhooks/<path:name>", ("GET",), self._get_webhook),
            Route(f"{API}/webhooks/<path:name>", ("PUT",), self._update_webhook),
            Route(f"{API}/webhooks/<path:name>", ("DELETE",), self._delete_webhook),
            Route(f"{API}/custom-variables", ("POST",), self._create_variable),
            Route(f"{API}/custom-variables/<path:name>", ("GET",), self._get_variable),
            Route(f"{API}/custom-variables/<path:name>", ("PUT",), self._update_variable),
            Route(f"{API}/custom-variables/<path:name>", ("DELETE",), self._delete_variable),
            Route("/_sandbox/webhooks/deliveries", ("GET",), self._deliveries_get, Auth.NONE),
            Route("/_sandbox/webhooks/drain", ("POST",), self._drain_post, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget webhooks, variables and the log; deliveries still queued or retrying are dropped."""
        self._webhooks.clear()
        self._variables.clear()
        with self._log_lock:
            self._log.clear()
            self._generation += 1
            self._next_delivery = 1
            # Wake retries sleeping on the old generation so they notice and stop.
            self._cancel.set()
            self._cancel = threading.Event()

    def dump(self) -> dict[str, Any]:
        """Configuration, custom variables (secret values never shown) and the recent delivery log."""
        log_entries = self.deliveries
        return {
            # A password typed straight into a URL is a secret too.
            "webhooks": {name: {**hook, "url": _safe_url(str(hook["url"]))} for name, hook in self._webhooks.items()},
            "custom_variables": {name: _variable_view(var) for name, var in self._variables.items()},
            "deliveries": len(log_entries),
            "pending": self.pending,
            "recent_deliveries": log_entries[-20:],
        }

    # -- public delivery API ----------------------------------------------------------------------

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery attempt so far (a copy), secrets redacted."""
        with self._log_lock:
            return [dict(entry) for entry in self._log]

    @property
    def pending(self) -> int:
        """Deliveries queued or in progress."""
        with self._idle:
            return self._pending

    def fire(self, name: str, variables: Mapping[str, str], *, origin: str) -> None:
        """Render webhook `name` with `variables` and queue its delivery; returns at once, never raises."""
        with self.ctx.lock:
            hook = dict(self._webhooks[name]) if name in self._webhooks else None
            custom = [dict(var) for var in self._variables.values()]
        with self._log_lock:
            delivery_id = self._next_delivery
            self._next_delivery += 1
            generation = self._generation
        secrets = tuple(str(var["value"]) for var in custom if var["is_secret"] and var["value"])
        if hook is None:
            self._record(generation, _failure(delivery_id, name, origin, f"webhook '{name}' does not exist"))
            return
        try:
            job = self._render(hook, variables, custom, secrets, origin=origin, ids=(delivery_id, generation))
        except ValueError as exc:  # _RenderError, or a URL whose port does not parse
            entry = _failure(delivery_id, name, origin, redact(str(exc), secrets))
            entry["url"] = _safe_url(redact(str(hook["url"]), secrets))
            self._record(generation, entry)
            return
        with self._idle:
            self._pending += 1
        self._ensure_workers()
        self._queue.put(job)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until no delivery is queued or in progress; True if that happened within timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    # -- rendering ----------------------------------------------------------------------------------

    def _render(
        self,
        hook: Mapping[str, Any],
        variables: Mapping[str, str],
        custom: list[dict[str, Any]],
        secrets: tuple[str, ...],
        *,
        origin: str,
        ids: tuple[int, int],
    ) -> _Job:
        delivery_id, generation = ids
        now_ms = self.ctx.clock.now_ms()
        builtins = {
            "DATE": str(now_ms),
            "DATE_POSIX": str(now_ms // 1000),
            "LAST_UPDATED": str(now_ms),
            "ID": str(delivery_id),
            "ORG_ID": ORG_ID,
            "ORG_NAME": ORG_NAME,
        }
        real: dict[str, str] = {**builtins, **{str(v["name"]): str(v["value"]) for v in custom}}
        real.update({str(k): str(v) for k, v in variables.items()})
        shown = dict(real)
        for var in custom:
            if var["is_secret"] and real.get(str(var["name"])) == str(var["value"]):
                shown[str(var["name"])] = REDACTED
        template = hook.get("payload") or DEFAULT_PAYLOAD
        payload = render_template(template, real)
        log_payload = redact(render_template(template, shown), secrets)
        headers = _render_headers(hook.get("custom_headers"), real)
        log_headers = {k: redact(v, secrets) for k, v in _render_headers(hook.get("custom_headers"), shown).items()}
        url, auth = _split_credentials(render_template(str(hook["url"]), real).strip())
        if auth is not None and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = auth
        encode_as = str(hook.get("encode_as") or "json")
        body, content_type = _encode(payload, encode_as)
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = content_type
        headers.setdefault("User-Agent", "Datadog/Webhooks (gpufarm sandbox)")
        return _Job(
            delivery_id=delivery_id,
            generation=generation,
            webhook=str(hook["name"]),
            origin=origin,
            url=url,
            body=body,
            headers=headers,
            log_url=_safe_url(redact(render_template(str(hook["url"]), shown), secrets)),
            log_payload=log_payload,
            log_headers=log_headers,
            content_type=content_type,
            secrets=secrets,
        )

    # -- delivery worker ---------------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        with self._workers_lock:
            self._workers = [t for t in self._workers if t.is_alive()]
            while len(self._workers) < _WORKERS:
                worker = threading.Thread(target=self._work, name=f"webhook-delivery-{len(self._workers)}", daemon=True)
                worker.start()
                self._workers.append(worker)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                self._deliver(job)
            except Exception:  # a worker must outlive any one bad delivery
                log.exception("webhook delivery %s crashed", job.delivery_id)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _deliver(self, job: _Job) -> None:
        for attempt in range(1, self.max_attempts + 1):
            with self._log_lock:
                if job.generation != self._generation:
                    return
                cancel = self._cancel
            status, response, error = self._post(job)
            # Retry 5xx and connection failures; 2xx/4xx (and requests that cannot be built) end the delivery.
            retry = status >= 500 if status is not None else not isinstance(error, _Permanent)
            final = not retry or attempt == self.max_attempts
            self._record(job.generation, _attempt_entry(job, attempt, status, response, error, final=final))
            if final:
                return
            if cancel.wait(self.backoff_s * 2 ** (attempt - 1)):
                return

    def _post(self, job: _Job) -> tuple[int | None, str, str | None]:
        try:
            # The scheme was checked to be http(s) when the webhook was configured and again after rendering.
            request = urllib.request.Request(job.url, data=job.body, headers=job.headers, method="POST")  # noqa: S310
            with self._opener.open(request, timeout=self.timeout_s) as answer:
                return int(answer.status), _snippet(answer.read(_RESPONSE_SNIPPET * 4)), None
        except urllib.error.HTTPError as exc:
            body = exc.read(_RESPONSE_SNIPPET * 4) if exc.fp is not None else b""
            return int(exc.code), _snippet(body), None
        except (ValueError, http.client.InvalidURL) as exc:
            return None, "", _Permanent(f"request could not be built: {exc}")
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            return None, "", f"connection failed: {reason}"

    def _record(self, generation: int, entry: dict[str, Any]) -> None:
        with self._log_lock:
            if generation == self._generation:
                self._log.append(entry)
        level = logging.DEBUG if entry.get("ok") else logging.INFO
        log.log(
            level,
            "webhook %s attempt %s -> %s %s",
            entry["webhook"],
            entry["attempt"],
            entry["status"],
            entry["error"] or "",
        )

    # -- HTTP: webhooks -----------------------------------------------------------------------------

    def _create_webhook(self, request: Request) -> Response:
        body = json_object(request)
        name = _name(body.get("name"), "name", _WEBHOOK_NAME)
        hook = {
            "name": name,
            "url": _url(body.get("url")),
            "payload": None,
            "custom_headers": None,
            "encode_as": "json",
        }
        _apply_webhook_options(hook, body)
        with self.ctx.lock:
            if name in self._webhooks:
                raise ApiError(400, f"Invalid request: a webhook named '{name}' already exists")
            self._webhooks[name] = hook
            return json_response(_webhook_view(hook), 201)

    def _get_webhook(self, request: Request, name: str) -> Response:
        with self.ctx.lock:
            return json_response(_webhook_view(self._webhook(name)))

    def _update_webhook(self, request: Request, name: str) -> Response:
        body = json_object(request)
        with self.ctx.lock:
            hook = dict(self._webhook(name))
            if "url" in body:
                hook["url"] = _url(body["url"])
            _apply_webhook_options(hook, body)
            new_name = _name(body["name"], "name", _WEBHOOK_NAME) if "name" in body else name
            if new_name != name and new_name in self._webhooks:
                raise ApiError(400, f"Invalid request: a webhook named '{new_name}' already exists")
            hook["name"] = new_name
            del self._webhooks[name]
            self._webhooks[new_name] = hook
            return json_response(_webhook_view(hook))

    def _delete_webhook(self, request: Request, name: str) -> Response:
        with self.ctx.lock:
            self._webhook(name)
            del self._webhooks[name]
        return json_response({})

    def _webhook(self, name: str) -> dict[str, Any]:
        hook = self._webhooks.get(name)
        if hook is None:
            raise ApiError(404, "Webhook does not exist")
        return hook

    # -- HTTP: custom variables ---------------------------------------------------------------------

    def _create_variable(self, request: Request) -> Response:
        body = json_object(request)
        name = _name(body.get("name"), "name", _VARIABLE_NAME)
        for key in ("value", "is_secret"):
            if key not in body:
                raise ApiError(400, f"Invalid request: missing required parameter '{key}'")
        var = {
            "name": name,
            "value": _string(body["value"], "value"),
            "is_secret": _bool(body["is_secret"], "is_secret"),
        }
        with self.ctx.lock:
            if name in self._variables:
                raise ApiError(400, f"Invalid request: a custom variable named '{name}' already exists")
            self._variables[name] = var
            return json_response(_variable_view(var), 201)

    def _get_variable(self, request: Request, name: str) -> Response:
        with self.ctx.lock:
            return json_response(_variable_view(self._variable(name)))

    def _update_variable(self, request: Request, name: str) -> Response:
        body = json_object(request)
        with self.ctx.lock:
            var = dict(self._variable(name))
            if "value" in body:
                var["value"] = _string(body["value"], "value")
            if "is_secret" in body:
                var["is_secret"] = _bool(body["is_secret"], "is_secret")
            new_name = _name(body["name"], "name", _VARIABLE_NAME) if "name" in body else name
            if new_name != name and new_name in self._variables:
                raise ApiError(400, f"Invalid request: a custom variable named '{new_name}' already exists")
            var["name"] = new_name
            del self._variables[name]
            self._variables[new_name] = var
            return json_response(_variable_view(var))

    def _delete_variable(self, request: Request, name: str) -> Response:
        with self.ctx.lock:
            self._variable(name)
            del self._variables[name]
        return json_response({})

    def _variable(self, name: str) -> dict[str, Any]:
        var = self._variables.get(name)
        if var is None:
            raise ApiError(404, "Custom variable does not exist")
        return var

    # -- HTTP: inspection ---------------------------------------------------------------------------

    def _deliveries_get(self, request: Request) -> Response:
        entries = self.deliveries
        for key in ("webhook", "origin"):
            wanted = request.args.get(key)
            if wanted:
                entries = [e for e in entries if e.get(key) == wanted]
        return json_response({"deliveries": entries, "pending": self.pending})

    def _drain_post(self, request: Request) -> Response:
        body = json_body(request, required=False) or {}
        timeout = body.get("timeout", 10.0) if isinstance(body, dict) else None
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 60:
            raise ApiError(400, 'body must be {"timeout": <seconds between 0 and 60>}')
        drained = self.drain(float(timeout))
        return json_response({"drained": drained, "pending": self.pending})


class _Permanent(str):
    """An error message for a delivery that retrying cannot fix (a malformed request)."""

    __slots__ = ()


# -- helpers ----------------------------------------------------------------------------------------


def _webhook_view(hook: Mapping[str, Any]) -> dict[str, Any]:
    # Datadog answers with the default payload spelled out when none was given (recorded).
    return {
        "encode_as": hook["encode_as"],
        "url": hook["url"],
        "custom_headers": hook["custom_headers"],
        "name": hook["name"],
        "payload": hook["payload"] if hook["payload"] is not None else DEFAULT_PAYLOAD,
    }


def _variable_view(var: Mapping[str, Any]) -> dict[str, Any]:
    # Secret values are never returned (recorded: create answers only is_secret and name).
    view: dict[str, Any] = {"is_secret": var["is_secret"], "name": var["name"]}
    if not var["is_secret"]:
        view["value"] = var["value"]
    return view


def _apply_webhook_options(hook: dict[str, Any], body: Mapping[str, Any]) -> None:
    if "payload" in body:
        payload = body["payload"]
        if payload is not None and not isinstance(payload, str):
            raise ApiError(400, "Invalid parameter 'payload': must be a string or null")
        hook["payload"] = payload or None
    if "custom_headers" in body:
        hook["custom_headers"] = _custom_headers(body["custom_headers"])
    if "encode_as" in body:
        encode_as = body["encode_as"]
        if encode_as not in ENCODINGS:
            raise ApiError(400, "Invalid parameter 'encode_as': must be 'json' or 'form'")
        hook["encode_as"] = encode_as


def _custom_headers(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, "Invalid parameter 'custom_headers': must be a JSON string or null")
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ApiError(400, "Invalid parameter 'custom_headers': not valid JSON") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise ApiError(400, "Invalid parameter 'custom_headers': must be a JSON object of string values")
    return value


def _render_headers(template: Any, variables: Mapping[str, str]) -> dict[str, str]:
    if not template:
        return {}
    rendered = render_template(str(template), variables)
    try:
        parsed = json.loads(rendered)
    except ValueError:
        raise _RenderError("custom_headers did not render to valid JSON") from None
    if not isinstance(parsed, dict):
        raise _RenderError("custom_headers did not render to a JSON object")
    return {str(k): str(v) for k, v in parsed.items()}


def _encode(payload: str, encode_as: str) -> tuple[bytes, str]:
    if encode_as != "form":
        return payload.encode(), "application/json"
    # "Encode as form": the JSON payload's top-level keys become form fields (Datadog webhooks docs).
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        pairs = [(str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in parsed.items()]
        return urlencode(pairs).encode(), "application/x-www-form-urlencoded"
    return payload.encode(), "application/x-www-form-urlencoded"


def _split_credentials(url: str) -> tuple[str, str | None]:
    """Move `user:pass@` out of the URL into a Basic Authorization header (urllib does not send it)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _RenderError("webhook URL did not render to an http(s) URL")
    if parts.username is None:
        return url, None
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
    return urlunsplit(parts._replace(netloc=netloc)), f"Basic {token}"


def _safe_url(url: str) -> str:
    """The URL with any password in it hidden, for logs."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=f"{quote(parts.username or '')}:{REDACTED}@{host}"))
    except ValueError:
        return url


def _snippet(data: bytes) -> str:
    return data.decode("utf-8", "replace")[:_RESPONSE_SNIPPET]


def _attempt_entry(
    job: _Job, attempt: int, status: int | None, response: str, error: str | None, *, final: bool
) -> dict[str, Any]:
    return {
        "delivery_id": job.delivery_id,
        "webhook": job.webhook,
        "origin": job.origin,
        "url": job.log_url,
        "attempt": attempt,
        "status": status,
        "ok": status is not None and 200 <= status < 300,
        "final": final,
        "error": redact(str(error), job.secrets) if error is not None else None,
        "response": redact(response, job.secrets),
        "payload": job.log_payload,
        "headers": job.log_headers,
        "content_type": job.content_type,
    }


def _failure(delivery_id: int, name: str, origin: str, error: str) -> dict[str, Any]:
    return {
        "delivery_id": delivery_id,
        "webhook": name,
        "origin": origin,
        "url": None,
        "attempt": 0,
        "status": None,
        "ok": False,
        "final": True,
        "error": error,
        "response": "",
        "payload": None,
        "headers": {},
        "content_type": None,
    }


def _name(value: Any, key: str, pattern: re.Pattern[str]) -> str:
    if value is None:
        raise ApiError(400, f"Invalid request: missing required parameter '{key}'")
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME or not pattern.match(value):
        raise ApiError(400, f"Invalid parameter '{key}': {value!r} is not a valid name")
    return value


def _url(value: Any) -> str:
    if value is None:
        raise ApiError(400, "Invalid request: missing required parameter 'url'")
    if not isinstance(value, str):
        raise ApiError(400, "Invalid parameter 'url': must be a string")
    try:
        parts = urlsplit(value.strip())
        valid = parts.scheme in ("http", "https") and bool(parts.netloc)
        _ = parts.port  # raises on a port that is not a number (unless it is a $VARIABLE filled in later)
    except ValueError:
        valid = "$" in value
    if not valid:
        raise ApiError(400, "Invalid parameter 'url': must be an http or https URL")
    return value.strip()


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"Invalid parameter '{key}': must be a string")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(400, f"Invalid parameter '{key}': must be a boolean")
    return value
