"""A trace's figures as Datadog series, tagged with the lease: `ir`, `project`, `team` and the run's name.

The names, units and tags are declared under `profile_metrics` in spec/metrics.yaml (shipped beside
gpufarm/setup as metrics.yaml); tests/unit/test_profile_metrics.py holds every series built here to it. All
points carry the upload's time: a trace is one measurement of a run, not a time series of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.profiling.analysis import Figures

PREFIX = "gpufarm.profile."
GAUGE = 3
MAX_TAG_VALUE = 100
# The value of a tag as Datadog keeps it: lowercase, and only these characters (the rest become `_`).
_TAG_UNSAFE = re.compile(r"[^a-z0-9_.:/-]+")
_RUN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


def tag_value(text: str) -> str:
    """`text` as a tag value: lowercased, unsafe runs as `_`, at most MAX_TAG_VALUE characters, never empty."""
    value = _TAG_UNSAFE.sub("_", text.lower()).strip("_")[:MAX_TAG_VALUE].rstrip("_")
    return value or "unnamed"


def valid_run_name(name: str) -> bool:
    """True for a run name gpufarm takes: 1-63 of a-z, 0-9, `_`, `.`, `-`, starting with a letter or digit."""
    return bool(_RUN.match(name))


def lease_tags(ir: int, project: str | None, team: str | None, run: str) -> tuple[str, ...]:
    """The tags every profile series carries."""
    tags = [f"ir:ir-{ir}", f"run:{run}"]
    if project:
        tags.append(f"project:{tag_value(project)}")
    if team:
        tags.append(f"team:{tag_value(team)}")
    return tuple(tags)


def series(figures: Figures, tags: tuple[str, ...], timestamp: int) -> list[MetricSeries]:
    """Every series of one trace's figures (a figure the trace does not have is not sent)."""
    return list(_series(figures, tags, timestamp))


def _series(f: Figures, tags: tuple[str, ...], at: int) -> Iterator[MetricSeries]:
    def one(name: str, value: float, unit: str | None, *extra: str) -> MetricSeries:
        return MetricSeries(PREFIX + name, (MetricPoint(at, float(value)),), (*tags, *extra), type=GAUGE, unit=unit)

    yield one("steps", f.steps, None)
    if f.step_mean_ms is not None and f.step_p50_ms is not None and f.step_max_ms is not None:
        yield one("step_time.mean", f.step_mean_ms, "millisecond")
        yield one("step_time.p50", f.step_p50_ms, "millisecond")
        yield one("step_time.max", f.step_max_ms, "millisecond")
    for stream in (*f.gpu_streams, *f.cpu_threads)[:16]:
        yield one("stream.busy", 100.0 * stream.share, "percent", f"stream:{tag_value(stream.name)}")
    if f.comm_share is not None:
        yield one("communication.share", 100.0 * f.comm_share, "percent")
    for device, peak in f.memory_peak_bytes.items():
        yield one("memory.peak", peak, "byte", f"profile_device:{tag_value(device)}")
    if f.throughput is not None:
        yield one("throughput", f.throughput, None)
    for name, time_us, _ in f.top_kernels:
        yield one("kernel.time", time_us, "microsecond", f"kernel:{tag_value(name)}")
    for name, time_us, _ in f.top_operators:
        yield one("operator.time", time_us, "microsecond", f"operator:{tag_value(name)}")
