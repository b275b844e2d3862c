"""`gpufarm profile upload TRACE... --ir IR-123 [--name run-7]`: profiler runs onto a lease.

The lease defaults to GPUFARM_IR (what researchers already set for their jobs), the uploader to GPUFARM_USER
(their Slack user id, which the lease's requester and team members are known by). Where it goes comes from the
deployment's settings: GPUFARM_PROFILE_BUCKET, GPUFARM_PROFILE_PAGES_URL (the page function's URL) and
the secret `<GPUFARM_SECRETS_NAME>/profile_link_secret` (or GPUFARM_PROFILE_LINK_SECRET). `gpufarm local` sets all
of these for the sandbox.

Exit status: 0 uploaded; 1 a service failed (nothing recorded; upload again); 2 bad input or not allowed
(not a trace, too large, a truncated gzip, an unknown or ended IR, an uploader not on the lease): nothing stored.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

import click

from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotAllowed, NotFound, UpstreamError, ValidationFailed

SEAMS_GROUP = "gpufarm.seams"
EXIT_FAILED = 1
EXIT_REFUSED = 2
_IR = re.compile(r"^(?:ir-?)?([1-9][0-9]{0,8})$", re.IGNORECASE)
_USER = re.compile(r"^[UW][A-Z0-9]{2,20}$")


def parse_ir(text: str) -> int:
    """`IR-123`, `ir-123` or `123` as 123; ValidationFailed otherwise."""
    match = _IR.match(text.strip())
    if match is None:
        raise ValidationFailed("ir", f"{text[:40]!r} is not an IR (IR-123)")
    return int(match.group(1))


@click.group()
def profile() -> None:
    """Profiler runs on a lease: torch.profiler traces, summarised beside the GPUs."""


@profile.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--ir", "ir_text", envvar="GPUFARM_IR", required=True, help="The lease (IR-123); default GPUFARM_IR.")
@click.option("--name", default=None, help="The run's name (default: the file's name); more files get -2, -3...")
@click.option("--batch-size", type=int, default=None, help="Samples per step, for throughput.")
@click.option("--user", envvar="GPUFARM_USER", required=True, help="Your Slack user id; default GPUFARM_USER.")
def upload(traces: tuple[Path, ...], ir_text: str, name: str | None, batch_size: int | None, user: str) -> None:
    """Analyse TRACE... (Chrome-trace JSON from torch.profiler, gzipped or not) and attach them to the lease."""
    try:
        done = upload_traces(list(traces), ir_text, name, batch_size, user)
    except (ValidationFailed, NotAllowed, NotFound, Conflict) as exc:
        click.echo(f"error: {exc}; nothing was stored", err=True)
        sys.exit(EXIT_REFUSED)
    except (UpstreamError, GpufarmError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    for line in done:
        click.echo(line)


def upload_traces(traces: list[Path], ir_text: str, name: str | None, batch_size: int | None, user: str) -> list[str]:
    """Upload through the runtime's collaborators; one line per run (its name, figures and page link)."""
    from gpufarm.adapters.profile_store import S3ProfileStore
    from gpufarm.handlers import runtime as rt
    from gpufarm.profiling.links import link_signer
    from gpufarm.profiling.upload import upload as upload_runs

    ir = parse_ir(ir_text)
    if not _USER.match(user):
        raise ValidationFailed("user", f"{user[:40]!r} is not a Slack user id (U0123ABCD)")
    # A development tool's seams (the local host's, beside `gpufarm local`) apply to the environments it made.
    for point in entry_points(group=SEAMS_GROUP):
        rt.install_seams(point.load())
    runtime = rt.current()
    settings = runtime.settings
    if not settings.profile_bucket or not settings.profile_pages_url:
        raise rt.ConfigurationError("GPUFARM_PROFILE_BUCKET and GPUFARM_PROFILE_PAGES_URL must be set")
    svc = runtime.service()
    signer = link_signer(settings)
    store = S3ProfileStore(settings, settings.profile_bucket)
    runs = upload_runs(
        svc.context,
        store,
        signer,
        pages_url=settings.profile_pages_url,
        retention_days=svc.context.farm.profiles.retention_days,
        ir=ir,
        actor=user,
        paths=traces,
        name=name,
        batch_size=batch_size,
    )
    out = []
    for run in runs:
        f = run.figures
        step = f"{f.step_mean_ms:.1f} ms/step" if f.step_mean_ms is not None else "no steps"
        state = "recorded" if run.recorded is not None else "queued for the incident"
        out.append(f"IR-{ir} {run.run}: {f.steps} steps, {step}; {state}; summary: {run.link}")
    return out
