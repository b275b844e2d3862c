"""Datadog over plain HTTP: the retry and rate-limit policy, the error mapping and the JSON decoding every Datadog
adapter shares, without datadog-api-client.

`gpufarm.adapters.datadog_client` hands this policy to the client's transport (its `Configuration.retry_policy` is a
urllib3 `Retry`); `gpufarm.adapters.datadog_reads` sends its requests through urllib3 with the same policy, gate and
error mapping, for the reads that must stay light (the report). Importing this module costs urllib3 alone.

Rate limits (docs/datadog.md, "Rate limits"): a 429 is waited out until its `X-RateLimit-Reset`, within bounds
(`RATE_LIMIT_WAIT_S` per wait, `RATE_LIMIT_RETRIES` waits per call; beyond them the call fails at once with an
UpstreamError that says so), and a budget seen spent (`X-RateLimit-Remaining: 0`) holds the next call to that
limit until it resets, instead of spending a request on a certain 429.
"""

from __future__ import annotations

import gc
import json
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3

from gpufarm.adapters import time_budget
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotFound, UpstreamError, ValidationFailed

# The statuses a retrying call sends again (datadog-api-client's `rest.RETRY_AFTER_STATUS_CODES`, which a contract
# test holds this to): 408, 429 and the 5xx.
RETRY_AFTER_STATUS_CODES = frozenset({408, 429, 500, 501, 502, 503, 504, 505, 506, 507, 509, 510, 511, 512})

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


def retry_policy(
    settings: Settings,
    *,
    retry: bool,
    rate_limit_wait_s: float = RATE_LIMIT_WAIT_S,
    rate_limit_retries: int = RATE_LIMIT_RETRIES,
) -> DatadogRetry:
    """The retry policy of every Datadog call (urllib3's `retries`): with `retry`, 5xx, 408 and transport failures
    are retried `settings.max_retries` times with exponential backoff, on every method; without it, as for creates,
    urllib3's own default (3 connection retries, none for a POST once it was sent). Either way a 429 is waited out
    within the rate-limit bounds."""
    statuses = retry and settings.max_retries > 0
    return DatadogRetry(
        total=settings.max_retries if statuses else 3,
        backoff_factor=2 if statuses else 0,
        allowed_methods=None if statuses else urllib3.util.Retry.DEFAULT_ALLOWED_METHODS,
        status_forcelist=None,
        retry_statuses=statuses,
        rate_limit_wait_s=rate_limit_wait_s,
        rate_limit_retries=rate_limit_retries,
        raise_on_status=False,
    )


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


# -- answers ----------------------------------------------------------------------------------------------------


def parse_json(data: bytes | str) -> Any:
    """A Datadog answer's JSON, parsed by orjson with the cycle collector paused.

    orjson: a pool's search answers are the read path's largest cost (about 10 KB an incident, about 40 MB for a
    pool of 4,000), and orjson parses them in half to two thirds of `json.loads`'s CPU, holding the interpreter lock
    as much shorter while a search's other pages are read (docs/datadog.md, "Decoding bulk reads"). Invalid JSON
    raises `orjson.JSONDecodeError`, a ValueError as `json.loads` raised. The collector paused: a page of 100
    incidents is some 100,000 new containers, each allocation counting towards a collection that walks every
    object the process holds (the leases read so far included) and frees nothing (parsed JSON holds no cycles)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return orjson.loads(data)
    finally:
        if paused:
            gc.enable()


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


def status_outcome(status: int | None, body: Any, reason: str | None, headers: Mapping[str, str] | None) -> Outcome:
    """How an answer with this status ended (None or 0: no answer at all), its message from Datadog's body."""
    message = datadog_message(body) or (reason if isinstance(reason, str) else "") or "no details"
    if status is not None:
        message = f"HTTP {status}: {message}"
    if status is None or status == 0:
        return Outcome(None, short(message), transient=True, not_applied=False)
    if status == 429:
        wait = reset_seconds(headers)
        when = f"resets in {wait:g} s" if wait is not None else "no reset given"
        message = f"{message} (rate limit {_limit_name(headers)}: {when})"
    transient = status in _REJECTED_STATUSES or status >= 500
    return Outcome(status, short(message), transient=transient, not_applied=status in _REJECTED_STATUSES)


def transport_outcome(exc: urllib3.exceptions.HTTPError) -> Outcome:
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
