"""`gpufarm_trace_handler("IR-123")` for `torch.profiler.profile(on_trace_ready=...)`: write the trace, upload it.

    from gpufarm.cli.capture import gpufarm_trace_handler
    with torch.profiler.profile(schedule=..., on_trace_ready=gpufarm_trace_handler("IR-123", batch_size=32)) as p:
        ...

Importing this module does not import torch (the profiler object arrives as the handler's argument, and only its
`export_chrome_trace` and `step_num` are used). Each call writes `<directory>/<name>-<step>.json.gz` (gzipped:
torch writes gzip when the name ends in .gz) and uploads it as run `<name>-<step>` of the lease, through gpufarm's
upload function with the lease's upload token (`token=`, else GPUFARM_UPLOAD_TOKEN; the function's URL from
GPUFARM_API_URL): the training job holds no Datadog key, link secret or AWS credential. An upload that
fails does not stop the training: the error is logged with the path of the kept trace, so it can be uploaded
later with `gpufarm profile upload`.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufarm.core.kernel.errors import GpufarmError

log = logging.getLogger(__name__)


def gpufarm_trace_handler(
    ir: str | None = None,
    *,
    name: str = "run",
    directory: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    token: str | None = None,
) -> Callable[[Any], None]:
    """A trace-ready handler uploading each trace to lease `ir` (default GPUFARM_IR) as `<name>-<step>`."""
    lease = ir or os.environ.get("GPUFARM_IR")
    secret = token or os.environ.get("GPUFARM_UPLOAD_TOKEN")
    if not lease:
        raise ValueError("name the lease: gpufarm_trace_handler('IR-123') or GPUFARM_IR")
    if not secret:
        raise ValueError("give the lease's upload token (/gpu profile-token): token=... or GPUFARM_UPLOAD_TOKEN")
    folder = Path(directory) if directory is not None else Path(tempfile.gettempdir()) / "gpufarm-traces"

    def handler(prof: Any) -> None:
        from gpufarm.cli.profile import upload_traces

        folder.mkdir(parents=True, exist_ok=True)
        run = f"{name}-{int(getattr(prof, 'step_num', 0))}"
        path = folder / f"{run}.json.gz"
        prof.export_chrome_trace(str(path))
        try:
            for line in upload_traces([path], lease, run, batch_size, token=secret, progress=False):
                sys.stderr.write(f"gpufarm: {line}\n")
        except GpufarmError as exc:
            log.error("profiler trace %s kept but not uploaded: %s", path, exc)  # noqa: TRY400 - no traceback

    return handler
