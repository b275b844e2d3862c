"""`gpufarm profile upload TRACE... --ir IR-123 [--name run-7]`: profiler runs onto a lease, with an upload token.

The researcher holds only the lease's upload token (`/gpu profile-token IR-123` in Slack; GPUFARM_UPLOAD_TOKEN or
`--token`) and the upload function's URL (GPUFARM_API_URL, the stack's ProfileUploadUrl output): no Datadog key,
no link secret, no AWS credential. The token names the user; the function checks it against the lease, analyses
the traces, stores and records them (gpufarm.cli.upload_client, gpufarm.handlers.profile_upload). The lease
defaults to GPUFARM_IR (what researchers already set for their jobs). `gpufarm local` serves the function
locally.

Exit status: 0 uploaded; 1 a service failed (nothing recorded; upload again); 2 bad input or not allowed (not a
trace, too large, a truncated gzip, an unknown or ended IR, a token that is missing, expired or not for this
lease): the function's reason is printed, nothing stored.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click

from gpufarm.core.kernel.errors import Conflict, GpufarmError, NotAllowed, NotFound, UpstreamError, ValidationFailed

EXIT_FAILED = 1
EXIT_REFUSED = 2
_IR = re.compile(r"^(?:ir-?)?([1-9][0-9]{0,8})$", re.IGNORECASE)
_TOKEN = re.compile(r"^gfu1\.[A-Za-z0-9_-]{1,150}\.[A-Za-z0-9_-]{43}$")
MAX_BATCH_SIZE = 1_000_000
# A bar for what takes more than a moment to send.
PROGRESS_FROM_BYTES = 8 * 1024 * 1024


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
@click.option(
    "--token",
    envvar="GPUFARM_UPLOAD_TOKEN",
    default=None,
    show_envvar=True,
    help="The lease's upload token (`/gpu profile-token IR-123`); default GPUFARM_UPLOAD_TOKEN.",
)
def upload(traces: tuple[Path, ...], ir_text: str, name: str | None, batch_size: int | None, token: str | None) -> None:
    """Analyse TRACE... (Chrome-trace JSON from torch.profiler, gzipped or not) and attach them to the lease."""
    try:
        done = upload_traces(list(traces), ir_text, name, batch_size, token=token)
    except (ValidationFailed, NotAllowed, NotFound, Conflict) as exc:
        click.echo(f"error: {exc}; nothing was stored", err=True)
        sys.exit(EXIT_REFUSED)
    except (UpstreamError, GpufarmError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    for line in done:
        click.echo(line)


def upload_traces(
    traces: list[Path],
    ir_text: str,
    name: str | None,
    batch_size: int | None,
    *,
    token: str | None = None,
    api_url: str | None = None,
    progress: bool = True,
) -> list[str]:
    """Upload through gpufarm's upload function; one line per run (its name, figures and page link).

    ValidationFailed for bad input, NotAllowed for the function's refusals (4xx, its reason), UpstreamError when
    the function or S3 failed after the retries.
    """
    from gpufarm.cli.upload_client import Refused, ServiceFailed, Trace, UploadClient
    from gpufarm.profiling.reader import check_size
    from gpufarm.profiling.run_names import run_names

    ir = parse_ir(ir_text)
    token = (token or os.environ.get("GPUFARM_UPLOAD_TOKEN") or "").strip()
    api_url = (api_url or os.environ.get("GPUFARM_API_URL") or "").strip()
    if not token:
        raise ValidationFailed(
            "token", f"no upload token: ask `/gpu profile-token IR-{ir}` in Slack, then set GPUFARM_UPLOAD_TOKEN"
        )
    if not _TOKEN.match(token):
        raise ValidationFailed("token", "that is not an upload token (gfu1.…, from /gpu profile-token)")
    if not api_url:
        raise ValidationFailed("api_url", "GPUFARM_API_URL is not set (the stack's ProfileUploadUrl output)")
    if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValidationFailed("batch_size", f"a batch size is 1-{MAX_BATCH_SIZE:,}")
    names = run_names(traces, name)
    files = [Trace(path, run, check_size(path)) for path, run in zip(traces, names, strict=True)]
    try:
        client = UploadClient(api_url, token)
    except ValueError as exc:
        raise ValidationFailed("api_url", str(exc)) from None
    total = sum(t.size for t in files)
    shown = progress and total >= PROGRESS_FROM_BYTES
    try:
        with click.progressbar(length=total, label="uploading", file=sys.stderr, hidden=not shown) as bar:
            stored = client.upload(ir, files, batch_size, bar.update)
    except Refused as exc:
        raise NotAllowed(exc.reason) from None
    except ServiceFailed as exc:
        raise UpstreamError(str(exc)) from None
    out = []
    for run in stored:
        step = f"{run.step_mean_ms:.1f} ms/step" if run.step_mean_ms is not None else "no steps"
        state = "recorded" if run.recorded else "queued for the incident"
        out.append(f"IR-{ir} {run.name}: {run.steps} steps, {step}; {state}; summary: {run.link}")
    return out
