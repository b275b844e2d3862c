"""What both Datadog adapters share: the client's configuration, error mapping, and model-to-plain conversion.

`gpufarm.adapters.datadog` (the runtime gateway the handlers use) and `gpufarm.adapters.datadog_admin` (the
setup-time administration `gpufarm datadog apply` uses) build their clients here, so both send the same keys,
timeouts and retry policy, and both turn client and transport exceptions into the same gpufarm errors.
Only the API modules used are imported: never the aggregate `datadog_api_client.v2.models` package, which costs
~1.3 s and 93 MB (docs/datadog.md, "Import cost").

Rate limits (docs/datadog.md, "Rate limits"): a 429 is waited out until its `X-RateLimit-Reset`, within bounds
(`RATE_LIMIT_WAIT_S` per wait, `RATE_LIMIT_RETRIES` waits per call; beyond them the call fails at once with an
UpstreamError that says so), and a budget seen spent (`X-RateLimit-Remaining: 0`) holds the next call to that
limit until it resets, instead of spending a request on a certain 429.
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import random
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import urllib3
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.exceptions import ApiException, OpenApiException
from datadog_api_client.rest import RETRY_AFTER_STATUS_CODES, RESTClientObject

from gpufarm.adapters import time_budget
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotFound, UpstreamError, ValidationFailed

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

# The longest single wait for a rate limit to reset, and how many 429s one call waits out. Datadog's periods are
# mostly 10 s or 60 s: a 10 s window is waited for; a reset a minute away fails the call at once (the queue or the
# caller retries it later) rather than holding a function for most of its timeout.
RATE_LIMIT_WAIT_S = 10.0
RATE_LIMIT_RETRIES = 4
# Up to this share is added to each wait, so the containers that drew a 429 together do not return together.
_RATE_LIMIT_JITTER = 0.1


def require_api_key(settings: Settings) -> None:
    """Refuse to build a client without an API key (every Datadog call needs one): ConfigurationMissing naming the
    secret (or the function not given it) in a deployment, ValidationFailed naming the variable elsewhere."""
    if settings.secrets_name:
        settings.require("datadog_api_key")
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
    statuses = retry and settings.max_retries > 0
    cfg.retry_policy = DatadogRetry(
        # Without `retry`: urllib3's own default (3 connection retries, none for a POST once it was sent).
        total=settings.max_retries if statuses else 3,
        backoff_factor=2 if statuses else 0,
        allowed_methods=None if statuses else urllib3.util.Retry.DEFAULT_ALLOWED_METHODS,
        status_forcelist=None,
        retry_statuses=statuses,
        rate_limit_wait_s=rate_limit_wait_s,
        rate_limit_retries=rate_limit_retries,
        raise_on_status=False,
    )
    assert settings.datadog_api_key is not None
    cfg.api_key["apiKeyAuth"] = settings.datadog_api_key.get_secret_value()
    if settings.datadog_app_key is not None:
        cfg.api_key["appKeyAuth"] = settings.datadog_app_key.get_secret_value()
    for operation in UNSTABLE_OPERATIONS:
        cfg.unstable_operations[operation] = True
    return GatedApiClient(cfg, gate or RateLimitGate(max_wait_s=rate_limit_wait_s))


# -- rate limits ---------------------------------------------------------------------------------------------


def reset_seconds(headers: Mapping[str, str] | None) -> float | None:
    """`X-RateLimit-Reset` (seconds until the budget resets) when present and sane, else None."""
    raw = (headers or {}).get("X-RateLimit-Reset")
    if raw is None:
        return None
    try:
        value = float(str(raw).strip()[:12])
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _limit_name(headers: Mapping[str, str] | None) -> str:
    return str((headers or {}).get("X-RateLimit-Name") or "unnamed")[:60]


class RateLimited(urllib3.exceptions.ResponseError):
    """A 429 gpufarm does not wait out (its reset is beyond the bound, or too many came in a row)."""


class OutOfTime(urllib3.exceptions.ResponseError):
    """A retry gpufarm does not make: its wait would run past the invocation's time budget."""

    def __init__(self) -> None:
        super().__init__("the wait before the next attempt would run past the invocation's time budget")


class DatadogRetry(urllib3.util.Retry):
    """urllib3's retry policy with Datadog's rate limits: a 429 waits for `X-RateLimit-Reset`, within bounds.

    A 429 never counts against the 5xx retries (it is not a failure of the request, and nothing was applied), and
    other statuses back off exponentially without reading `X-RateLimit-Reset`: Datadog sends it on every answer,
    and a 500 is no reason to wait for a rate-limit window (the client's own policy waits it out on any status).
    """

    def __init__(
        self,
        *args: Any,
        retry_statuses: bool = True,
        rate_limit_wait_s: float = RATE_LIMIT_WAIT_S,
        rate_limit_retries: int = RATE_LIMIT_RETRIES,
        sleeper: Callable[[float], None] = time.sleep,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.retry_statuses = retry_statuses
        self.rate_limit_wait_s = rate_limit_wait_s
        self.rate_limit_retries = rate_limit_retries
        self.sleeper = sleeper

    def new(self, **kw: Any) -> DatadogRetry:
        """A copy with some counters changed (urllib3 makes one per attempt)."""
        for name in ("retry_statuses", "rate_limit_wait_s", "rate_limit_retries", "sleeper"):
            kw.setdefault(name, getattr(self, name))
        return super().new(**kw)

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        """A 429 on any method (`increment` decides whether to wait); other statuses only with `retry_statuses`."""
        if status_code == 429:
            return True
        if not self.retry_statuses or not self._is_method_retryable(method):
            return False
        return bool(self.total) and status_code in RETRY_AFTER_STATUS_CODES

    def increment(self, method: str | None = None, url: str | None = None, *args: Any, **kwargs: Any) -> DatadogRetry:
        """The policy for the next attempt; a 429 spends a rate-limit retry, or ends the call when it cannot wait.

        Either kind of retry also ends the call when its wait would run past the invocation's time budget
        (gpufarm.adapters.time_budget): the failure then reaches the handler while it can still answer.
        """
        response = kwargs.get("response")
        if response is None or response.status != 429:
            following = super().increment(method, url, *args, **kwargs)
            if response is not None and not time_budget.allows(following.get_backoff_time()):
                raise urllib3.exceptions.MaxRetryError(kwargs.get("_pool"), url or "", OutOfTime())  # type: ignore[arg-type]
            return following
        wait = reset_seconds(response.headers)
        if self.rate_limit_retries <= 0 or wait is None or wait > self.rate_limit_wait_s:
            why = (
                "no X-RateLimit-Reset"
                if wait is None
                else f"resets in {wait:g} s, beyond the {self.rate_limit_wait_s:g} s gpufarm waits"
                if wait > self.rate_limit_wait_s
                else f"still limited after {self.rate_limit_retries} waits"
            )
            # urllib3 then hands back the 429 itself (raise_on_status=False): the client raises it as an ApiException.
            raise urllib3.exceptions.MaxRetryError(kwargs.get("_pool"), url or "", RateLimited(why))  # type: ignore[arg-type]
        if not time_budget.allows(wait):
            raise urllib3.exceptions.MaxRetryError(kwargs.get("_pool"), url or "", OutOfTime())  # type: ignore[arg-type]
        history = (*self.history, urllib3.util.retry.RequestHistory(method, url, None, 429, None))
        return self.new(rate_limit_retries=self.rate_limit_retries - 1, history=history)

    def sleep(self, response: Any = None) -> None:
        """Wait before the next attempt: a 429 until its reset (plus a little jitter), anything else backs off."""
        if response is not None and response.status == 429:
            wait = reset_seconds(response.headers) or 0.0
            self.sleeper(min(self.rate_limit_wait_s, wait) * (1 + random.uniform(0, _RATE_LIMIT_JITTER)))  # noqa: S311 - jitter, not crypto
            return
        backoff = self.get_backoff_time()
        if backoff > 0:
            self.sleeper(backoff)


class RateLimitGate:
    """Holds calls to a rate limit whose budget was seen spent until it resets (proactive, bounded slow-down).

    Datadog names each limit in `X-RateLimit-Name`; the gate learns which paths fall under which name from the
    answers (by the path's first three segments: `/api/v2/incidents`, `/api/v1/tags`...), so two endpoints of one
    limit hold each other. It never refuses a call: it waits only for a reset within `max_wait_s`; past that the call
    goes out, and its 429 is the retry policy's to handle.
    """

    def __init__(
        self,
        *,
        max_wait_s: float = RATE_LIMIT_WAIT_S,
        sleeper: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_wait_s = max_wait_s
        self._sleeper = sleeper
        self._clock = clock
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}
        self._until: dict[str, float] = {}
        self.waited_s = 0.0  # total time calls were held, for benchmarks and tests

    def hold(self, url: str) -> None:
        """Wait, within the bound, while the limit `url` falls under is spent."""
        with self._lock:
            name = self._names.get(_limit_key(url))
            until = self._until.get(name) if name is not None else None
        if until is None:
            return
        delay = until - self._clock()
        # A reset beyond the bound (or past the invocation's time budget) is not waited for here either: the call
        # goes out, and its 429 fails it at once.
        if 0 < delay <= self.max_wait_s and time_budget.allows(delay):
            self._sleeper(delay)
            with self._lock:
                self.waited_s += delay

    def observe(self, url: str, headers: Mapping[str, str] | None) -> None:
        """Learn from an answer's rate-limit headers (any status)."""
        if not headers or headers.get("X-RateLimit-Remaining") is None:
            return
        name = _limit_name(headers)
        remaining = str(headers.get("X-RateLimit-Remaining")).strip()
        reset = reset_seconds(headers)
        with self._lock:
            self._names[_limit_key(url)] = name
            if remaining == "0" and reset is not None:
                self._until[name] = self._clock() + reset
            else:
                self._until.pop(name, None)


def _limit_key(url: str) -> str:
    path = urllib3.util.parse_url(url).path or "/"
    return "/".join(path.split("/")[:4])


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


def parse_json(data: bytes | str) -> Any:
    """`json.loads` with the cycle collector paused: a page of 100 incidents is some 100,000 new containers, each
    allocation counting towards a collection that walks every object the process holds (the leases read so far
    included) and frees nothing (parsed JSON holds no cycles). Paused, a report's read costs ~12 % less CPU."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return json.loads(data)
    finally:
        if paused:
            gc.enable()


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
    if status == 429:
        wait = reset_seconds(exc.headers)
        when = f"resets in {wait:g} s" if wait is not None else "no reset given"
        message = f"{message} (rate limit {_limit_name(exc.headers)}: {when})"
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
