"""The host's own `user` tags, read once per collection cycle: the lease on the host (`ir:`) and on each device
(`gpu_assign:ir-<N>/<uuid>`), so a new assignment is attributed from the next cycle on, not minutes later.

The read is one small `GET /api/v1/tags/hosts/<host>?source=user` per cycle (docs/nvml.md §11):
- it never fails a cycle: any error keeps the last good tags, and the next read waits (exponential backoff for
  errors and outages, the whole of `X-RateLimit-Reset` after a 429);
- it follows Datadog's `X-RateLimit-*` headers: while `Remaining` stays above a low-water mark of `Limit` it reads
  every cycle; below it, it waits for the window to turn, plus a delay fixed per host (a hash of the host name) over
  a spread, so the hosts of a farm that share the budget do not all come back at the first second of the window;
- it goes over one kept-alive connection with the client's own host, keys, TLS verification and user agent,
  its answer read by a small bounded HTTP/1.1 reader (HttpTagsTransport says why);
- an answer equal to the previous one is not parsed again.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from gpufarm_node.tags import assignments, host_lease

log = logging.getLogger("gpufarm_node.hosttags")

SOURCE = "user"
# Bounds on what Datadog sends back: a host's user tags are a few dozen short strings.
MAX_BODY_BYTES = 256 << 10
MAX_HEAD_BYTES = 64 << 10
MAX_TAGS = 4096
MAX_TAG_CHARS = 200
# At or below this share of the window's budget left (and always at the last request), reads wait for the window.
LOW_WATER = 0.1
# Hosts spread their first read of a new window over this many seconds (at most the window's length).
SPREAD_S = 15.0
BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 300.0


class TagsTransport(Protocol):
    """One GET of the host's user tags: (HTTP status, body, headers with lower-case names); raises OSError."""

    def get(self) -> tuple[int, bytes, Mapping[str, str]]:
        """Read once."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Datadog's `X-RateLimit-*` headers of one answer (None where absent or not a number)."""

    limit: int | None
    remaining: int | None
    reset: int | None
    period: int | None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RateLimit:
        """Read the four headers; anything that is not a small whole number counts as absent."""
        return cls(
            *(_small_int(headers.get(f"x-ratelimit-{name}")) for name in ("limit", "remaining", "reset", "period"))
        )


def _small_int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not 0 < len(text) <= 9 or not text.isascii() or not text.isdigit():
        return None
    return int(text)


class AnswerError(OSError):
    """The server's answer is not the HTTP/1.1 this reader takes (or is over its bounds): the connection is dropped."""


class HttpTagsTransport:
    """GET /api/v1/tags/hosts/<host>?source=user on one kept-alive connection (TLS through `ssl` for https).

    The request's bytes are made once; the answer is read by a small HTTP/1.1 reader: status line, headers,
    then a `Content-Length` body, a chunked one, or one that ends with the connection, each bounded. The read
    runs every cycle, and the same read through urllib3 (whose header parsing goes through http.client and the
    `email` package) adds more than a tenth to the agent's CPU per cycle: benchmarks/node.py measures both side
    by side (docs/nvml.md §10). Anything it does not take (a 1xx answer, a malformed line, an answer over the
    bounds) drops the connection and counts as a failed read; the next read opens a new connection.
    """

    def __init__(
        self,
        base_url: str,
        hostname: str,
        headers: Mapping[str, str],
        *,
        timeout: float = 3.0,
        verify: bool = True,
        ca_file: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {base_url[:80]!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._timeout = timeout
        self._context: ssl.SSLContext | None = None
        if self._https:
            self._context = ssl.create_default_context(cafile=ca_file)
            if not verify:
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE
        self.path = f"{parts.path.rstrip('/')}/api/v1/tags/hosts/{quote(hostname, safe='')}?source={SOURCE}"
        lines = [f"GET {self.path} HTTP/1.1", f"Host: {parts.netloc}", "Accept: application/json"]
        for name, value in headers.items():
            if any(ch in f"{name}{value}" for ch in "\r\n\0"):
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}")
        self._request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._sock: socket.socket | None = None
        self._buffer = b""

    @classmethod
    def from_client(cls, client: Any, hostname: str, *, timeout: float = 3.0) -> HttpTagsTransport:
        """The same host, keys, TLS settings and user agent as a datadog-api-client ApiClient."""
        cfg = client.configuration
        auth = cfg.auth_settings()
        headers = {"User-Agent": client.user_agent}
        for name in ("apiKeyAuth", "appKeyAuth"):
            if name in auth:
                headers[auth[name]["key"]] = auth[name]["value"]
        return cls(cfg.host, hostname, headers, timeout=timeout, verify=bool(cfg.verify_ssl), ca_file=cfg.ssl_ca_cert)

    def get(self) -> tuple[int, bytes, Mapping[str, str]]:
        """One read; a kept-alive connection the server closed meanwhile is reopened once (a GET is safe)."""
        reused = self._sock is not None
        try:
            return self._exchange()
        except OSError:
            self.close()
            if not reused:
                raise
        return self._exchange()

    def _exchange(self) -> tuple[int, bytes, Mapping[str, str]]:
        if self._sock is None:
            sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self._host)
            self._sock, self._buffer = sock, b""
        try:
            self._sock.sendall(self._request)
            status, headers = _head(self._until(b"\r\n\r\n", MAX_HEAD_BYTES))
            body = self._body(headers)
        except OSError:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body, headers

    def _body(self, headers: Mapping[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            size = 0
            while True:
                line = self._until(b"\r\n", 64).partition(b";")[0].strip()
                if not line or len(line) > 8 or any(ch not in b"0123456789abcdefABCDEF" for ch in line):
                    raise AnswerError("malformed chunk size")
                length = int(line, 16)
                if not length:
                    while self._until(b"\r\n", MAX_HEAD_BYTES):  # trailers, up to the empty line
                        pass
                    return b"".join(chunks)
                size += length
                if size > MAX_BODY_BYTES:
                    raise AnswerError(f"host tags answer over {MAX_BODY_BYTES} bytes")
                chunks.append(self._exactly(length))
                if self._exactly(2) != b"\r\n":
                    raise AnswerError("malformed chunk")
        length_text = headers.get("content-length")
        if length_text is None:
            # The body ends with the connection.
            while self._receive(MAX_BODY_BYTES):
                pass
            body, self._buffer = self._buffer, b""
            self.close()
            return body
        declared = _small_int(length_text)
        if declared is None or declared > MAX_BODY_BYTES:
            raise AnswerError(f"Content-Length {length_text[:20]!r} refused")
        return self._exactly(declared)

    def _receive(self, limit: int) -> bool:
        """More bytes into the buffer; False at the end of the stream. Raises past `limit` bytes buffered."""
        if len(self._buffer) > limit:
            raise AnswerError(f"host tags answer over {limit} bytes")
        assert self._sock is not None
        chunk = self._sock.recv(65536)
        self._buffer += chunk
        return bool(chunk)

    def _until(self, delimiter: bytes, limit: int) -> bytes:
        """The buffered bytes up to `delimiter` (consumed with it, returned without)."""
        while delimiter not in self._buffer:
            if not self._receive(limit):
                raise AnswerError("the connection closed mid-answer")
        found, _, self._buffer = self._buffer.partition(delimiter)
        return found

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not self._receive(size):
                raise AnswerError("the connection closed mid-answer")
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def close(self) -> None:
        """Close the connection (the next read opens a new one)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buffer = None, b""


def _head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names) of an answer's head."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status_text = rest[:3]
    if not version.startswith("HTTP/1.") or len(status_text) != 3 or not status_text.isdigit():
        raise AnswerError(f"not an HTTP/1.x status line: {lines[0][:40]!r}")
    status = int(status_text)
    if status < 200:
        raise AnswerError(f"interim answer {status}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise AnswerError(f"malformed header line {line[:40]!r}")
        headers[name.lower()] = value.strip()
    return status, headers


class HostTagWatch:
    """The host's user tags as of the last good read, with what attribution needs from them.

    `poll()` is called once per cycle and reads when due (see the module's docstring); it never raises.
    """

    def __init__(
        self,
        transport: TagsTransport,
        hostname: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        low_water: float = LOW_WATER,
        spread: float = SPREAD_S,
        backoff_first: float = BACKOFF_FIRST_S,
        backoff_max: float = BACKOFF_MAX_S,
    ) -> None:
        self._transport = transport
        self.hostname = hostname
        self._clock = clock
        self._low_water = low_water
        # Where in a spread this host comes back: fixed per host name, the same on every agent restart.
        self._offset = (zlib.crc32(hostname.encode()) % 1000) / 1000
        self._spread = spread
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max
        self._next_at: float | None = None
        self._failures = 0
        self._body: bytes | None = None
        self.tags: tuple[str, ...] = ()
        # {lower-case device uuid: ir}, and the lease the whole host belongs to (gpufarm_node.tags.host_lease).
        self.assignments: Mapping[str, str] = {}
        self.host_ir: str | None = None
        # True once a read succeeded (until then the registrar's view of the host's `ir:` tag stands).
        self.known = False
        self.last_rate: RateLimit | None = None
        self.stats: Counter[str] = Counter()
        self._warned: set[str] = set()

    @classmethod
    def from_client(cls, client: Any, hostname: str, **kwargs: Any) -> HostTagWatch:
        """A watch reading through a datadog-api-client ApiClient's host and keys."""
        return cls(HttpTagsTransport.from_client(client, hostname), hostname, **kwargs)

    def due(self) -> bool:
        """Whether the next poll reads."""
        return self._next_at is None or self._clock() >= self._next_at

    def poll(self) -> bool:
        """Read the tags when due; True when they were read this time. Errors keep the last good tags."""
        if self._next_at is not None and self._clock() < self._next_at:
            self.stats["skipped"] += 1
            return False
        try:
            status, body, headers = self._transport.get()
        except (OSError, ValueError) as exc:
            self._failed(f"{type(exc).__name__}")
            return False
        now = self._clock()
        rate = self.last_rate = RateLimit.from_headers(headers)
        if status == 429:
            self.stats["throttled"] += 1
            wait = rate.reset if rate.reset is not None else (rate.period or 10)
            self._next_at = now + wait + self._offset * self._spread_of(rate)
            self._warn("throttled", "host tag reads of %s are rate limited (429); reading again in %.0fs", wait)
            return False
        if status == 404:
            body = b'{"tags":[]}'  # a host Datadog has not seen yet carries no tags
        elif status in (401, 403):
            self._failed(f"HTTP {status}", wait=self._backoff_max)
            return False
        elif not 200 <= status <= 299:
            self._failed(f"HTTP {status}")
            return False
        if body != self._body:
            tags = _tags_of(body)
            if tags is None:
                self._failed("malformed answer")
                return False
            self._body = body
            self._apply(tags)
        self.known = True
        self._failures = 0
        self._warned.clear()
        self.stats["reads"] += 1
        self._next_at = self._paced(now, rate)
        return True

    def _apply(self, tags: tuple[str, ...]) -> None:
        self.tags = tags
        assigned = dict(assignments(tags))
        if assigned != self.assignments:
            log.info("%s: device assignments now %s", self.hostname, assigned or "none")
        self.assignments = assigned
        self.host_ir = host_lease(tags)

    def _paced(self, now: float, rate: RateLimit) -> float | None:
        """When to read next: every cycle, or after the window turns while its budget is nearly spent."""
        if rate.limit and rate.remaining is not None and rate.remaining <= max(1.0, self._low_water * rate.limit):
            self.stats["slowed"] += 1
            wait = rate.reset if rate.reset is not None else (rate.period or 10)
            return now + wait + self._offset * self._spread_of(rate)
        return None

    def _spread_of(self, rate: RateLimit) -> float:
        return min(self._spread, float(rate.period)) if rate.period else self._spread

    def _failed(self, why: str, *, wait: float | None = None) -> None:
        self.stats["errors"] += 1
        self._failures += 1
        if wait is None:
            wait = min(self._backoff_max, self._backoff_first * 2 ** (self._failures - 1))
        self._next_at = self._clock() + wait
        self._warn(f"failed:{why}", "reading the host tags of %s failed (%s); the last good tags stand", why)

    def _warn(self, key: str, message: str, arg: object) -> None:
        # Once per kind of trouble until a read works again: an outage must not write a line per cycle.
        if key in self._warned:
            return
        if len(self._warned) < 64:
            self._warned.add(key)
        log.warning(message, self.hostname, arg)

    def close(self) -> None:
        """Release the connection."""
        close = getattr(self._transport, "close", None)
        if close is not None:
            close()


def _tags_of(body: bytes) -> tuple[str, ...] | None:
    """The `tags` list of a host tags answer, bounded; None when the answer is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    tags = doc.get("tags") if isinstance(doc, dict) else None
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        return None
    return tuple(t for t in tags if isinstance(t, str) and len(t) <= MAX_TAG_CHARS)
