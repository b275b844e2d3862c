"""Demo stage "profile": a real torch.profiler trace uploaded to a lease, its summary page and its metrics.

Alice asks for one H100 on the HPC pool for profiling; then, from another process as a researcher would,
`gpufarm profile upload tests/fixtures/profiler/cpu_mlp.json.gz --ir IR-n --name demo-run --batch-size 32`
(the fixture is real torch.profiler output of a small model trained on the CPU). The upload checks she is on the
lease, analyses the trace, stores it and its page in S3 (moto's server under the local host), and records the run
in the incident's history through the pool's one writer. The stage fetches the signed page link from the local
profile_pages function, shows that a link with a wrong signature is refused, reads the run's metrics back from
the sandbox, and shows the run in `/gpu status`. The lease is released at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

FIXTURE = Path("tests") / "fixtures" / "profiler" / "cpu_mlp.json.gz"
REQUEST = "request 1 H100 project=llm-ko team=nlp env=onprem-hpc days=1 purpose=profiling"
_LINK = re.compile(r"summary: (\S+)")


def find_fixture() -> Path | None:
    """The committed trace, from the working directory or the checkout this package runs from."""
    for base in (Path.cwd(), *Path(__file__).resolve().parents):
        if (base / FIXTURE).is_file():
            return base / FIXTURE
    return None


def run(ctx: DemoContext) -> None:
    """Upload a real trace to a fresh lease; fetch its page; read its metrics; show it in /gpu status."""
    if ctx.local is None or "GPUFARM_PROFILE_BUCKET" not in os.environ:
        ctx.check(False, "the profile stage needs the local function host with profiles (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    trace = find_fixture()
    if not ctx.check(trace is not None, "a real torch.profiler trace to upload", str(FIXTURE)):
        return
    assert trace is not None
    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    ir = None
    try:
        with ctx.step("Alice asks for a GPU to profile on"):
            farm.slash(ALICE, REQUEST)
            farm.settle()
            answers = [m for m in farm.messages(user=ALICE.id, kind="response") if "IR-" in m["text"]]
            ir = ir_in(answers[-1]["text"]) if answers else None
            if not ctx.check(ir is not None, "the request has an IR", answers[-1]["text"][:120] if answers else ""):
                return
        link = _upload(ctx, farm, trace, ir)
        if link:
            _page(ctx, link)
            _metrics(ctx, farm, ir)
            _status(ctx, farm, ir)
    finally:
        if ir is not None:
            farm.slash(ALICE, f"release IR-{ir} now")
            farm.settle()
        farm.close()


def _upload(ctx: DemoContext, farm: LocalFarm, trace: Path, ir: int | None) -> str | None:
    with ctx.step("gpufarm profile upload, from another process"):
        args = [sys.executable, "-m", "gpufarm", "profile", "upload", str(trace), "--ir", f"IR-{ir}"]
        args += ["--name", "demo-run", "--batch-size", "32", "--user", ALICE.id]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)  # noqa: S603
        farm.settle()
        out = (done.stdout + done.stderr).strip()
        ctx.info(out.splitlines()[-1][:300] if out else "(no output)")
        ctx.check(done.returncode == 0, "the upload succeeded", f"exit {done.returncode}")
        match = _LINK.search(done.stdout)
        if not ctx.check(match is not None, "it printed the run's summary link"):
            return None
        assert match is not None
        refused = subprocess.run(  # noqa: S603
            [*args[:6], "--ir", f"IR-{ir}", "--user", "U0000000009"],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ),
            check=False,
        )
        ctx.check(refused.returncode == 2, "someone not on the lease is refused (exit 2)", refused.stderr.strip()[:160])
        return match.group(1)


def _page(ctx: DemoContext, link: str) -> None:
    with ctx.step("the summary page, through the signed link"):
        with urllib.request.urlopen(link, timeout=30) as response:  # noqa: S310 - the local host's URL
            page = response.read().decode()
            status = response.status
        ctx.info(f"GET {link[:110]}... -> {status}, {len(page):,} bytes")
        ctx.check(status == 200 and "<svg" in page and "demo-run" in page, "the page shows the run with its charts")
        ctx.check("<script" not in page and "https://" not in page, "the page is self-contained")
        forged = link[:-4] + ("0000" if not link.endswith("0000") else "1111")
        try:
            urllib.request.urlopen(forged, timeout=30)  # noqa: S310
            code = 200
        except urllib.error.HTTPError as exc:
            code = exc.code
        ctx.check(code == 403, "a link with another signature is refused", f"HTTP {code}")


def _metrics(ctx: DemoContext, farm: LocalFarm, ir: int | None) -> None:
    with ctx.step("the run's metrics in Datadog, tagged with the lease"):
        now = datetime.fromtimestamp(ctx.sandbox.clock.now(), UTC)
        shown = []
        for metric in ("gpufarm.profile.steps", "gpufarm.profile.step_time.mean", "gpufarm.profile.throughput"):
            found = farm.gateway.scalar(f"max:{metric}{{ir:ir-{ir},run:demo-run}}", now - timedelta(hours=1), now)
            shown.append(f"{metric} {found[0].value:g}" if found and found[0].value is not None else f"{metric} -")
        ctx.info("; ".join(shown))
        ctx.check(shown[0].endswith(" 5"), "5 steps published for the run")


def _status(ctx: DemoContext, farm: LocalFarm, ir: int | None) -> None:
    with ctx.step("/gpu status lists the run"):
        farm.slash(ALICE, f"status IR-{ir}")
        farm.settle()
        replies = [m["text"] for m in farm.messages(user=ALICE.id, kind="response") if "profiled" in m["text"]]
        ctx.check(bool(replies) and "demo-run" in replies[-1], "the run and its link are in the lease's history")
