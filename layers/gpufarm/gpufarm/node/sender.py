"""Where series go: Datadog API v2 (buffered, batched, gzip), DogStatsD on a local Datadog Agent, or stdout.

The Datadog sender keeps a bounded buffer of cycles: an outage fills it, the oldest points are dropped first
(counted as `gpufarm.node.points_dropped{drop_reason:overflow}`), points Datadog would refuse as older than an
hour are dropped (`drop_reason:expired`), and a payload Datadog rejects as malformed is dropped
(`drop_reason:rejected`) rather than retried forever.

Batches are cut so the JSON stays under 500,000 bytes: gzip can only grow incompressible input by a few bytes
per 16 KB block, so the compressed payload is then certainly under Datadog's 512,000-byte limit (and far under
the 5 MB decompressed one) without compressing twice to check.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import IO, Any, Protocol

from gpufarm.node.catalog import COUNT, METRICS
from gpufarm.node.collect import Series

log = logging.getLogger("gpufarm.node.sender")

MAX_BATCH_JSON_BYTES = 500_000
MAX_POINT_AGE_S = 3600
# Upper bound of one `{"timestamp": ..., "value": ...}, ` in the client's json.dumps output.
_POINT_BYTES = len('{"timestamp": 10000000000, "value": }, ') + 24
_SERIES_BYTES = len('{"metric": "", "type": 1, "points": [], "resources": [{"name": "", "type": "host"}], ')
_SERIES_BYTES += len('"tags": [], "unit": "", "interval": 100000}, ')


class Sender(Protocol):
    """Accepts each cycle's series; `flush` pushes what is pending."""

    def send(self, series: Sequence[Series], timestamp: int) -> None:
        """Queue one cycle's series, all stamped `timestamp` (epoch seconds)."""

    def flush(self) -> bool:
        """Push pending series; False when something is left for later (an outage)."""

    def take_dropped(self) -> dict[str, int]:
        """Points dropped since the last call, by reason."""

    def close(self) -> None:
        """Flush and release connections."""


def series_json(series: Series, timestamp: int, host: str | None, interval: int) -> dict[str, Any]:
    """One series in the API v2 intake shape (also what --dry-run prints)."""
    definition = METRICS[series.metric]
    body: dict[str, Any] = {
        "metric": series.metric,
        "type": definition.type,
        "points": [{"timestamp": timestamp, "value": series.value}],
        "tags": list(series.tags),
    }
    if host:
        body["resources"] = [{"name": host, "type": "host"}]
    if definition.unit:
        body["unit"] = definition.unit
    if definition.type == COUNT:
        body["interval"] = interval
    return body


def json_size_bound(series: Series, host: str) -> int:
    """An upper bound of the series' length in json.dumps output (ASCII-escaped), without its points."""
    size = _SERIES_BYTES + len(series.metric) + len(host) + 16
    for tag in series.tags:
        # ensure_ascii turns a non-ASCII character into up to 12 bytes (a surrogate pair of \\uXXXX).
        size += (len(tag) if tag.isascii() else 12 * len(tag)) + 4
    return size


class DatadogSender:
    """Datadog API v2 series through datadog-api-client's MetricsApi, gzip-encoded, with an outage buffer."""

    def __init__(
        self,
        metrics_api: Any,
        hostname: str,
        *,
        interval: int = 15,
        max_points: int = 100_000,
        max_age: float = MAX_POINT_AGE_S,
        max_batch_bytes: int = MAX_BATCH_JSON_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from datadog_api_client.v2.model.metric_content_encoding import MetricContentEncoding

        self._api = metrics_api
        self._gzip = MetricContentEncoding.GZIP
        self.hostname = hostname
        self._resources = [{"name": hostname, "type": "host"}]
        self._interval = interval
        self._max_points = max_points
        self._max_age = max_age
        self._max_batch = max_batch_bytes
        self._clock = clock
        # Cycles waiting to be sent: (timestamp, series); `_offset` series of the first are already sent.
        self._pending: deque[tuple[int, Sequence[Series]]] = deque()
        self._offset = 0
        self._points = 0
        self._dropped: Counter[str] = Counter()
        self._failing = False
        # What was sent, for the benchmark and the demo: requests, points, and the JSON bytes before gzip.
        self.stats: Counter[str] = Counter()

    @property
    def buffered(self) -> int:
        """Points waiting to be sent."""
        return self._points

    def send(self, series: Sequence[Series], timestamp: int) -> None:
        """Queue a cycle; when the buffer is full the oldest points go first."""
        if not series:
            return
        self._pending.append((timestamp, series))
        self._points += len(series)
        while self._points > self._max_points and len(self._pending) > 1:
            self._drop_first("overflow")
        if self._points > self._max_points:
            # A single cycle larger than the whole buffer: keep its newest points.
            timestamp, only = self._pending[0]
            excess = self._points - self._max_points
            self._pending[0] = (timestamp, only[self._offset + excess :])
            self._offset = 0
            self._points = self._max_points
            self._dropped["overflow"] += excess

    def flush(self) -> bool:
        """Send pending series in size-bounded batches; stops at the first failure and keeps the rest."""
        horizon = self._clock() - self._max_age + 60  # a minute of slack for the request itself
        while self._pending and self._pending[0][0] < horizon:
            self._drop_first("expired")
        while self._pending:
            body, consumed = self._next_batch()
            outcome = self._submit(body)
            if outcome == "retry":
                return False
            self._advance(consumed)
            if outcome == "rejected":
                self._dropped["rejected"] += consumed
        return True

    def take_dropped(self) -> dict[str, int]:
        """Points dropped since the last call, by reason (overflow, expired, rejected)."""
        dropped = dict(self._dropped)
        self._dropped.clear()
        return dropped

    def close(self) -> None:
        """Try a last flush; what cannot be sent is lost with the process."""
        if self._pending and not self.flush():
            log.warning("%d points could not be sent before exit", self._points)

    # -- internals ------------------------------------------------------------------------------------------

    def _next_batch(self) -> tuple[dict[str, Any], int]:
        """A payload from the front of the queue and the number of queued points it holds."""
        merged: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}
        size = 32
        consumed = 0
        offset = self._offset
        host = self.hostname
        for timestamp, series in self._pending:
            for item in series[offset:]:
                key = (item.metric, item.tags)
                entry = merged.get(key)
                cost = _POINT_BYTES if entry is not None else _POINT_BYTES + json_size_bound(item, host)
                if consumed and size + cost > self._max_batch:
                    return {"series": list(merged.values())}, consumed
                size += cost
                consumed += 1
                point = {"timestamp": timestamp, "value": item.value}
                if entry is not None:
                    # The same series in a later cycle: one more point, not another series.
                    entry["points"].append(point)
                    continue
                definition = METRICS[item.metric]
                entry = {
                    "metric": item.metric,
                    "type": definition.type,
                    "points": [point],
                    "resources": self._resources,
                    "tags": list(item.tags),
                }
                if definition.unit:
                    entry["unit"] = definition.unit
                if definition.type == COUNT:
                    entry["interval"] = self._interval
                merged[key] = entry
            offset = 0
        return {"series": list(merged.values())}, consumed

    def _submit(self, body: dict[str, Any]) -> str:
        """'sent', 'retry' (keep the data: outage, auth, throttling) or 'rejected' (drop: Datadog refused it)."""
        from datadog_api_client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            self._api.submit_metrics(body=body, content_encoding=self._gzip)
        except ApiException as exc:
            status = int(exc.status or 0)
            if status in (400, 413, 422):
                # The status and Datadog's reason say it all; a traceback would add nothing (hence TRY400 off).
                log.error("Datadog rejected a metrics payload (%s): %s", status, _reason(exc))  # noqa: TRY400
                return "rejected"
            self._note_failure(f"HTTP {status} {_reason(exc)}")
            return "retry"
        except (HTTPError, OSError) as exc:
            self._note_failure(type(exc).__name__)
            return "retry"
        if self._failing:
            log.warning("metrics submission recovered")
            self._failing = False
        self.stats["requests"] += 1
        self.stats["series"] += len(body["series"])
        self.stats["points"] += sum(len(s["points"]) for s in body["series"])
        return "sent"

    def _note_failure(self, what: str) -> None:
        if not self._failing:
            log.warning("metrics submission failing (%s); buffering up to %d points", what, self._max_points)
            self._failing = True
        self.stats["failures"] += 1

    def _advance(self, consumed: int) -> None:
        while consumed and self._pending:
            available = len(self._pending[0][1]) - self._offset
            if consumed >= available:
                self._pending.popleft()
                self._points -= available
                consumed -= available
                self._offset = 0
            else:
                self._offset += consumed
                self._points -= consumed
                consumed = 0

    def _drop_first(self, reason: str) -> None:
        _, series = self._pending.popleft()
        lost = len(series) - self._offset
        self._offset = 0
        self._points -= lost
        self._dropped[reason] += lost


def _reason(exc: Any) -> str:
    body = getattr(exc, "body", None)
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or exc.reason or "")
    return text[:200]


class DogStatsdSender:
    """DogStatsD datagrams (`metric:value|g|#tag1,tag2`) to a local Datadog Agent over UDP."""

    def __init__(self, host: str, port: int, *, max_datagram: int = 1432) -> None:
        self.address = (host, port)
        self._max = max_datagram
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.setblocking(False)
        self._dropped: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()

    def send(self, series: Sequence[Series], timestamp: int) -> None:
        """Send right away (the Agent aggregates and stamps); lines are packed into datagrams."""
        buffer: list[bytes] = []
        size = 0
        for item in series:
            kind = "c" if METRICS[item.metric].type == COUNT else "g"
            line = f"{item.metric}:{item.value!r}|{kind}|#{','.join(item.tags)}".encode()
            if buffer and size + len(line) + 1 > self._max:
                self._write(buffer)
                buffer, size = [], 0
            buffer.append(line)
            size += len(line) + 1
        if buffer:
            self._write(buffer)

    def _write(self, lines: list[bytes]) -> None:
        try:
            self._socket.sendto(b"\n".join(lines), self.address)
            self.stats["datagrams"] += 1
        except OSError as exc:
            # UDP to a local Agent: nothing to retry; count what was lost.
            self._dropped["send_error"] += len(lines)
            log.debug("DogStatsD send failed: %s", exc)

    def flush(self) -> bool:
        """Nothing is buffered."""
        return True

    def take_dropped(self) -> dict[str, int]:
        """Lines that could not be sent."""
        dropped = dict(self._dropped)
        self._dropped.clear()
        return dropped

    def close(self) -> None:
        """Close the socket."""
        self._socket.close()


class JsonLinesSender:
    """--dry-run: each cycle's API v2 payload as one JSON line on a stream."""

    def __init__(self, hostname: str | None, *, stream: IO[str] | None = None, interval: int = 15) -> None:
        self.hostname = hostname
        self._stream = stream
        self._interval = interval

    def send(self, series: Sequence[Series], timestamp: int) -> None:
        """Write the payload now."""
        payload = {"series": [series_json(s, timestamp, self.hostname, self._interval) for s in series]}
        stream = self._stream or sys.stdout
        stream.write(json.dumps(payload, separators=(",", ":")) + "\n")
        stream.flush()

    def flush(self) -> bool:
        """Nothing is buffered."""
        return True

    def take_dropped(self) -> dict[str, int]:
        """Nothing is dropped."""
        return {}

    def close(self) -> None:
        """Nothing to release."""
