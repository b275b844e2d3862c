"""What both Datadog adapters share: the client's configuration, error mapping, and model-to-plain conversion.

`gpufarm.adapters.datadog` (the runtime gateway the handlers use) and `gpufarm.adapters.datadog_admin` (the
setup-time administration `gpufarm datadog apply` uses) build their clients here, so both send the same keys,
timeouts and retry policy, and both turn client and transport exceptions into the same gpufarm errors.
Only the API modules used are imported: never the aggregate `datadog_api_client.v2.models` package, which costs
~1.3 s and 93 MB (docs/datadog.md, "Import cost").

The retry and rate-limit policy, the gate and the error classes live in `gpufarm.adapters.datadog_http` (no client
library), which the light reads (gpufarm.adapters.datadog_reads) share; they are named here too.
"""

from __future__ import annotations

import importlib
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import date, datetime
from typing import Any

import urllib3
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.exceptions import ApiException, OpenApiException
from datadog_api_client.rest import RESTClientObject

from gpufarm.adapters.datadog_http import (
    RATE_LIMIT_RETRIES,
    RATE_LIMIT_WAIT_S,
    RETRY_AFTER_STATUS_CODES,
    DatadogRetry,
    Failed,
    Outcome,
    OutOfTime,
    RateLimited,
    RateLimitGate,
    datadog_message,
    parse_json,
    require_api_key,
    reset_seconds,
    retry_policy,
    short,
    status_outcome,
    transport_outcome,
)
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError

__all__ = [
    "RATE_LIMIT_RETRIES",
    "RATE_LIMIT_WAIT_S",
    "RETRY_AFTER_STATUS_CODES",
    "DatadogRetry",
    "Failed",
    "OutOfTime",
    "Outcome",
    "RateLimitGate",
    "RateLimited",
    "datadog_message",
    "parse_json",
    "require_api_key",
    "reset_seconds",
    "short",
]

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


def api_client(
    settings: Settings,
    *,
    retry: bool,
    raw: bool = False,
    check_input: bool = True,
    gate: RateLimitGate | None = None,
    rate_limit_wait_s: float = RATE_LIMIT_WAIT_S,
    rate_limit_retries: int = RATE_LIMIT_RETRIES,
) -> ApiClient:
    """A client for the Datadog of `settings`: its keys, timeouts and (when `retry`) bounded retries.

    raw: operations answer the transport's response unread instead of the client's models, for bulk reads
    decoded by `read_json` (docs/datadog.md, "Decoding bulk reads"). Requests are still built, authenticated,
    type-checked and retried by the client.
    check_input: False for bulk writes whose body the caller has already checked (the metric series): the client
    then sends the JSON as given instead of building its models from it and turning them back into JSON, which
    costs ~40x the sending (docs/datadog.md, "Sending bulk writes"); headers, auth, retries and errors are the same.
    retry: 5xx, 408 and transport failures are retried (`settings.max_retries` times, on every method). Without
    it, as for creates, no status is retried and a POST is sent again only when it cannot have been applied (a
    429, a connection that failed before the request went out): urllib3's own default. Either way a 429 is
    waited out within the rate-limit bounds.
    gate: shared by a gateway's clients, so a budget one of them saw spent holds the others too.
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
    cfg.check_input_type = check_input
    cfg.retry_policy = retry_policy(
        settings, retry=retry, rate_limit_wait_s=rate_limit_wait_s, rate_limit_retries=rate_limit_retries
    )
    assert settings.datadog_api_key is not None
    cfg.api_key["apiKeyAuth"] = settings.datadog_api_key.get_secret_value()
    if settings.datadog_app_key is not None:
        cfg.api_key["appKeyAuth"] = settings.datadog_app_key.get_secret_value()
    for operation in UNSTABLE_OPERATIONS:
        cfg.unstable_operations[operation] = True
    return GatedApiClient(cfg, gate or RateLimitGate(max_wait_s=rate_limit_wait_s))


class _GatedRest(RESTClientObject):
    """The client's transport, with every call passed through a RateLimitGate."""

    def __init__(self, configuration: Any, gate: RateLimitGate) -> None:
        super().__init__(configuration)  # type: ignore[no-untyped-call]
        self.gate = gate

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.gate.hold(url)
        try:
            response = super().request(method, url, *args, **kwargs)  # type: ignore[no-untyped-call]
        except ApiException as exc:
            self.gate.observe(url, exc.headers)
            raise
        self.gate.observe(url, response.headers)
        return response


class GatedApiClient(ApiClient):
    """datadog-api-client's ApiClient whose transport consults a RateLimitGate."""

    def __init__(self, configuration: Any, gate: RateLimitGate) -> None:
        self.gate = gate
        super().__init__(configuration)

    def _build_rest_client(self) -> Any:
        return _GatedRest(self.configuration, self.gate)


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
        return parse_json(data)
    except ValueError:
        raise UpstreamError("Datadog answered with a body that is not JSON") from None


# -- error mapping -------------------------------------------------------------------------------------------


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
        raise Failed(what, transport_outcome(exc)) from None
    except TypeError as exc:
        # After OpenApiException on purpose: the client's ApiTypeError is a TypeError too.
        if not caller_body:
            raise
        raise Failed(what, Outcome(None, short(str(exc)), transient=False, not_applied=True)) from None


def _api_outcome(exc: ApiException) -> Outcome:
    status = exc.status if isinstance(exc.status, int) else None
    return status_outcome(status, exc.body, exc.reason if isinstance(exc.reason, str) else None, exc.headers)


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
