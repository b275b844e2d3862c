"""The series push on the agent's own kept-alive connection, the client's path for every push that fails there.

A push through urllib3 (SeriesIntake) costs about 0.6 ms of CPU for one request of about 10 KB, nine tenths of it
urllib3's and http.client's request and response handling, not the socket's work (benchmarks/node.py); at the 60 s
flush that is about 0.15 ms of every cycle. DirectSeriesIntake sends the same request (the same URL, headers and
compressed body) over gpufarm_node.http1's connection and reads the answer with its bounded reader. Failures are
not its to decide: a push that fails there for the connection (no connection, a connection that broke, an answer
the reader does not take) or with a 5xx goes again through SeriesIntake, whose client retry policy (bounded retries
with backoff) and error mapping decide as they did before; pushes stay on that path until one succeeds, then come
back. Two answers are never sent again at once: a 429 holds every push until its `X-RateLimit-Reset` (or
`Retry-After`) has passed, the payload kept by the sender's buffer, and a payload the intake refused for its content
(400, 413, 422) is dropped as the client's path drops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from gpufarm_node.http1 import Http1Connection, request_head
from gpufarm_node.sender import IntakeError, SeriesIntake

# What the intake answers is a small JSON object (`{"errors": []}`); anything longer is not read.
MAX_ANSWER_BYTES = 64 << 10
DEFAULT_TIMEOUT_S = 15.0
# A 429 without a reset header holds pushes this long; a reset header is believed up to MAX_HOLD_S.
DEFAULT_HOLD_S = 1.0
MAX_HOLD_S = 300.0
# Refused for the payload itself: sending it again gets the same answer (the client's path drops these too).
REFUSED = (400, 413, 422)


class DirectSeriesIntake:
    """POST /api/v2/series on one kept-alive connection while pushes succeed, else through `fallback`."""

    def __init__(
        self, fallback: SeriesIntake, connection: Http1Connection, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.encoding = fallback.encoding
        self._clock = clock
        # Until when a 429 holds every push (clock time).
        self._hold_until = 0.0
        self._fallback = fallback
        self._connection = connection
        head = request_head("POST", urlsplit(fallback.url).path, connection.netloc, fallback.headers)
        # The head up to its empty line; each push adds its Content-Length and the empty line.
        self._head = head[:-2].encode("latin-1")
        self._direct = True
        # Pushes made on each path (for tests and the benchmark).
        self.direct_posts = 0
        self.client_posts = 0

    @classmethod
    def from_client(
        cls, client: Any, encoding: str | None = None, clock: Callable[[], float] = time.monotonic
    ) -> DirectSeriesIntake:
        """The same host, keys, TLS settings, user agent and timeouts as a datadog-api-client ApiClient, which
        also carries every push that fails on the direct connection."""
        fallback = SeriesIntake(client, encoding)
        cfg = client.configuration
        connection = Http1Connection(
            cfg.host,
            timeout=fallback.read_timeout or DEFAULT_TIMEOUT_S,
            verify=bool(cfg.verify_ssl),
            ca_file=cfg.ssl_ca_cert,
        )
        return cls(fallback, connection, clock)

    def post(self, compressed: bytes) -> None:
        """Send one payload; 2xx or IntakeError (from the client's path, or a 429's hold)."""
        wait = self._hold_until - self._clock()
        if wait > 0:
            raise IntakeError(429, f"rate limited for {wait:.0f} s more", retry=True)
        if self._direct:
            answer = self._post_direct(compressed)
            if answer is not None:
                self._direct_answer(*answer)
                self.direct_posts += 1
                return
            self._direct = False
        self.client_posts += 1
        self._fallback.post(compressed)
        self._direct = True

    def _direct_answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """Return on 2xx; raise for an answer that must not be sent again now."""
        if 200 <= status <= 299:
            return
        reason = body[:200].decode(errors="replace")
        if status == 429:
            self._hold_until = self._clock() + _hold_seconds(headers)
            raise IntakeError(status, reason, retry=True)
        raise IntakeError(status, reason, retry=False)

    def _post_direct(self, compressed: bytes) -> tuple[int, bytes, Mapping[str, str]] | None:
        """The intake's answer on the kept connection, None when the push is the client's path's to make (the
        connection failed, or a 5xx); a connection the server closed while idle is reopened before sending."""
        connection = self._connection
        connection.dropped()
        request = b"%sContent-Length: %d\r\n\r\n%s" % (self._head, len(compressed), compressed)
        try:
            status, body, headers = connection.exchange(request, MAX_ANSWER_BYTES)
        except OSError:
            return None
        if 200 <= status <= 299 or status == 429 or status in REFUSED:
            return status, body, headers
        return None

    @property
    def connected(self) -> bool:
        """Whether the direct connection is held."""
        return self._connection.open

    def close(self) -> None:
        """Close the direct connection (the client's pool is the client's)."""
        self._connection.close()


def _hold_seconds(headers: Mapping[str, str]) -> float:
    """How long a 429 holds pushes: X-RateLimit-Reset (Datadog's), else Retry-After, bounded; a garbled header is
    the default hold."""
    for name in ("x-ratelimit-reset", "retry-after"):
        text = headers.get(name, "").strip()
        if text.isascii() and text.isdigit() and len(text) <= 6:
            return min(MAX_HOLD_S, max(DEFAULT_HOLD_S, float(text)))
    return DEFAULT_HOLD_S
