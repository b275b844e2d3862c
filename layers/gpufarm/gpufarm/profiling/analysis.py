"""The figures of one profiler trace, computed in one streaming pass over its events.

What `torch.profiler` writes (Chrome trace, times in microseconds): complete spans (`ph: X`) of categories
`user_annotation` (the `ProfilerStep#N` step spans among them), `cpu_op` (ATen operators, on CPU threads),
`kernel`, `gpu_memcpy` and `gpu_memset` (on the GPU: `args.device`, `args.stream`), and instant `[memory]`
events (`ph: i`) whose `args` carry the allocator's `Total Allocated` bytes and the device type and id.

Figures:
- step time: the `ProfilerStep#` spans on the CPU (count, mean, median, max);
- busy share per stream: the union of a GPU stream's kernel, copy and set spans over the profiled window (the
  step spans' extent, or the trace's when there are no steps); CPU threads get the same from their operators;
- top kernels by GPU time and top operators by CPU time (an operator's inclusive time, as the profiler's
  `CPU total` column);
- communication share: of the GPU kernel time, the part in collective kernels (NCCL/RCCL); None without kernels;
- memory peak: the highest `Total Allocated` per device;
- throughput: samples per second when the steps' batch size is known (given at upload).

Bounded: names are cut to MAX_NAME chars and at most MAX_NAMES distinct names are kept per table (the rest count
under "(other)"); a stream's spans are kept as (start, end) pairs for the union, 16 bytes each in two arrays.
"""

from __future__ import annotations

import re
import statistics
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_NAME = 160
MAX_NAMES = 20_000
TOP = 10
TIMELINE_BINS = 120
OTHER = "(other)"
STEP_PREFIX = "ProfilerStep#"
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Collective communication kernels (NCCL on NVIDIA, RCCL on AMD keeps the names).
_COMM = re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast", re.IGNORECASE)
DEVICE_TYPES = {0: "cpu", 1: "cuda"}


@dataclass(frozen=True)
class Stream:
    """One lane of work: a GPU stream (`cuda:0/stream 7`) or a CPU thread (`cpu/thread 1234`)."""

    name: str
    busy_us: float
    share: float  # busy time over the profiled window, 0..1
    timeline: tuple[float, ...]  # busy share of each of TIMELINE_BINS equal slices of the window


@dataclass(frozen=True)
class Figures:
    """Everything the summary page and the metrics show of one trace."""

    events: int
    window_us: float
    steps: int
    step_mean_ms: float | None
    step_p50_ms: float | None
    step_max_ms: float | None
    step_times_ms: tuple[float, ...]
    gpu_streams: tuple[Stream, ...]
    cpu_threads: tuple[Stream, ...]
    top_kernels: tuple[tuple[str, float, int], ...]  # name, GPU time in µs, calls
    top_operators: tuple[tuple[str, float, int], ...]  # name, CPU time in µs, calls
    gpu_time_us: float
    comm_share: float | None
    memory_peak_bytes: dict[str, int]  # "cuda:0" / "cpu" -> peak allocated bytes
    batch_size: int | None
    throughput: float | None  # samples per second

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds GPU work (a CUDA trace)."""
        return bool(self.gpu_streams)


@dataclass
class _Table:
    """Time and calls per name, bounded in distinct names."""

    time: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, dur: float) -> None:
        key = name[:MAX_NAME]
        if key not in self.time and len(self.time) >= MAX_NAMES:
            key = OTHER
        self.time[key] = self.time.get(key, 0.0) + dur
        self.calls[key] = self.calls.get(key, 0) + 1

    def top(self, n: int = TOP) -> tuple[tuple[str, float, int], ...]:
        ranked = sorted(self.time.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return tuple((name, round(t, 3), self.calls[name]) for name, t in ranked)


@dataclass
class _Spans:
    """The (start, end) pairs of one lane."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)

    def merged(self) -> list[tuple[float, float]]:
        """The union of the spans as disjoint, sorted intervals."""
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        out: list[tuple[float, float]] = []
        for i in order:
            s, e = self.starts[i], self.ends[i]
            if out and s <= out[-1][1]:
                if e > out[-1][1]:
                    out[-1] = (out[-1][0], e)
            else:
                out.append((s, e))
        return out


class Analyser:
    """Feed it a trace's events one by one (`add`), then read `figures()`."""

    def __init__(self, batch_size: int | None = None) -> None:
        self.batch_size = batch_size
        self.count = 0
        self.first = float("inf")
        self.last = float("-inf")
        self.steps: list[tuple[float, float]] = []
        self.kernels = _Table()
        self.operators = _Table()
        self.gpu_lanes: dict[str, _Spans] = {}
        self.cpu_lanes: dict[str, _Spans] = {}
        self.gpu_time = 0.0
        self.comm_time = 0.0
        self.peaks: dict[str, int] = {}

    def add(self, event: dict[str, Any]) -> None:
        """Account one trace event; events of other shapes (metadata, flows) only count."""
        self.count += 1
        ph = event.get("ph")
        ts = _number(event.get("ts"))
        if ts is None:
            return
        if ph == "X":
            dur = _number(event.get("dur"))
            if dur is None or dur < 0:
                return
            self._span(event, ts, dur)
        elif ph == "i" and event.get("name") == "[memory]":
            self._memory(event.get("args"))

    def _span(self, event: dict[str, Any], ts: float, dur: float) -> None:
        cat = event.get("cat")
        name = str(event.get("name", ""))
        end = ts + dur
        self.first = min(self.first, ts)
        self.last = max(self.last, end)
        if cat == "user_annotation" and name.startswith(STEP_PREFIX):
            self.steps.append((ts, end))
        elif cat == "cpu_op":
            self.operators.add(name, dur)
            self._lane(self.cpu_lanes, f"cpu/thread {_lane_id(event.get('tid'))}").add(ts, end)
        elif cat in GPU_CATEGORIES:
            args = event.get("args")
            args = args if isinstance(args, dict) else {}
            device = _lane_id(args.get("device", event.get("pid")))
            stream = _lane_id(args.get("stream", event.get("tid")))
            self._lane(self.gpu_lanes, f"cuda:{device}/stream {stream}").add(ts, end)
            if cat == "kernel":
                self.kernels.add(name, dur)
                self.gpu_time += dur
                if _COMM.search(name):
                    self.comm_time += dur

    def _lane(self, lanes: dict[str, _Spans], key: str) -> _Spans:
        lane = lanes.get(key)
        if lane is None:
            if len(lanes) >= MAX_NAMES:
                key = OTHER
                lane = lanes.setdefault(key, _Spans())
            else:
                lane = lanes[key] = _Spans()
        return lane

    def _memory(self, args: Any) -> None:
        if not isinstance(args, dict):
            return
        total = _number(args.get("Total Allocated"))
        if total is None:
            return
        kind = DEVICE_TYPES.get(int(_number(args.get("Device Type")) or 0), "device")
        device = kind if kind == "cpu" else f"{kind}:{_lane_id(args.get('Device Id'))}"
        self.peaks[device] = max(self.peaks.get(device, 0), int(total))

    def figures(self) -> Figures:
        """The trace's figures (after every event was added)."""
        if self.steps:
            start, stop = min(s for s, _ in self.steps), max(e for _, e in self.steps)
        elif self.count and self.last > self.first:
            start, stop = self.first, self.last
        else:
            start, stop = 0.0, 0.0
        window = stop - start
        times = tuple(round((e - s) / 1000.0, 3) for s, e in sorted(self.steps))
        mean = round(statistics.fmean(times), 3) if times else None
        throughput = None
        if self.batch_size and mean:
            throughput = round(self.batch_size / (mean / 1000.0), 2)
        return Figures(
            events=self.count,
            window_us=round(window, 3),
            steps=len(times),
            step_mean_ms=mean,
            step_p50_ms=round(statistics.median(times), 3) if times else None,
            step_max_ms=max(times) if times else None,
            step_times_ms=times,
            gpu_streams=_streams(self.gpu_lanes, start, stop),
            cpu_threads=_streams(self.cpu_lanes, start, stop),
            top_kernels=self.kernels.top(),
            top_operators=self.operators.top(),
            gpu_time_us=round(self.gpu_time, 3),
            comm_share=round(self.comm_time / self.gpu_time, 4) if self.gpu_time else None,
            memory_peak_bytes=dict(sorted(self.peaks.items())),
            batch_size=self.batch_size,
            throughput=throughput,
        )


def analyse(events: Iterable[dict[str, Any]], batch_size: int | None = None) -> Figures:
    """The figures of a stream of trace events."""
    analyser = Analyser(batch_size)
    for event in events:
        analyser.add(event)
    return analyser.figures()


def _streams(lanes: dict[str, _Spans], start: float, stop: float) -> tuple[Stream, ...]:
    """Each lane's busy time within [start, stop], its share and timeline, busiest first."""
    window = stop - start
    out: list[Stream] = []
    for name, spans in lanes.items():
        busy = 0.0
        bins = [0.0] * TIMELINE_BINS
        width = window / TIMELINE_BINS if window > 0 else 0.0
        for lo, hi in spans.merged():
            s, e = max(lo, start), min(hi, stop)
            if e <= s:
                continue
            busy += e - s
            if width:
                _fill(bins, (s - start) / width, (e - start) / width)
        share = busy / window if window > 0 else 0.0
        out.append(Stream(name, round(busy, 3), round(share, 4), tuple(round(min(b, 1.0), 3) for b in bins)))
    return tuple(sorted(out, key=lambda s: (-s.busy_us, s.name)))


def _fill(bins: list[float], lo: float, hi: float) -> None:
    """Add the interval [lo, hi) (in bin units) to the bins it covers, in proportion."""
    first, last = int(lo), min(int(hi), len(bins) - 1)
    for i in range(first, last + 1):
        bins[i] += max(0.0, min(hi, i + 1) - max(lo, i))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _lane_id(value: Any) -> str:
    """A pid, tid, device or stream id as a short label (ids are numbers; a string one is cut)."""
    if isinstance(value, bool):
        return "?"
    if isinstance(value, int | float):
        return str(int(value))
    return str(value)[:40] if value is not None else "?"
