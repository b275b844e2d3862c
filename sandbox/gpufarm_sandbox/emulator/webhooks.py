"""Sandbox module: the Datadog Webhooks integration (v1): webhooks and custom variables configured as on Datadog,
and `fire()`, which other modules call to send a webhook: it is rendered and delivered by `webhook_delivery`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_body, json_object, json_response
from gpufarm_sandbox.emulator.webhook_delivery import DEFAULT_PAYLOAD, WebhookDelivery, safe_url

log = logging.getLogger("gpufarm_sandbox.emulator.webhooks")

API = "/api/v1/integration/webhooks/configuration"

ENCODINGS = ("json", "form")

# Custom variable names are upper-case letters, digits and underscores (v1.yaml, WebhooksIntegrationCustomVariable).
_VARIABLE_NAME = re.compile(r"^[A-Z0-9_]+$")
# Webhook names appear in `@webhook-<name>` mentions, so they stay within mention-safe characters.
_WEBHOOK_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_MAX_NAME = 255


class WebhooksModule(BaseModule):
    """Webhooks integration API of the sandbox plus the asynchronous delivery engine."""

    name = "webhooks"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self._webhooks: dict[str, dict[str, Any]] = {}
        self._variables: dict[str, dict[str, Any]] = {}
        self.delivery = WebhookDelivery(context.clock)

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
        self.delivery.reset()

    def dump(self) -> dict[str, Any]:
        """Configuration, custom variables (secret values never shown) and the recent delivery log."""
        log_entries = self.deliveries
        return {
            # A password typed straight into a URL is a secret too.
            "webhooks": {name: {**hook, "url": safe_url(str(hook["url"]))} for name, hook in self._webhooks.items()},
            "custom_variables": {name: _variable_view(var) for name, var in self._variables.items()},
            "deliveries": len(log_entries),
            "pending": self.pending,
            "recent_deliveries": log_entries[-20:],
        }

    # -- public delivery API ----------------------------------------------------------------------

    def fire(self, name: str, variables: Mapping[str, str], *, origin: str) -> None:
        """Render webhook `name` with `variables` and queue its delivery; returns at once, never raises."""
        with self.ctx.lock:
            hook = dict(self._webhooks[name]) if name in self._webhooks else None
            custom = [dict(var) for var in self._variables.values()]
        self.delivery.send(name, hook, variables, custom, origin=origin, quirks=self.ctx.quirks)

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery attempt so far (a copy), secrets redacted."""
        return self.delivery.deliveries

    @property
    def pending(self) -> int:
        """Deliveries queued or in progress."""
        return self.delivery.pending

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until no delivery is queued or in progress; True if that happened within timeout."""
        return self.delivery.drain(timeout)

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
