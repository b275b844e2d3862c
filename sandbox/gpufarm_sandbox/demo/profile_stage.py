"""Demo stage "profile": a real torch.profiler trace uploaded to a lease, its summary page and its metrics.

Alice asks for one H100 on the HPC pool for profiling and `/gpu profile-token IR-n` for an upload token (its
ephemeral answer, through the sandbox's Slack); then, from another process as a researcher would, with only the
token and GPUFARM_API_URL in its environment (no Datadog key, link secret or AWS credential: the stage checks),
`gpufarm profile upload tests/fixtures/profiler/cpu_mlp.json.gz --ir IR-n --name demo-run --batch-size 32`
(the fixture is real torch.profiler output of a small model trained on the CPU). The local profile_upload function
checks the token against the lease, gives a presigned PUT URL to S3 (moto's server under the local host), then
analyses the trace, stores it and its summary and records the run in the incident's history through the pool's
one writer. A forged token is refused (exit 2). The stage fetches the signed page link from the local
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
_TOKEN = re.compile(r"gfu1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
# What a researcher's shell has besides the token and the URL: enough to run Python, nothing of gpufarm's.
_SHELL = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT", "VIRTUAL_ENV", "PYTHONPATH")
# What the uploading process must not hold: org keys, the signing secrets, cloud credentials.
_FORBIDDEN = re.compile(r"^(DD_|AWS_|AZURE_|SLACK_)|SECRET|_KEY$|^GPUFARM_(?!UPLOAD_TOKEN$|API_URL$)")


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
        token = _token(ctx, farm, ir)
        link = _upload(ctx, farm, trace, ir, token) if token else None
        if link:
            _page(ctx, link)
            _metrics(ctx, farm, ir)
            _status(ctx, farm, ir)
    finally:
        if ir is not None:
            farm.slash(ALICE, f"release IR-{ir} now")
            farm.settle()
        farm.close()


def _token(ctx: DemoContext, farm: LocalFarm, ir: int | None) -> str | None:
    with ctx.step("Alice asks for an upload token (/gpu profile-token)"):
        farm.slash(ALICE, f"profile-token IR-{ir}")
        farm.settle()
        answer = farm.answer(ALICE, "Upload token")
        found = _TOKEN.search(str(answer["blocks"])) if answer is not None else None
        ephemeral = answer is not None and answer.get("response_type") == "ephemeral"
        ctx.check(found is not None and ephemeral, "the token comes in an ephemeral answer to Alice alone")
        return found[0] if found is not None else None


def researcher_env(token: str, api_url: str) -> dict[str, str]:
    """A researcher's process environment: their shell's basics, the upload token and the function's URL."""
    env = {name: os.environ[name] for name in _SHELL if name in os.environ}
    env.update(GPUFARM_UPLOAD_TOKEN=token, GPUFARM_API_URL=api_url)
    return env


def _upload(ctx: DemoContext, farm: LocalFarm, trace: Path, ir: int | None, token: str) -> str | None:
    with ctx.step("gpufarm profile upload, from another process holding only the token"):
        env = researcher_env(token, os.environ.get("GPUFARM_API_URL", ""))
        held = sorted(name for name in env if _FORBIDDEN.search(name))
        ctx.check(
            not held and bool(env["GPUFARM_API_URL"]),
            "its environment holds no key, secret or credential",
            ", ".join(held),
        )
        args = [sys.executable, "-m", "gpufarm", "profile", "upload", str(trace), "--ir", f"IR-{ir}"]
        args += ["--name", "demo-run", "--batch-size", "32"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, check=False)  # noqa: S603
        farm.settle()
        out = (done.stdout + done.stderr).strip()
        ctx.info(out.splitlines()[-1][:300] if out else "(no output)")
        ctx.check(done.returncode == 0, "the upload succeeded", f"exit {done.returncode}")
        match = _LINK.search(done.stdout)
        if not ctx.check(match is not None, "it printed the run's summary link"):
            return None
        assert match is not None
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        refused = subprocess.run(  # noqa: S603
            [*args[:8], "--token", forged], capture_output=True, text=True, timeout=120, env=env, check=False
        )
        said = refused.stderr.strip()
        ctx.check(
            refused.returncode == 2 and "not gpufarm's" in said and forged not in said,
            "a forged token is refused (exit 2), and not repeated",
            said[:160],
        )
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
