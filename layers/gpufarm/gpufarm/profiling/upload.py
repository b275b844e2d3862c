"""Uploading profiler runs to a lease: check, analyse, store, then record, in that order.

The upload function (gpufarm.profiling.intake, behind an upload token) runs this on the traces it took in; it
is the one way a run is stored and recorded.

1. The lease: the IR must exist and be open, and the uploader must be on it (gpufarm.core.leases.profile_runs).
2. Every trace is read to its end and analysed before anything is stored, so a bad file (not a trace, 2 GB, a
   truncated gzip) refuses the whole upload with nothing stored. A trace is stored gzipped (as it came when it
   came gzipped, else compressed here into a temporary file).
3. Each run's trace and summary (its figures as bounded JSON, gpufarm.profiling.summary: the pages function renders
   the page from it; no HTML is stored) go to the store (whole or not at all, retried within bounds there).
4. Only then the run is recorded on the incident, through the pool's one writer (an IncidentCommand `profile`,
   gpufarm.core.commands.executor.submit), and its figures are published as metrics tagged with the lease. The
   lease is read again just before: one that ended while the traces were analysed and stored gets nothing, and
   the run it would have had is deleted again (Conflict).
4a. Where the command was queued (Lambda: the pool's FIFO), the upload waits up to `record_wait_s` for the one
   writer's outcome, reading the incident: the run in its history is recorded; a lease resolved without it means
   the writer refused it (the lease ended between the check and the record, which the FIFO orders), so the stored
   run is deleted again and the upload refused (Conflict). Past the wait the answer says "queued": the writer
   records it or, if the lease ends first, tells the uploader by DM. Metrics are published only for runs not
   refused.
5. A run's key and link derive from `at` (the upload's start, given by the caller), so the same upload completed
   twice makes the same command, which the one writer records once (gpufarm.core.commands.record).
"""

from __future__ import annotations

import gzip
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from gpufarm.core.commands import executor
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel.errors import Conflict, UpstreamError, ValidationFailed
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IncidentCommand, Op, ProfileScope
from gpufarm.core.leases import profile_runs, queries
from gpufarm.profiling import metrics, reader, summary
from gpufarm.profiling.analysis import Figures, analyse
from gpufarm.profiling.links import LinkSigner, latest_key
from gpufarm.profiling.run_names import MAX_TRACES, NAME_RULE, run_names

log = logging.getLogger(__name__)

__all__ = ["MAX_TRACES", "ProfileStore", "Uploaded", "run_names", "upload"]

MAX_BATCH_SIZE = 1_000_000
# How long an upload waits for the pool's one writer to record a queued run, and how often it looks.
RECORD_WAIT_S = 20.0
RECORD_POLL_S = 0.5
DAY_S = 86_400


class ProfileStore(Protocol):
    """Where runs are kept (gpufarm.adapters.profile_store.S3ProfileStore)."""

    def put_run(self, key: str, trace_gz: Path, summary: bytes, latest: str | None = None) -> None:
        """Store a run's gzipped trace and its summary data (and as `latest`), whole or not at all."""
        ...

    def delete_run(self, key: str) -> None:
        """Remove a stored run again (its lease ended before it was recorded)."""
        ...


@dataclass(frozen=True)
class Uploaded:
    """One run stored and recorded."""

    run: str
    key: str
    link: str
    figures: Figures
    recorded: str | None  # the one writer's answer when it ran at once; None when queued


def upload(
    ctx: LeaseContext,
    store: ProfileStore,
    signer: LinkSigner,
    *,
    pages_url: str,
    retention_days: int,
    ir: int,
    actor: str,
    paths: Sequence[Path],
    name: str | None = None,
    batch_size: int | None = None,
    names: Sequence[str] | None = None,
    file_names: Sequence[str] | None = None,
    at: datetime | None = None,
    record_wait_s: float = RECORD_WAIT_S,
) -> list[Uploaded]:
    """Upload traces as runs of lease `ir` by `actor`; raises before anything is stored when any input is bad.

    The runs are named `names` (else from `name` or the files, run_names), their pages show `file_names` (else
    the files' names), and `at` is when the upload began (else now).
    """
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationFailed("batch_size", f"a batch size is 1-{MAX_BATCH_SIZE:,}")
    if names is None:
        names = run_names(paths, name)
    elif len(names) != len(paths) or not all(metrics.valid_run_name(n) for n in names):
        raise ValidationFailed("name", NAME_RULE)
    shown = list(file_names) if file_names is not None else [path.name for path in paths]
    alloc = queries.allocation(ctx, ir)
    profile_runs.check_uploader(alloc, actor, ctx.membership())
    for path in paths:
        reader.check_size(path)
    with tempfile.TemporaryDirectory(prefix="gpufarm-profile-") as work:
        prepared = [
            (run, shown_name, *_prepare(path, batch_size, Path(work)))
            for run, shown_name, path in zip(names, shown, paths, strict=True)
        ]
        now = at or ctx.now()
        # As long as the run is kept, but never past the bound on a link's life.
        expires = signer.expiry(now.timestamp(), retention_days * DAY_S)
        runs = []
        for run, shown_name, figures, gz in prepared:
            key = f"ir-{ir}/{run}-{now:%Y%m%dt%H%M%Sz}"
            scope = ProfileScope(run=run, summary=_brief(figures), link=signer.link(pages_url, key, expires))
            profile_runs.entry(now, actor, scope)  # fits the lease's history, or refused before anything is stored
            runs.append((key, scope, shown_name, figures, gz))
        done: list[Uploaded] = []
        for key, scope, shown_name, figures, gz in runs:
            data = summary.of(
                figures, ir=ir, run=scope.run, uploaded=f"{now:%Y-%m-%d %H:%M:%SZ}", trace_name=shown_name
            )
            store.put_run(key, gz, data.to_json(), latest_key(alloc.team) if alloc.team else None)
            _still_open(ctx, store, ir, key, scope.run)
            command = IncidentCommand(op=Op.PROFILE, ir=ir, actor=actor, reply_to=actor, origin=key, profile=scope)
            recorded = executor.submit(ctx, command)
            done.append(Uploaded(scope.run, key, scope.link, figures, recorded))
    queued = [stored for stored in done if stored.recorded is None]
    if queued:
        confirmed = _await_records(ctx, store, ir, queued, record_wait_s)
        done = [replace(stored, recorded=RECORDED) if stored.key in confirmed else stored for stored in done]
    for stored in done:
        _publish(ctx, stored.figures, alloc, stored.run, now)
    return done


RECORDED = "recorded by the pool's writer"


def _await_records(
    ctx: LeaseContext, store: ProfileStore, ir: int, queued: Sequence[Uploaded], wait_s: float
) -> set[str]:
    """Keys of the queued runs the one writer has recorded within `wait_s`, read from the incident.

    A lease found resolved before all of them are recorded refused the rest (the writer checks the lease when it
    records, in the pool's order): those runs are deleted again and the upload refused (Conflict).
    """
    deadline = time.monotonic() + wait_s
    while True:
        alloc = queries.allocation(ctx, ir)
        links = {run.link for run in profile_runs.runs(alloc.history)}
        confirmed = {run.key for run in queued if run.link in links}
        if len(confirmed) == len(queued):
            return confirmed
        if alloc.state is State.RESOLVED:
            refused = [run for run in queued if run.key not in confirmed]
            for run in refused:
                store.delete_run(run.key)
            names = ", ".join(run.run for run in refused)
            raise Conflict(f"IR-{ir} ended during the upload; run {names} was not recorded and nothing of it is kept")
        if time.monotonic() >= deadline:
            return confirmed
        time.sleep(RECORD_POLL_S)


def _still_open(ctx: LeaseContext, store: ProfileStore, ir: int, key: str, run: str) -> None:
    """Refuse to record on a lease that ended while its run was analysed and stored; the run is deleted again."""
    try:
        ended = queries.allocation(ctx, ir).state is State.RESOLVED
    except BaseException:
        store.delete_run(key)
        raise
    if ended:
        store.delete_run(key)
        raise Conflict(f"IR-{ir} ended during the upload; run {run} was not recorded and nothing of it is kept")


def _prepare(path: Path, batch_size: int | None, work: Path) -> tuple[Figures, Path]:
    """The trace's figures (reading it whole: a bad file raises here) and a gzipped copy to store."""
    figures = analyse(reader.events(path), batch_size)
    if reader.is_gzip(path):
        return figures, path
    gz = work / f"{len(list(work.iterdir()))}.json.gz"
    with path.open("rb") as src, gz.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return figures, gz


def _publish(ctx: LeaseContext, figures: Figures, alloc: Allocation, run: str, now: datetime) -> None:
    """The run's metrics; a failure is logged (the run is stored and recorded, its page says the same)."""
    sink = ctx.metrics
    if sink is None:
        return
    try:
        tags = metrics.lease_tags(alloc.ir, alloc.project, alloc.team, run)
        sink.submit(metrics.series(figures, tags, int(now.timestamp())))
    except UpstreamError as exc:
        log.warning("metrics of run %s on %s not published: %s", run, alloc.ir_label, exc)


def _brief(figures: Figures) -> str:
    step = f"{figures.step_mean_ms:,.1f} ms/step" if figures.step_mean_ms is not None else "no steps"
    return f"{figures.steps} steps, {step}"[:80]
