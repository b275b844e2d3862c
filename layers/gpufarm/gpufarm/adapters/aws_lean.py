"""Two AWS calls made without a botocore client: SSM GetParameters and Lambda's Event Invoke, for the Slack ingress.

Why by hand: after a SnapStart restore the ingress makes two AWS calls (its secret keys and the farm, then the
hand-off) before Slack's answer. Through botocore clients each call went through the client's whole pipeline
(event hooks, parameter validation, the serializer, the parser, the retry handler), which cost more than the
signing and the socket: measured in one process against moto, a fresh connection each call
(benchmarks/aws_calls.py), GetParameters 1.46 ms CPU through the client against 0.68 ms here, Invoke 1.35 ms
against 0.57 ms (benchmarks/RESULTS.md, "Slack ingress"). Everything that is security or AWS knowledge stays
botocore's: the endpoint is the one botocore resolved for a client built before the snapshot (its rules and the
cut-down endpoints.json, AWS_ENDPOINT_URL honoured), the credentials are its provider chain's (refreshable ones
refresh themselves as they do in a client), the request is botocore's AWSRequest signed with its SigV4Auth. What
is written here is only the wire format of the two operations (SSM's JSON 1.1 protocol with
`X-Amz-Target: AmazonSSM.GetParameters`; Lambda's REST `POST /2015-03-31/functions/{name}/invocations` with
`X-Amz-Invocation-Type: Event`), the error code read from an answer as botocore's parsers read it, and the retries
botocore's "standard" mode makes, with the client's limits (its retry quota aside: a container makes a handful of
these calls, never a storm).

Errors: an answer refusing the call raises Refused(code, status) (the callers map codes as they map a
ClientError's); no answer at all, after the retries, raises Unreachable naming the failure's type. Neither carries
a request or a response body, so no secret can leave through them.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

# The codes and statuses botocore's standard retry mode retries (botocore.retries.standard's checkers).
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"})
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
THROTTLING_STATUS = 429
# Standard mode's backoff: rand(0, 1) * min(scale * 2 ** (attempt - 1), 20 s), the scale 1 s after throttling and
# 50 ms after any other retryable failure.
MAX_BACKOFF_S = 20.0
THROTTLING_SCALE_S = 1.0
OTHER_SCALE_S = 0.05
# How much of an answer is read: GetParameters of 10 names of at most 64 KiB each (a Secrets Manager secret),
# with JSON's escaping; an Event invoke answers with an empty body.
MAX_ANSWER_BYTES = 2 * 1024 * 1024
SSM_TARGET_PREFIX = "AmazonSSM."
INVOKE_PATH = "/2015-03-31/functions/{}/invocations"


class Refused(Exception):
    """The service answered with an error: its code (botocore's reading of it) and the HTTP status."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"{code} (HTTP {status})")
        self.code = code
        self.status = status


class Unreachable(Exception):
    """No answer: the connection, the time-out or the answer itself failed (its type's name, never its text)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Answer:
    """A successful answer: its status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


class AwsEndpoint:
    """One AWS service at one endpoint: signed requests over one kept connection, retried as the client retries.

    `credentials` returns botocore credentials (static or refreshable) when a request is signed; `sleep` and
    `jitter` are the waits between attempts (time.sleep and random.random unless a test gives others).
    """

    def __init__(
        self,
        service: str,
        *,
        endpoint_url: str,
        region: str,
        credentials: Callable[[], Any],
        connect_timeout: float,
        read_timeout: float,
        max_attempts: int,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{service} endpoint {endpoint_url[:80]!r} is not an http(s) URL")
        self.signing_name = service
        self.region = region
        self._url = f"{parts.scheme}://{parts.netloc}"
        self._base_path = parts.path.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port_number = parts.port
        self._credentials = credentials
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self.max_attempts = max(1, max_attempts)
        self._sleep = sleep
        self._jitter = jitter
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._tls: ssl.SSLContext | None = None

    # -- the two operations ------------------------------------------------------------------------------------

    def call_json(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """An operation of a JSON 1.1 service (SSM): its decoded answer."""
        body = json.dumps(params, separators=(",", ":")).encode()
        headers = {"X-Amz-Target": SSM_TARGET_PREFIX + operation, "Content-Type": "application/x-amz-json-1.1"}
        answer = self.send("POST", "/", headers, body)
        try:
            decoded = json.loads(answer.body or b"{}")
        except ValueError:
            raise Unreachable("UnparsableAnswer") from None
        if not isinstance(decoded, dict):
            raise Unreachable("UnparsableAnswer")
        return decoded

    def invoke_event(self, function: str, payload: bytes) -> int:
        """Queue an asynchronous invocation of `function` (InvocationType Event); the HTTP status answered."""
        path = INVOKE_PATH.format(quote(function, safe=""))
        answer = self.send("POST", path, {"X-Amz-Invocation-Type": "Event"}, payload)
        return answer.status

    # -- signing, sending, retrying ----------------------------------------------------------------------------

    def send(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Answer:
        """One signed request, retried on throttling, 5xx and connection failures up to max_attempts."""
        attempt = 1
        while True:
            try:
                status, code, data = self._attempt(method, path, headers, body)
            except Unreachable:
                if attempt >= self.max_attempts:
                    raise
                self._wait(attempt, throttled=False)
                attempt += 1
                continue
            if code is None:
                return Answer(status, data)
            throttled = code in THROTTLING_CODES or (status == THROTTLING_STATUS and not code)
            retryable = throttled or code in TRANSIENT_CODES or status in TRANSIENT_STATUSES
            if not retryable or attempt >= self.max_attempts:
                raise Refused(code or f"HTTP{status}", status)
            self._wait(attempt, throttled=throttled)
            attempt += 1

    def _wait(self, attempt: int, *, throttled: bool) -> None:
        scale = THROTTLING_SCALE_S if throttled else OTHER_SCALE_S
        self._sleep(self._jitter() * min(scale * 2 ** (attempt - 1), MAX_BACKOFF_S))

    def _attempt(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, str | None, bytes]:
        """Sign and send once: (status, the error code or None for a 2xx, the body)."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        url = self._url + self._base_path + path
        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        # Frozen here: refreshable credentials refresh themselves first when they are about to expire.
        SigV4Auth(self._credentials().get_frozen_credentials(), self.signing_name, self.region).add_auth(request)
        prepared = request.prepare()
        with self._lock:
            try:
                connection = self._connected()
                connection.request(method, self._base_path + path, body=body, headers=dict(prepared.headers.items()))
                response = connection.getresponse()
                data = response.read(MAX_ANSWER_BYTES + 1)
                status = response.status
                answer_headers = {k.lower(): v for k, v in response.getheaders()}
                if response.will_close or len(data) > MAX_ANSWER_BYTES:
                    self._close()
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                raise Unreachable(type(exc).__name__) from None
        if len(data) > MAX_ANSWER_BYTES:
            raise Unreachable("AnswerTooLarge")
        if 200 <= status < 300:
            return status, None, data
        return status, error_code(answer_headers, data), b""

    def _connected(self) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._https:
                if self._tls is None:
                    self._tls = _tls_context()
                self._connection = http.client.HTTPSConnection(
                    self._host, self._port_number, timeout=self._connect_timeout, context=self._tls
                )
            else:
                self._connection = http.client.HTTPConnection(
                    self._host, self._port_number, timeout=self._connect_timeout
                )
            self._connection.connect()
            if self._connection.sock is not None:
                self._connection.sock.settimeout(self._read_timeout)
        return self._connection

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def close(self) -> None:
        """Drop the kept connection (after a SnapStart restore its socket is long gone)."""
        with self._lock:
            self._close()


def error_code(headers: Mapping[str, str], body: bytes) -> str:
    """The error code of a refusal as botocore's JSON and REST-JSON parsers read it: the `x-amzn-errortype` header
    (before any `:`), else the body's `__type` or `code` (after any `#`); empty when the answer names none."""
    code = headers.get("x-amzn-errortype", "").split(":", 1)[0].strip()
    if not code:
        try:
            decoded = json.loads(body[:65_536] or b"{}")
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            code = str(decoded.get("__type") or decoded.get("code") or decoded.get("Code") or "")
    return code.rsplit("#", 1)[-1][:100]


def _tls_context() -> ssl.SSLContext:
    """Certificates verified against the bundle botocore's clients use (AWS_CA_BUNDLE when set, as theirs)."""
    from botocore.httpsession import get_cert_path

    return ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True))
