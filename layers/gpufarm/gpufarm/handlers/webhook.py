"""The front door shared by the Datadog webhooks (incident and idle): POST, shared secret, payload model.

The secret travels twice, as `gpufarm datadog apply` configures the webhooks (gpufarm.setup.webhooks): in the
`X-Gpufarm-Token` custom header and in the payload's `token` field, both from the secret custom variable. Datadog
documents variables in payloads; whether it substitutes them in custom headers is unconfirmed. A call is
authenticated by whichever carries the secret (each compared in constant time), so it works either way, and the
handler says which (docs/security.md, "Signatures and webhook authentication").
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpufarm.handlers import http
from gpufarm.handlers import runtime as rt
from gpufarm.setup.webhooks import SECRET_VARIABLE, TOKEN_FIELD

log = logging.getLogger(__name__)

TOKEN_HEADER = "x-gpufarm-token"  # noqa: S105 - a header name, lower-cased as Function URLs deliver it
IN_HEADER = "header"
IN_PAYLOAD = "payload"

Payload = TypeVar("Payload", bound=BaseModel)

# Logged once per container: the header arrived with the variable's name instead of its value.
_unsubstituted_seen = False


def _same(given: object, secret: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), secret.encode())


def token_source(secret: str, headers: Mapping[str, str], body: Mapping[str, Any] | None) -> str | None:
    """Where the shared secret came ("header" or "payload"), or None when neither carries it."""
    global _unsubstituted_seen  # noqa: PLW0603 - a once-per-container log flag
    header = headers.get(TOKEN_HEADER, "")
    if _same(header, secret):
        return IN_HEADER
    if body is not None and _same(body.get(TOKEN_FIELD), secret):
        if header == f"${SECRET_VARIABLE}" and not _unsubstituted_seen:
            _unsubstituted_seen = True
            log.warning("Datadog sent the %s header unsubstituted; the payload's token authenticates", TOKEN_HEADER)
        return IN_PAYLOAD
    return None


def receive(
    event: Mapping[str, Any],
    model: type[Payload],
    what: str,
    act: Callable[[rt.Runtime, Payload, str], dict[str, Any]],
) -> dict[str, Any]:
    """Check a webhook call (Function URL POST, token, `model` payload) and hand it to `act` with where the token
    was; errors become 4xx/5xx."""
    try:
        if not http.is_url_event(event):
            return http.error(400, "not a Function URL event")
        if http.method(event) != "POST":
            return http.error(405, "webhooks are POSTs")
        # The size bound before the secret, the token or any parsing: an oversize body costs a length comparison.
        http.check_size(event, http.WEBHOOK_MAX_BODY_BYTES)
        # Datadog's 15 s delivery timeout bounds everything this path calls (runtime.for_webhook).
        runtime = rt.current().for_webhook()
        secret = runtime.settings.require("webhook_secret")
        headers = http.headers(event)
        body: dict[str, Any] | None = None
        source = token_source(secret, headers, None)
        if source is None:
            # Without the header, the payload's token decides; an unreadable body is as unauthenticated as none.
            try:
                body = http.json_body(event, http.WEBHOOK_MAX_BODY_BYTES)
            except http.BadRequest:
                body = None
            source = token_source(secret, headers, body)
        if source is None:
            log.warning("rejected a webhook call carrying no right token (header %s or payload)", TOKEN_HEADER)
            return http.error(401, "missing or wrong token")
        if body is None:
            body = http.json_body(event, http.WEBHOOK_MAX_BODY_BYTES)
        body.pop(TOKEN_FIELD, None)
        try:
            payload = model.model_validate(body)
        except ValidationError:
            return http.error(400, f"body is not a gpufarm {what} payload")
        return act(runtime, payload, source)
    except http.BadRequest as exc:
        return http.error(exc.status, exc.reason)
    except rt.ConfigurationError as exc:
        log.error("%s webhook misconfigured: %s", what, exc)  # noqa: TRY400 - a missing setting needs no traceback
        return http.error(500, "gpufarm is not configured")
