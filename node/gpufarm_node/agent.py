"""One node's agent: snapshot -> attribution -> series -> sender, every interval; the host's tags read every cycle
(gpufarm_node.hosttags: the lease of each device and of the host); registration on its own schedule."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from gpufarm_node.attribution import Attributor, Workload
from gpufarm_node.collect import AgentStats, CollectOptions, Row, Series, SeriesBuilder
from gpufarm_node.gpu_names import gpu_model
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.model import NodeSnapshot, SnapshotSource
from gpufarm_node.registration import HostRegistrar, unit_tags
from gpufarm_node.sender import Sender
from gpufarm_node.series_tags import identity_tags
from gpufarm_node.squatter_stops import SquatterStopper
from gpufarm_node.squatters import Squatter, UserNames

log = logging.getLogger("gpufarm_node.agent")
_PID = attrgetter("pid")

# A cycle allocates a few thousand short-lived containers (samples, series, tag lookups), nearly all freed by
# reference counting the same cycle; at CPython's default (700) the collector ran 3-4 times a cycle and, with
# the older generations it drags along, cost about as much as building the series (benchmarks/node.py).
GC_YOUNG_THRESHOLD = 20_000


@dataclass(frozen=True)
class CycleReport:
    """What one cycle did."""

    timestamp: int
    series: int
    collect_seconds: float
    flushed: bool | None


class LeaseMarks(Protocol):
    """What marks the host's scheduler with its lease (gpufarm_node.enforce.kube.NodeMarker): told each cycle, no
    I/O in the call."""

    def want(self, ir: str | None) -> None: ...


class Agent:
    """Runs cycles for one node; `cycle()` is synchronous so simulations and tests drive it step by step."""

    def __init__(
        self,
        source: SnapshotSource,
        attributor: Attributor,
        sender: Sender,
        *,
        hostname: str,
        environment: str,
        cluster: str,
        options: CollectOptions | None = None,
        registrar: HostRegistrar | None = None,
        clock: Callable[[], float] = time.time,
        flush_interval: float = 0.0,
        host_tags: HostTagWatch | None = None,
        lease_marks: LeaseMarks | None = None,
        squatter_source: Callable[[], Iterable[Squatter]] | None = None,
        squatter_stops: SquatterStopper | None = None,
    ) -> None:
        self.source = source
        self.attributor = attributor
        self.sender = sender
        self.hostname = hostname
        self.environment = environment
        self.cluster = cluster
        self.registrar = registrar
        self.host_tags = host_tags
        self.lease_marks = lease_marks
        # Squatters another part of the agent finds (pods of another lease, by pod-resources), merged each cycle.
        self.squatter_source = squatter_source
        # Carries out the stops gpufarm publishes on the host's tags (gpufarm_node.squatter_stops).
        self.squatter_stops = squatter_stops
        self.builder = SeriesBuilder(
            identity_tags(environment, cluster), options, user_of=UserNames(attributor.proc.root).of
        )
        self._clock = clock
        self._flush_interval = flush_interval
        self._last_flush: float | None = None
        self._dropped: Counter[str] = Counter()
        # The last cycle's rows, as handed to the sender.
        self.last_rows: list[Row] = []

    @property
    def last_series(self) -> list[Series]:
        """The last cycle's series (made on demand from its rows, for tests and simulations)."""
        return list(map(Series._make, self.last_rows))

    def start(self) -> None:
        """Initialise the source (NVML); raises NvmlUnavailable when there is none."""
        self.source.start()

    def cycle(self, now: float | None = None) -> CycleReport:
        """Collect, attribute, build and hand one cycle to the sender; flush when due."""
        started = time.perf_counter()
        snap = self.source.snapshot()
        workloads = self._attribute(snap)
        collect_seconds = time.perf_counter() - started
        if self.registrar is not None and self.registrar.due() and snap.gpus:
            self.registrar.refresh(_main_model(snap), len(snap.gpus), unit_tags(snap))
        host_tags = self.host_tags
        assigned = None
        if host_tags is not None:
            # Every cycle (when the rate limit allows): a new assignment is attributed from this cycle on.
            host_tags.poll()
        if host_tags is not None and host_tags.known:
            host_ir, assigned = host_tags.host_ir, host_tags.assignments
            if self.lease_marks is not None:
                # Only from a good read: an unread host must not lose its marks.
                self.lease_marks.want(host_ir)
        else:
            host_ir = self.registrar.host_ir() if self.registrar is not None else None
        self._dropped.update(self.sender.take_dropped())
        stats = AgentStats(collect_seconds, dict(self._dropped))
        self._dropped.clear()
        owners = self.attributor.device_owners
        reported = self._reported()
        series = self.builder.rows(snap, workloads, owners, host_ir, stats, assigned=assigned, reported=reported)
        self.last_rows = series
        if self.squatter_stops is not None and host_tags is not None and host_tags.known:
            self._stop_squatters(host_tags.tags)
        timestamp = int(self._clock() if now is None else now)
        self.sender.send(series, timestamp)
        flushed = None
        if self._last_flush is None or timestamp - self._last_flush >= self._flush_interval:
            self._last_flush = timestamp
            flushed = self.sender.flush()
        return CycleReport(timestamp, len(series), collect_seconds, flushed)

    def _reported(self) -> list[Squatter]:
        """The squatter source's findings this cycle; a failing source costs its findings, never the cycle."""
        if self.squatter_source is None:
            return []
        try:
            return list(self.squatter_source())
        except Exception:
            log.exception("the squatter source failed; this cycle reports what the agent found itself")
            return []

    def _stop_squatters(self, tags: tuple[str, ...]) -> None:
        """The stops the host's tags name, on this cycle's squatters; a failure costs the stop, never the cycle."""
        assert self.squatter_stops is not None
        try:
            self.squatter_stops.apply(tags, self.builder.squatters)
        except Exception:
            log.exception("squatter stops failed this cycle")

    def _attribute(self, snap: NodeSnapshot) -> dict[int, Workload | None]:
        attributor = self.attributor
        attributor.begin_cycle()
        # Each device's pids, then each of its slices', in the snapshot's order; read by map, not a generator
        # resumed per process.
        pids: list[int] = []
        extend = pids.extend
        for gpu in snap.gpus:
            extend(map(_PID, gpu.processes))
            for mig in gpu.migs:
                extend(map(_PID, mig.processes))
        workloads = attributor.workloads(pids)
        attributor.end_cycle()
        return workloads

    def run(self, stop: threading.Event, interval: float) -> None:
        """Cycle every `interval` seconds until `stop` is set; a late cycle skips ahead instead of bunching up."""
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.cycle()
            except Exception:
                # One bad cycle (a driver hiccup, a malformed /proc entry) must not stop the agent.
                log.exception("collection cycle failed")
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at = time.monotonic()
                delay = 0.0
            stop.wait(delay)

    def close(self) -> None:
        """Flush what is pending and release NVML and connections."""
        try:
            self.sender.close()
        finally:
            if self.host_tags is not None:
                self.host_tags.close()
            self.source.close()


def settle_process() -> None:
    """Once the agent has started, in its own process (the command line calls it; so does the benchmark).

    What start-up loaded (modules, the Datadog client, NVML handles) lives as long as the process: a last full
    collection, then `gc.freeze()` takes it out of every later one, and the young generation's threshold is
    raised above one cycle's allocations. The agent makes no reference cycles per cycle, so this frees nothing
    later than it would have been freed; it only stops the collector from re-scanning the same objects.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def _main_model(snap: NodeSnapshot) -> str:
    models = Counter(gpu_model(g.name) for g in snap.gpus)
    return models.most_common(1)[0][0]
