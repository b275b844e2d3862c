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
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from gpufarm_node.http1 import Http1Connection, request_head, small_int
from gpufarm_node.tags import assignments, host_lease

log = logging.getLogger("gpufarm_node.hosttags")

SOURCE = "user"
# Bounds on what Datadog sends back: a host's user tags are a few dozen short strings.
MAX_BODY_BYTES = 256 << 10
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
            *(small_int(headers.get(f"x-ratelimit-{name}")) for name in ("limit", "remaining", "reset", "period"))
        )


class HttpTagsTransport:
    """GET /api/v1/tags/hosts/<host>?source=user on one kept-alive connection (gpufarm_node.http1).

    The request's bytes are made once; the answer is read by gpufarm_node.http1's small bounded HTTP/1.1 reader. The
    read runs every cycle, and the same read through urllib3 adds more than a tenth to the agent's CPU per cycle:
    benchmarks/node.py measures both side by side (docs/nvml.md §10). An answer the reader does not take drops the
    connection and counts as a failed read; the next read opens a new connection.
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
        self._connection = Http1Connection(base_url, timeout=timeout, verify=verify, ca_file=ca_file)
        self.path = f"{self._connection.base_path}/api/v1/tags/hosts/{quote(hostname, safe='')}?source={SOURCE}"
        head = request_head("GET", self.path, self._connection.netloc, {"Accept": "application/json", **headers})
        self._request = head.encode("latin-1")

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

    @property
    def connected(self) -> bool:
        """Whether a kept-alive connection is held."""
        return self._connection.open

    def get(self) -> tuple[int, bytes, Mapping[str, str]]:
        """One read; a kept-alive connection the server closed meanwhile is reopened once (a GET is safe)."""
        reused = self._connection.open
        try:
            return self._connection.exchange(self._request, MAX_BODY_BYTES)
        except OSError:
            if not reused:
                raise
        return self._connection.exchange(self._request, MAX_BODY_BYTES)

    def close(self) -> None:
        """Close the connection (the next read opens a new one)."""
        self._connection.close()


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
