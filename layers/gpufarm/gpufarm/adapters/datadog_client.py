"""What both Datadog adapters share: the client's configuration, error mapping, and model-to-plain conversion.

`gpufarm.adapters.datadog` (the runtime gateway the handlers use) and `gpufarm.adapters.datadog_admin` (the
setup-time administration `gpufarm datadog apply` uses) build their clients here, so both send the same keys,
timeouts and retry policy, and both turn client and transport exceptions into the same gpufarm errors.
Only the API modules used are imported: never the aggregate `datadog_api_client.v2.models` package, which costs
~1.3 s and 93 MB (docs/datadog.md, "Import cost").
"""

from __future__ import annotations

import importlib
import json
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import urllib3
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.exceptions import ApiException, OpenApiException

from gpufarm.config import Settings
from gpufarm.core.errors import Conflict, GpufarmError, NotFound, UpstreamError, ValidationFailed

# Every incident operation is beta in the client and refused unless enabled (docs/datadog.md, "Three facts").
# Only the operations the two adapters call are enabled, so a new call site fails loudly until it is listed.
UNSTABLE_OPERATIONS = (
    "create_incident",
    "get_incident",
    "update_incident",
    "delete_incident",
    "search_incidents",
    "list_incident_types",
    "create_incident_type",
    "update_incident_type",
    "delete_incident_type",
    "list_incident_user_defined_fields",
    "create_incident_user_defined_field",
    "update_incident_user_defined_field",
    "list_incident_notification_rules",
    "create_incident_notification_rule",
    "update_incident_notification_rule",
)

# Statuses after which nothing was created: safe to send the same create again.
_REJECTED_STATUSES = frozenset({408, 429})
_ERROR_TEXT_LIMIT = 300


def require_api_key(settings: Settings) -> None:
    """Refuse to build a client without an API key (every Datadog call needs one)."""
    if settings.datadog_api_key is None:
        raise ValidationFailed("datadog_api_key", "set GPUFARM_DATADOG_API_KEY (or DD_API_KEY) to reach Datadog")


def quiet_unstable_warnings() -> None:
    """Ignore the client's 'Using unstable operation' UserWarning: the operations are enabled on purpose."""
    # It fires on every call (and fails `-W error` runs). Re-adding an identical filter replaces it, so
    # calling this per adapter never grows the filter list.
    warnings.filterwarnings(
        "ignore",
        message=r"Using unstable operation",
        category=UserWarning,
        module=r"datadog_api_client\.api_client",
    )


def api_client(settings: Settings, *, retry: bool, raw: bool = False) -> ApiClient:
    """A client for the Datadog of `settings`: its keys, timeouts and (when `retry`) bounded retries.

    raw: operations answer the transport's response unread instead of the client's models, for bulk reads
    decoded by `read_json` (docs/datadog.md, "Decoding bulk reads"). Requests are still built, authenticated,
    type-checked and retried by the client.
    """
    require_api_key(settings)
    quiet_unstable_warnings()
    # The client's constructor is untyped; the Any alias keeps mypy strict everywhere else.
    configuration: Any = Configuration
    cfg = configuration(
        host=settings.datadog_base_url(),
        request_timeout=(min(5.0, settings.http_timeout), settings.http_timeout),
        enable_retry=retry and settings.max_retries > 0,
        max_retries=settings.max_retries,
        retry_backoff_factor=2,  # the client refuses factors below 2
    )
    cfg.preload_content = not raw
    assert settings.datadog_api_key is not None
    cfg.api_key["apiKeyAuth"] = settings.datadog_api_key.get_secret_value()
    if settings.datadog_app_key is not None:
        cfg.api_key["appKeyAuth"] = settings.datadog_app_key.get_secret_value()
    for operation in UNSTABLE_OPERATIONS:
        cfg.unstable_operations[operation] = True
    return ApiClient(cfg)


def build(module: str, name: str, *args: Any) -> Any:
    """Instantiate a client class from its own module (never the aggregate models package)."""
    cls: Any = getattr(importlib.import_module(module), name)
    return cls(*args)


def read_json(response: Any) -> Any:
    """The JSON body of a raw client answer (see `api_client(raw=True)`); the connection goes back to the pool.

    Call it inside `errors()`: a body cut short is a transport failure like any other.
    """
    try:
        data = response.data
    finally:
        response.release_conn()
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise UpstreamError("Datadog answered with a body that is not JSON") from None


# -- error mapping -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How a failed call ended, classified once for error mapping and create's retry decision."""

    status: int | None
    message: str
    transient: bool
    # True when the server certainly did not act on the request (refused before handling it).
    not_applied: bool


class Failed(Exception):
    """A classified failure of one call (converted to a gpufarm error at the adapter's boundary)."""

    def __init__(self, what: str, outcome: Outcome) -> None:
        super().__init__(what)
        self.what = what
        self.outcome = outcome

    def error(self) -> GpufarmError:
        """The gpufarm error for this failure."""
        o = self.outcome
        text = f"Datadog {self.what} failed: {o.message}"
        if o.status is None:
            if o.transient:
                return UpstreamError(text)
            return ValidationFailed("datadog", text)
        if o.status == 404:
            return NotFound(text)
        if o.status == 409:
            return Conflict(text)
        if o.status in (401, 403):
            return UpstreamError(f"{text} (check the Datadog API and application keys)")
        if o.transient or o.status >= 500:
            return UpstreamError(text)
        return ValidationFailed("datadog", text)


@contextmanager
def errors(what: str, *, caller_body: bool = False) -> Iterator[None]:
    """Run a client call, raising gpufarm errors instead of client or urllib3 exceptions.

    caller_body: the request body is JSON a caller wrote (monitors, dashboards, webhooks); the client's
    models answer a missing required key with a plain TypeError, which then means "bad body".
    """
    try:
        with classified(what, caller_body=caller_body):
            yield
    except Failed as failed:
        raise failed.error() from None


@contextmanager
def classified(what: str, *, caller_body: bool = False) -> Iterator[None]:
    """Run a client call, raising Failed (with its Outcome) for callers that decide on retries themselves."""
    try:
        yield
    except GpufarmError:
        raise
    except ApiException as exc:
        raise Failed(what, _api_outcome(exc)) from None
    except OpenApiException as exc:
        # Raised before sending (a body the client's models reject) or on an answer that does not fit
        # them; the client's messages name types and paths, not values.
        raise Failed(what, Outcome(None, short(str(exc)), transient=False, not_applied=True)) from None
    except urllib3.exceptions.HTTPError as exc:
        raise Failed(what, _transport_outcome(exc)) from None
    except TypeError as exc:
        # After OpenApiException on purpose: the client's ApiTypeError is a TypeError too.
        if not caller_body:
            raise
        raise Failed(what, Outcome(None, short(str(exc)), transient=False, not_applied=True)) from None


def _api_outcome(exc: ApiException) -> Outcome:
    status = exc.status if isinstance(exc.status, int) else None
    message = datadog_message(exc.body) or (exc.reason if isinstance(exc.reason, str) else "") or "no details"
    if status is not None:
        message = f"HTTP {status}: {message}"
    if status is None or status == 0:
        return Outcome(None, short(message), transient=True, not_applied=False)
    transient = status in _REJECTED_STATUSES or status >= 500
    return Outcome(status, short(message), transient=transient, not_applied=status in _REJECTED_STATUSES)


def _transport_outcome(exc: urllib3.exceptions.HTTPError) -> Outcome:
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason else exc
    if isinstance(reason, urllib3.exceptions.ResponseError):
        # Retries used up on 5xx/429 answers: the message names the status ("too many 503 error responses").
        return Outcome(None, short(f"gave up after retries: {reason}"), transient=True, not_applied=False)
    refused = isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError)
    kind = "could not connect" if refused else "no answer in time" if _is_timeout(reason) else "connection failed"
    return Outcome(None, f"{kind} ({type(reason).__name__})", transient=True, not_applied=refused)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError)


def datadog_message(body: Any) -> str:
    """Datadog's `{"errors": [...]}` (strings or {title, detail}) as one line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return str(body).strip()
    if isinstance(body, Mapping):
        items = body.get("errors")
        if isinstance(items, list):
            parts = []
            for item in items:
                if isinstance(item, Mapping):
                    parts.append(" - ".join(str(item[k]) for k in ("title", "detail") if item.get(k)))
                else:
                    parts.append(str(item))
            return "; ".join(p for p in parts if p)
    return ""


def short(text: str) -> str:
    """One line of at most 300 characters."""
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[: _ERROR_TEXT_LIMIT - 3] + "..."


# -- conversions ----------------------------------------------------------------------------------------------


def get(obj: Any, key: str) -> Any:
    """An attribute of a client model (or a key of a dict), None when unset."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    try:
        return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)
    except (AttributeError, KeyError):
        return None


def plain(obj: Any) -> Any:
    """A client model (or list/dict of them) as JSON-ready plain data with Datadog's key names."""
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    return obj


def plain_dict(obj: Any) -> dict[str, Any]:
    """`plain` for a single object answer."""
    out = plain(obj)
    if not isinstance(out, dict):
        raise UpstreamError(f"Datadog answered with {type(out).__name__} where an object was expected")
    return out


def type_relationship(incident_type_id: str) -> dict[str, Any]:
    """The `incident_type` relationship of a field definition or notification rule."""
    return {"incident_type": {"data": {"id": incident_type_id, "type": "incident_types"}}}
