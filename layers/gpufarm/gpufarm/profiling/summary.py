"""A profiler run's figures as stored data: the one thing the profile pages function reads and renders.

The upload stores the run's figures as a small JSON document (`summary.json`, FORMAT) next to its trace, never
HTML: the pages function validates what it reads against RunSummary and renders the page with gpufarm's own
template (gpufarm.profiling.page), so whoever can write to the bucket can at most change figures, not the page.
The schema is closed and bounded: no unknown field, every string and list has a maximum length, every number a
range and no NaN or infinity, and the whole document is at most MAX_BYTES. Anything else (a stored HTML page, JSON
that does not validate, a run stored under another lease's key, an oversize object) is "not a profiler run".
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufarm.core.kernel.errors import NotFound
from gpufarm.profiling.analysis import MAX_NAME, TIMELINE_BINS, Figures, Stream

log = logging.getLogger(__name__)

FORMAT: Final = "gpufarm.profile-summary/1"
# The page shows 16 lanes and the top 10 rows (gpufarm.profiling.page); the bounds leave room, no more.
MAX_STREAMS = 16
MAX_ROWS = 50
MAX_DEVICES = 64
# One bar per step in a 640-pixel chart: more than this many steps is drawn as the first MAX_STEP_TIMES.
MAX_STEP_TIMES = 4096
MAX_TRACE_NAME = 255
# The largest document the bounds above allow is about 120 KB; this is what the pages function reads at most.
MAX_BYTES = 256 * 1024
MAX_IR = 999_999_999
MAX_BATCH_SIZE = 1_000_000
_KEY = re.compile(r"^ir-([1-9][0-9]{0,8})/(.+)-[0-9]{8}t[0-9]{6}z$")

Name = Annotated[str, Field(max_length=MAX_NAME)]
Amount = Annotated[float, Field(ge=0.0)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Row = tuple[Name, Amount, Count]


class _Closed(BaseModel):
    """No unknown field, no NaN or infinity, no type coercion (a string is not a number)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class StreamData(_Closed):
    """One lane of the run (gpufarm.profiling.analysis.Stream)."""

    name: Name
    busy_us: Amount
    share: Share
    timeline: tuple[Share, ...] = Field(max_length=TIMELINE_BINS)


class RunSummary(_Closed):
    """Everything the page of one run shows, bounded (module docstring)."""

    format: Literal["gpufarm.profile-summary/1"] = FORMAT
    ir: int = Field(ge=1, le=MAX_IR)
    run: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    uploaded: str = Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}Z$")
    trace_name: str = Field(max_length=MAX_TRACE_NAME)
    events: Count
    window_us: Amount
    steps: Count
    step_mean_ms: Amount | None
    step_p50_ms: Amount | None
    step_max_ms: Amount | None
    step_times_ms: tuple[Amount, ...] = Field(max_length=MAX_STEP_TIMES)
    gpu_streams: tuple[StreamData, ...] = Field(max_length=MAX_STREAMS)
    cpu_threads: tuple[StreamData, ...] = Field(max_length=MAX_STREAMS)
    top_kernels: tuple[Row, ...] = Field(max_length=MAX_ROWS)
    top_operators: tuple[Row, ...] = Field(max_length=MAX_ROWS)
    gpu_time_us: Amount
    comm_share: Share | None
    memory_peak_bytes: dict[Annotated[str, Field(max_length=64)], Count] = Field(max_length=MAX_DEVICES)
    batch_size: int | None = Field(ge=1, le=MAX_BATCH_SIZE)
    throughput: Amount | None

    def figures(self) -> Figures:
        """The figures the page template renders."""
        return Figures(
            events=self.events,
            window_us=self.window_us,
            steps=self.steps,
            step_mean_ms=self.step_mean_ms,
            step_p50_ms=self.step_p50_ms,
            step_max_ms=self.step_max_ms,
            step_times_ms=self.step_times_ms,
            gpu_streams=tuple(Stream(s.name, s.busy_us, s.share, s.timeline) for s in self.gpu_streams),
            cpu_threads=tuple(Stream(s.name, s.busy_us, s.share, s.timeline) for s in self.cpu_threads),
            top_kernels=self.top_kernels,
            top_operators=self.top_operators,
            gpu_time_us=self.gpu_time_us,
            comm_share=self.comm_share,
            memory_peak_bytes=dict(self.memory_peak_bytes),
            batch_size=self.batch_size,
            throughput=self.throughput,
        )

    def to_json(self) -> bytes:
        """The stored document."""
        return self.model_dump_json().encode()


def of(figures: Figures, *, ir: int, run: str, uploaded: str, trace_name: str) -> RunSummary:
    """A run's summary: what its page shows of the figures (the busiest lanes, the first steps), within bounds.

    Raises ValidationError only when the analysis produced figures outside the schema (a bug, not bad input).
    """
    f = figures

    def lanes(streams: tuple[Stream, ...]) -> list[StreamData]:
        return [
            StreamData(name=s.name[:MAX_NAME], busy_us=s.busy_us, share=s.share, timeline=s.timeline)
            for s in streams[:MAX_STREAMS]
        ]

    return RunSummary(
        ir=ir,
        run=run,
        uploaded=uploaded,
        trace_name=trace_name[:MAX_TRACE_NAME],
        events=f.events,
        window_us=f.window_us,
        steps=f.steps,
        step_mean_ms=f.step_mean_ms,
        step_p50_ms=f.step_p50_ms,
        step_max_ms=f.step_max_ms,
        step_times_ms=f.step_times_ms[:MAX_STEP_TIMES],
        gpu_streams=tuple(lanes(f.gpu_streams)),
        cpu_threads=tuple(lanes(f.cpu_threads)),
        top_kernels=tuple((n[:MAX_NAME], t, c) for n, t, c in f.top_kernels[:MAX_ROWS]),
        top_operators=tuple((n[:MAX_NAME], t, c) for n, t, c in f.top_operators[:MAX_ROWS]),
        gpu_time_us=f.gpu_time_us,
        comm_share=f.comm_share,
        memory_peak_bytes={d[:64]: p for d, p in list(f.memory_peak_bytes.items())[:MAX_DEVICES]},
        batch_size=f.batch_size,
        throughput=f.throughput,
    )


def parse(raw: bytes, key: str) -> RunSummary:
    """The stored summary of run `key`; NotFound ("not a profiler run") for anything gpufarm did not write.

    A run's key names its lease and run (`ir-12/run-7-<stamp>`): a summary of another lease or run stored under
    it is refused too. A team's newest-run key (`latest/<team>`) holds a copy of any of its runs.
    """
    if len(raw) > MAX_BYTES:
        log.warning("profile summary %s refused: %d bytes, over %d", key[:100], len(raw), MAX_BYTES)
        raise NotFound("not a profiler run")
    try:
        summary = RunSummary.model_validate_json(raw)
    except ValidationError as exc:
        # The count and the first location only: the stored values may be anything, and stay out of the logs.
        first = ".".join(str(part) for part in exc.errors()[0]["loc"])[:80] if exc.errors() else "?"
        log.warning("profile summary %s refused: %d errors, first at %s", key[:100], exc.error_count(), first)
        raise NotFound("not a profiler run") from None
    match = _KEY.match(key)
    if match and (int(match.group(1)) != summary.ir or match.group(2) != summary.run):
        log.warning("profile summary %s refused: it is of IR-%d run %s", key[:100], summary.ir, summary.run)
        raise NotFound("not a profiler run")
    return summary
