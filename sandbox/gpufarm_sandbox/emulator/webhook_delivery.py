"""Delivery of fired webhooks: the payload template, custom headers and URL rendered with the event's variables and
the custom variables, then POSTed by background workers: 15 s timeout, retried on 5xx and connection errors
(5 attempts, exponential backoff), 2xx/4xx end it (docs/datadog.md, "Delivery"). Every attempt is logged with secret
custom variable values redacted. Two Datadog quirk modes change the rendering: `fields-as-string` ($INCIDENT_FIELDS
arrives as a JSON string) and `no-header-vars` (custom headers are sent as written)."""

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

from gpufarm_sandbox.emulator.clock import Clock
from gpufarm_sandbox.emulator.quirks import FIELDS_AS_STRING, NO_HEADER_VARS

log = logging.getLogger("gpufarm_sandbox.emulator.webhooks")


# Datadog's default payload when a webhook has none (as recorded: the API echoes this exact string).
DEFAULT_PAYLOAD = (
    '{"body": "$EVENT_MSG", "last_updated": "$LAST_UPDATED", "event_type": "$EVENT_TYPE", "title": "$EVENT_TITLE", '
    '"date": "$DATE", "org": {"id": "$ORG_ID", "name": "$ORG_NAME"}, "id": "$ID"}'
)


REDACTED = "***"


ORG_ID = "1"


ORG_NAME = "gpufarm sandbox"


_RESPONSE_SNIPPET = 500


_WORKERS = 4

# The variable the `fields-as-string` quirk turns into a JSON string.
_FIELDS_VARIABLE = "INCIDENT_FIELDS"


def render_template(template: str, variables: Mapping[str, str], *, as_strings: frozenset[str] = frozenset()) -> str:
    """Replace `$NAME` occurrences, longest names first; JSON-escape inside string literals, raw elsewhere.

    Raw insertion outside strings is what lets a payload say `"fields": $INCIDENT_FIELDS` and receive a JSON object.
    A variable named in as_strings is inserted outside strings as a JSON string literal of its text instead.
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
                name = match.group(1)
                value = variables[name]
                quoted = json.dumps(value, ensure_ascii=False)
                out.append(quoted[1:-1] if in_string else quoted if name in as_strings else value)
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


class _Permanent(str):
    """An error message for a delivery that retrying cannot fix (a malformed request)."""

    __slots__ = ()


class WebhookDelivery:
    """The asynchronous delivery engine: a queue, its workers, and the log of every attempt."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.timeout_s = 15.0
        self.max_attempts = 5
        # Short backoff keeps tests fast; Datadog's own spacing is not documented.
        self.backoff_s = 0.2
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

    def reset(self) -> None:
        """Forget the log; deliveries still queued or retrying are dropped."""
        with self._log_lock:
            self._log.clear()
            self._generation += 1
            self._next_delivery = 1
            # Wake retries sleeping on the old generation so they notice and stop.
            self._cancel.set()
            self._cancel = threading.Event()

    def send(
        self,
        name: str,
        hook: Mapping[str, Any] | None,
        variables: Mapping[str, str],
        custom: list[dict[str, Any]],
        *,
        origin: str,
        quirks: frozenset[str] = frozenset(),
    ) -> None:
        """Render webhook `name` (its configuration `hook`, None when there is no such webhook) with `variables`
        and the custom variables, as the Datadog quirk modes `quirks` say, and queue its delivery; returns at
        once, never raises."""
        with self._log_lock:
            delivery_id = self._next_delivery
            self._next_delivery += 1
            generation = self._generation
        secrets = tuple(str(var["value"]) for var in custom if var["is_secret"] and var["value"])
        if hook is None:
            self._record(generation, _failure(delivery_id, name, origin, f"webhook '{name}' does not exist"))
            return
        try:
            job = self._render(
                hook, variables, custom, secrets, origin=origin, ids=(delivery_id, generation), quirks=quirks
            )
        except ValueError as exc:  # _RenderError, or a URL whose port does not parse
            entry = _failure(delivery_id, name, origin, redact(str(exc), secrets))
            entry["url"] = safe_url(redact(str(hook["url"]), secrets))
            self._record(generation, entry)
            return
        with self._idle:
            self._pending += 1
        self._ensure_workers()
        self._queue.put(job)

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

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until no delivery is queued or in progress; True if that happened within timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def _render(
        self,
        hook: Mapping[str, Any],
        variables: Mapping[str, str],
        custom: list[dict[str, Any]],
        secrets: tuple[str, ...],
        *,
        origin: str,
        ids: tuple[int, int],
        quirks: frozenset[str],
    ) -> _Job:
        delivery_id, generation = ids
        real, shown = self._template_variables(delivery_id, variables, custom)
        template = hook.get("payload") or DEFAULT_PAYLOAD
        as_strings = frozenset({_FIELDS_VARIABLE}) if FIELDS_AS_STRING in quirks else frozenset()
        payload = render_template(template, real, as_strings=as_strings)
        log_payload = redact(render_template(template, shown, as_strings=as_strings), secrets)
        # Under `no-header-vars` the headers go as written, `$NAME` and all.
        header_vars = NO_HEADER_VARS not in quirks
        headers = _render_headers(hook.get("custom_headers"), real if header_vars else {})
        shown_headers = _render_headers(hook.get("custom_headers"), shown if header_vars else {})
        log_headers = {k: redact(v, secrets) for k, v in shown_headers.items()}
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
            log_url=safe_url(redact(render_template(str(hook["url"]), shown), secrets)),
            log_payload=log_payload,
            log_headers=log_headers,
            content_type=content_type,
            secrets=secrets,
        )

    def _template_variables(
        self, delivery_id: int, variables: Mapping[str, str], custom: list[dict[str, Any]]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The values each `$NAME` takes: (what is sent, what is logged: secret custom variables as `***`)."""
        now_ms = self.clock.now_ms()
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
        return real, shown

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


def safe_url(url: str) -> str:
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
