"""Where series go: Datadog API v2 (buffered, batched, zstd or gzip), DogStatsD on a local Datadog Agent, or stdout.

The Datadog sender keeps a bounded buffer of cycles: an outage fills it, the oldest points are dropped first
(counted as `gpufarm.node.points_dropped{drop_reason:overflow}`), points Datadog would refuse as older than an
hour are dropped (`drop_reason:expired`), and a payload Datadog rejects as malformed is dropped
(`drop_reason:rejected`) rather than retried forever.

SeriesIntake goes through datadog-api-client's configuration, auth settings, connection pool and retry policy
(`ClientRetry`, which honours X-RateLimit-Reset); the agent pushes on its own connection first and hands every push
that fails there to it (gpufarm_node.series_post). The sender writes the JSON itself: `MetricsApi.submit_metrics`
deep copies the body (`data_to_dict`) and re-encodes it on every push, about 8 ms of CPU per 700 series, more than
the whole collection cycle. Here each series' fixed part is encoded once and cached, so a push costs its points, one
compression and one request (benchmarks/node.py). The payload is exactly what the client would send: the same
fields, compressed as `MetricContentEncoding.ZSTD1` (or `GZIP` without zstandard, gpufarm_node.compression), POST
/api/v2/series. Batches stay under 5,000,000 JSON bytes and are split until the compressed body is under Datadog's
512,000-byte limit.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import IO, Any, Protocol, runtime_checkable

from gpufarm_node.catalog import COUNT, METRICS
from gpufarm_node.collect import Row
from gpufarm_node.compression import compressor, default_encoding

log = logging.getLogger("gpufarm_node.sender")

MAX_POINT_AGE_S = 3600
MAX_RAW_BYTES = 5_000_000  # Datadog: 5,242,880 decompressed
MAX_COMPRESSED_BYTES = 512_000
_PREFIX_CACHE = 50_000
# Distinct values whose text a sender keeps (a few hundred per push: flags, sizes, counts repeat; means change).
_REPR_CACHE = 16_384
_METRIC = itemgetter(0)
_TAGS = itemgetter(2)
_VALUE = itemgetter(1)


class _Reprs(dict[float, str]):
    """Each value's JSON text, by value. Writing a float (`repr`, the shortest round-trip digits) was the push's
    largest cost, about 1,170 instructions a value; a dict lookup is about 560, and a push writes 2,700 values
    among a few hundred distinct ones (benchmarks/node_instructions.py, docs/nvml.md §10). Equal keys share one
    text, so the text is made from the value alone: `repr(float(value) + 0.0)` writes 0, 0.0 and -0.0 all as `0.0`
    (the same number), any other value as its float's repr."""

    def __missing__(self, value: float) -> str:
        text = self[value] = repr(float(value) + 0.0)
        return text


class Sender(Protocol):
    """Accepts each cycle's series; `flush` pushes what is pending."""

    def send(self, series: Sequence[Row], timestamp: int) -> None:
        """Queue one cycle's series, all stamped `timestamp` (epoch seconds): (metric, value, tags) rows, plain
        tuples or collect.Series."""

    def flush(self) -> bool:
        """Push pending series; False when something is left for later (an outage)."""

    def take_dropped(self) -> dict[str, int]:
        """Points dropped since the last call, by reason."""

    def close(self) -> None:
        """Flush and release connections."""


class IntakeError(Exception):
    """A series POST failed; `status` is the HTTP status (0: no answer), `retry` whether to keep the data."""

    def __init__(self, status: int, reason: str, *, retry: bool) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.retry = retry


class Intake(Protocol):
    """Something that accepts one compressed API v2 series payload, in its `encoding` (gpufarm_node.compression)."""

    encoding: str

    def post(self, compressed: bytes) -> None:
        """Send; raises IntakeError."""


@runtime_checkable
class ClosingIntake(Intake, Protocol):
    """An intake that holds a connection of its own (gpufarm_node.series_post), closed with the sender."""

    def close(self) -> None:
        """Close the connection."""


class SeriesIntake:
    """POST /api/v2/series through a datadog-api-client ApiClient's pool, retries, timeouts and API key."""

    def __init__(self, client: Any, encoding: str | None = None) -> None:
        import urllib3
        from datadog_api_client.v2.model.metric_content_encoding import MetricContentEncoding

        # zstd1 when zstandard is installed, else gzip; one of the client's own values (a typo fails here).
        self.encoding = encoding or default_encoding()
        if self.encoding not in MetricContentEncoding.allowed_values:
            raise ValueError(f"unsupported series encoding {self.encoding!r}")
        cfg = client.configuration
        auth = cfg.auth_settings()["apiKeyAuth"]
        self.url = f"{cfg.host.rstrip('/')}/api/v2/series"
        self._headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "Content-Encoding": self.encoding,
            "User-Agent": client.user_agent,
            auth["key"]: auth["value"],
        }
        connect, read = cfg.request_timeout if isinstance(cfg.request_timeout, tuple) else (None, None)
        self.read_timeout: float | None = read
        self._timeout = urllib3.Timeout(connect=connect, read=read)
        self._pool = client.rest_client.pool_manager

    @property
    def headers(self) -> dict[str, str]:
        """The request's headers (with the API key: never logged)."""
        return dict(self._headers)

    def post(self, compressed: bytes) -> None:
        """Send one payload; 2xx or IntakeError."""
        from urllib3.exceptions import HTTPError

        try:
            response = self._pool.request(
                "POST", self.url, body=compressed, headers=self._headers, timeout=self._timeout, preload_content=True
            )
        except (HTTPError, OSError) as exc:
            raise IntakeError(0, type(exc).__name__, retry=True) from exc
        if 200 <= response.status <= 299:
            return
        reason = response.data[:200].decode(errors="replace")
        # A malformed or oversized payload will be refused again: drop it. Anything else (auth, throttling,
        # outage) may heal: keep it.
        raise IntakeError(response.status, reason, retry=response.status not in (400, 413, 422))


def series_json(series: Row, timestamp: int, host: str | None, interval: int) -> dict[str, Any]:
    """One series in the API v2 intake shape (what --dry-run prints)."""
    metric, value, tags = series
    definition = METRICS[metric]
    body: dict[str, Any] = {
        "metric": metric,
        "type": definition.type,
        "points": [{"timestamp": timestamp, "value": value}],
        "tags": list(tags),
    }
    if host:
        body["resources"] = [{"name": host, "type": "host"}]
    if definition.unit:
        body["unit"] = definition.unit
    if definition.type == COUNT:
        body["interval"] = interval
    return body


class DatadogSender:
    """Datadog API v2 series, compressed in the intake's encoding, with an outage buffer and drop accounting."""

    def __init__(
        self,
        intake: Intake,
        hostname: str,
        *,
        interval: int = 15,
        max_points: int = 100_000,
        max_age: float = MAX_POINT_AGE_S,
        max_raw_bytes: int = MAX_RAW_BYTES,
        max_compressed_bytes: int = MAX_COMPRESSED_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._intake = intake
        self._compress = compressor(intake.encoding)
        self.hostname = hostname
        self._resources = json.dumps([{"name": hostname, "type": "host"}], separators=(",", ":"))
        self._interval = interval
        self._max_points = max_points
        self._max_age = max_age
        self._max_raw = max_raw_bytes
        self._max_compressed = max_compressed_bytes
        self._clock = clock
        # Cycles waiting to be sent: (timestamp, series); `_offset` series of the first are already sent.
        self._pending: deque[tuple[int, Sequence[Row]]] = deque()
        self._offset = 0
        self._points = 0
        self._dropped: Counter[str] = Counter()
        self._failing = False
        # (metric, tags) -> the series' JSON up to its points, built once.
        self._prefixes: dict[tuple[str, tuple[str, ...]], str] = {}
        # The last cycle shape seen by a push: its metrics and tags, in order, and their prefixes (None: a key
        # repeats).
        self._shape: tuple[list[str], list[tuple[str, ...]], list[str] | None] = ([], [], None)
        self._reprs = _Reprs()
        # What was sent, for the benchmark and the demo.
        self.stats: Counter[str] = Counter()

    @property
    def buffered(self) -> int:
        """Points waiting to be sent."""
        return self._points

    def send(self, series: Sequence[Row], timestamp: int) -> None:
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
        limit = self._max_raw
        if len(self._reprs) > _REPR_CACHE:
            self._reprs.clear()
        while self._pending:
            body, count, consumed, raw = self._next_batch(limit)
            compressed = self._compress(body.encode())
            if len(compressed) >= self._max_compressed and consumed > 1:
                # Rare (our JSON compresses 20-30x): cut a smaller batch from the same front of the queue.
                limit //= 2
                continue
            limit = self._max_raw
            try:
                self._intake.post(compressed)
            except IntakeError as exc:
                if exc.retry:
                    self._note_failure(exc)
                    return False
                # The status and Datadog's reason say it all; a traceback would add nothing.
                log.error("Datadog rejected a metrics payload (%s): %s", exc.status, exc.reason)  # noqa: TRY400
                self._dropped["rejected"] += consumed
            else:
                self.stats["requests"] += 1
                self.stats["series"] += count
                self.stats["points"] += consumed
                self.stats["raw_bytes"] += raw
                self.stats["compressed_bytes"] += len(compressed)
                if self._failing:
                    log.warning("metrics submission recovered")
                    self._failing = False
            self._advance(consumed)
        return True

    def take_dropped(self) -> dict[str, int]:
        """Points dropped since the last call, by reason (overflow, expired, rejected)."""
        dropped = dict(self._dropped)
        self._dropped.clear()
        return dropped

    def close(self) -> None:
        """Try a last flush; what cannot be sent is lost with the process. An intake's own connection is closed."""
        try:
            if self._pending and not self.flush():
                log.warning("%d points could not be sent before exit", self._points)
        finally:
            if isinstance(self._intake, ClosingIntake):
                self._intake.close()

    # -- internals ------------------------------------------------------------------------------------------

    def _next_batch(self, limit: int) -> tuple[str, int, int, int]:
        """The JSON body of the series at the front of the queue (points of one series merged), at most `limit`
        bytes; also its number of series, the number of queued points it holds, and its size."""
        return self._whole_cycles(limit) or self._point_by_point(limit)

    def _whole_cycles(self, limit: int) -> tuple[str, int, int, int] | None:
        """The usual push, column-wise: queued cycles that all list the same series in the same order (the
        agent's cycles do while nothing changes on the node), as many whole ones as fit in `limit`. None when
        the queue is not like that (a partly sent cycle, a series listed twice or added, a non-finite value,
        one cycle over the limit): then the point-by-point path decides. The JSON is the same either way."""
        if self._offset or not self._pending:
            return None
        first = self._pending[0][1]
        # Compared column by column: the builder hands out the same metric and tag objects every cycle, so each
        # comparison is an identity check, and no (metric, tags) pair is made.
        metrics, tags = list(map(_METRIC, first)), list(map(_TAGS, first))
        shape = self._prefixes_of(metrics, tags, first)
        if shape is None:
            return None
        prefixes = shape
        count = len(metrics)
        # Bytes: `{"series":[` and `]}`, each series' prefix, `]}` and a comma, each point and its comma.
        size = 16 + sum(map(len, prefixes)) + 3 * count
        columns: list[Any] = [prefixes]
        for timestamp, series in self._pending:
            if series is not first and (
                len(series) != count or list(map(_METRIC, series)) != metrics or list(map(_TAGS, series)) != tags
            ):
                return None  # the node changed: merge point by point, as one batch
            values = list(map(_VALUE, series))
            # A NaN or an infinity makes the sum one; so can finite values past 1e308 (then the point-by-point
            # path writes the same JSON): one C pass instead of a call per value.
            if not math.isfinite(sum(values)):
                return None
            head = f'{{"timestamp":{timestamp},"value":'
            reprs = list(map(self._reprs.__getitem__, values))
            # Each point is head + value + `}`, and a comma.
            cost = len("".join(reprs)) + count * (len(head) + 2)
            if size + cost > limit:
                break
            size += cost
            columns += (repeat(head if len(columns) == 1 else "}," + head, count), reprs)
        cycles = len(columns) // 2
        if not cycles:
            return None
        columns.append(repeat("}]},", count))
        # Series by series, the pieces of the body (prefix, then each point's head and value) in one join: the
        # per-point work is C's.
        body = "".join(chain.from_iterable(zip(*columns, strict=True)))
        return f'{{"series":[{body[:-1]}]}}', count, count * cycles, size

    def _prefixes_of(self, metrics: list[str], tags: list[tuple[str, ...]], series: Sequence[Row]) -> list[str] | None:
        """The prefixes of a cycle's series in order; None when a series appears twice (its points merge then)."""
        known_metrics, known_tags, found = self._shape
        if metrics == known_metrics and tags == known_tags:
            return found
        known = self._prefixes
        found = None
        keys = list(zip(metrics, tags, strict=True))
        if len(set(keys)) == len(keys):
            found = [known.get(key) or self._prefix(item) for key, item in zip(keys, series, strict=True)]
        self._shape = (metrics, tags, found)
        return found

    def _point_by_point(self, limit: int) -> tuple[str, int, int, int]:
        merged: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        prefixes = self._prefixes
        size = 16
        consumed = 0
        offset = self._offset
        reprs = self._reprs
        # The hot loop of a push (hundreds of series per cycle): locals and tuple indexes, no attribute lookups.
        for timestamp, series in self._pending:
            head = f'{{"timestamp":{timestamp},"value":'
            for item in series[offset:] if offset else series:
                value = item[1]
                if value - value:  # NaN or infinity (x - x is 0.0 for every finite x): JSON cannot carry them
                    consumed += 1
                    self._dropped["rejected"] += 1
                    continue
                point = f"{head}{reprs[value]}}}"
                key = (item[0], item[2])
                points = merged.get(key)
                if points is None:
                    prefix = prefixes.get(key) or self._prefix(item)
                    cost = len(prefix) + len(point) + 4
                else:
                    cost = len(point) + 1
                if consumed and size + cost > limit:
                    return self._render(merged), len(merged), consumed, size
                size += cost
                consumed += 1
                if points is None:
                    merged[key] = [point]
                else:
                    points.append(point)
            offset = 0
        return self._render(merged), len(merged), consumed, size

    def _prefix(self, item: Row) -> str:
        metric, _, tags = item
        definition = METRICS[metric]
        head = {"metric": metric, "type": definition.type, "tags": list(tags)}
        if definition.unit:
            head["unit"] = definition.unit
        if definition.type == COUNT:
            head["interval"] = self._interval
        encoded = json.dumps(head, separators=(",", ":"))
        prefix = f'{encoded[:-1]},"resources":{self._resources},"points":['
        if len(self._prefixes) >= _PREFIX_CACHE:
            self._prefixes.clear()  # series churn (pids, containers): start over rather than grow forever
            self._shape = ([], [], None)
        self._prefixes[(metric, tags)] = prefix
        return prefix

    def _render(self, merged: dict[tuple[str, tuple[str, ...]], list[str]]) -> str:
        prefixes = self._prefixes
        parts = [f"{prefixes[key]}{','.join(points)}]}}" for key, points in merged.items()]
        return '{"series":[' + ",".join(parts) + "]}"

    def _note_failure(self, exc: IntakeError) -> None:
        if not self._failing:
            log.warning(
                "metrics submission failing (%s); buffering up to %d points", exc.status or exc.reason, self._max_points
            )
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

    def send(self, series: Sequence[Row], timestamp: int) -> None:
        """Send right away (the Agent aggregates and stamps); lines are packed into datagrams."""
        buffer: list[bytes] = []
        size = 0
        for metric, value, tags in series:
            kind = "c" if METRICS[metric].type == COUNT else "g"
            line = f"{metric}:{value!r}|{kind}|#{','.join(tags)}".encode()
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

    def send(self, series: Sequence[Row], timestamp: int) -> None:
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
