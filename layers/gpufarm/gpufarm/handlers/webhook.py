"""The front door shared by the Datadog webhooks (incident and idle): POST, shared secret, payload model."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpufarm.handlers import http
from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)

TOKEN_HEADER = "x-gpufarm-token"  # noqa: S105 - a header name, lower-cased as Function URLs deliver it

Payload = TypeVar("Payload", bound=BaseModel)


def check_token(runtime: rt.Runtime, headers: Mapping[str, str]) -> dict[str, Any] | None:
    """401 unless the shared secret header matches (constant time); 500 when no secret is configured."""
    secret = runtime.settings.require("webhook_secret")
    given = headers.get(TOKEN_HEADER, "")
    if not hmac.compare_digest(given.encode(), secret.encode()):
        log.warning("rejected a webhook call without the right %s header", TOKEN_HEADER)
        return http.error(401, "missing or wrong token")
    return None


def receive(
    event: Mapping[str, Any],
    model: type[Payload],
    what: str,
    act: Callable[[rt.Runtime, Payload], dict[str, Any]],
) -> dict[str, Any]:
    """Check a webhook call (Function URL POST, token, `model` payload) and hand it to `act`; errors become 4xx/5xx."""
    try:
        if not http.is_url_event(event):
            return http.error(400, "not a Function URL event")
        if http.method(event) != "POST":
            return http.error(405, "webhooks are POSTs")
        # Datadog's 15 s delivery timeout bounds everything this path calls (runtime.for_webhook).
        runtime = rt.current().for_webhook()
        denied = check_token(runtime, http.headers(event))
        if denied is not None:
            return denied
        try:
            payload = model.model_validate(http.json_body(event, http.WEBHOOK_MAX_BODY_BYTES))
        except ValidationError:
            return http.error(400, f"body is not a gpufarm {what} payload")
        return act(runtime, payload)
    except http.BadRequest as exc:
        return http.error(exc.status, exc.reason)
    except rt.ConfigurationError as exc:
        log.error("%s webhook misconfigured: %s", what, exc)  # noqa: TRY400 - a missing setting needs no traceback
        return http.error(500, "gpufarm is not configured")
