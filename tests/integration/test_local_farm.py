"""`gpufarm local` as a new user meets it: a small farm at once (the example workspace's people, a simulated node in
every pool, the first sync done), the README's walkthrough run as written in a second shell that sets no variables,
that shell's `gpufarm report` on the local host's clock, `gpufarm local env`, a busy port and a stale state file."""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpufarm.cli import cli as gpufarm_cli
from gpufarm.cli import local_state
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm_sandbox.example_farm import DANA, HOSTS, OPERATORS_GROUP, PEOPLE, SLICED_HOST
from gpufarm_sandbox.localhost import LocalEnv
from gpufarm_sandbox.localhost.cli import local, local_hooks, run_local

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
DOCUMENTED_PORT = "8320"
DAY_S = 86_400.0


class Running:
    """A `gpufarm local` run in a thread (as the command runs it, on a free port), its state file and what it
    printed."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env: LocalEnv | None = None
        self.printed = ""
        self._started: queue.Queue[BaseException | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufarm-local", daemon=True)

    def _run(self) -> None:
        def keep(env: LocalEnv) -> None:
            self.env = env

        def wait(stop: Any) -> None:
            self._started.put(None)
            self._stop.wait()

        try:
            run_local("127.0.0.1", 0, hooks=[*local_hooks(), keep], wait=wait, state=self.state)
        except BaseException as exc:
            self._started.put(exc)

    def start(self) -> Running:
        self._thread.start()
        failed = self._started.get(timeout=120)
        if failed is not None:
            raise failed
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    @property
    def local(self) -> LocalEnv:
        assert self.env is not None
        return self.env


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    state = tmp_path_factory.mktemp("local") / "local.json"
    host = Running(state).start()
    try:
        yield host
    finally:
        host.stop()
    assert not state.exists(), "the state file outlived its local host"


def second_shell(running: Running) -> dict[str, str]:
    """A new shell's environment: nothing of gpufarm's, Datadog's, Slack's or AWS's; only where the state file is."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["GPUFARM_LOCAL_STATE"] = str(running.state)
    return env


def test_the_farm_is_there_at_once(running: Running) -> None:
    sandbox = running.local.sandbox
    names = [name for name, *_ in HOSTS] + [SLICED_HOST[0]]
    hosts = {name: GpuHost.from_tags(name, sandbox.hosts.tags_for(name)) for name in names}
    assert all(hosts.values()), [n for n, h in hosts.items() if h is None]
    assert {h.environment for h in hosts.values() if h} == {"onprem-hpc", "cloud-aws", "shared-slices"}
    # Every node sent a cycle before the first sync: the ledger and the dashboards have data.
    assert "gpufarm.gpu.utilization" in sandbox.metrics.metric_names()
    assert any(name.startswith("gpufarm.ledger.") for name in sandbox.metrics.metric_names())
    users = {u["id"]: u["name"] for u in sandbox.slack.state.users.values()}
    assert all(users.get(p.id) == p.name for p in PEOPLE)
    assert sandbox.slack.state.usergroups[OPERATORS_GROUP]["users"] == [DANA.id]
    state = local_state.find_running(running.state, print)
    assert state is not None and state.url == running.local.url
    printed = "\n".join(line for line in _open_lines(running))
    assert f"open dashboards  {running.local.url}/dashboards" in printed
    assert f"open incidents   {running.local.url}/incidents" in printed


def _open_lines(running: Running) -> list[str]:
    from gpufarm_sandbox.localhost.cli import open_lines

    return open_lines(running.local)


def walkthrough_blocks(text: str) -> list[tuple[list[str], list[str]]]:
    """The README walkthrough's shell blocks: (commands, documented answers) each."""
    section = text.split("<!-- walkthrough", 1)[1].split("<!-- end of walkthrough -->", 1)[0]
    blocks = []
    for body in re.findall(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL):
        lines = body.splitlines()
        blocks.append(
            ([ln for ln in lines if not ln.startswith("# ")], [ln[2:] for ln in lines if ln.startswith("# ")])
        )
    return blocks


def answer_pattern(documented: str) -> re.Pattern[str]:
    """A documented line as a pattern: `...` stands for anything, a run of spaces for any spaces."""
    parts = [r"\s+".join(map(re.escape, part.split())) for part in documented.split("...")]
    return re.compile(".*".join(parts))


def unanswered(documented: list[str], printed: list[str]) -> list[str]:
    """The documented lines not found in what was printed, in order."""
    missing, at = [], 0
    for line in documented:
        pattern = answer_pattern(line)
        found = next((i for i in range(at, len(printed)) if pattern.fullmatch(printed[i].strip())), None)
        if found is None:
            missing.append(line)
        else:
            at = found + 1
    return missing


def test_the_readme_walkthrough_works_as_written(running: Running) -> None:
    blocks = walkthrough_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 4 and all(answers for _, answers in blocks)
    port = running.local.url.rsplit(":", 1)[1]
    script = []
    for number, (commands, _) in enumerate(blocks):
        script.append(f"echo '@@ block {number}'")
        script += [c.replace(DOCUMENTED_PORT, port).replace(".venv/bin/", f"{BIN}/") for c in commands]
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=ROOT,
        env=second_shell(running),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = re.split(r"^@@ block \d+\n", done.stdout, flags=re.MULTILINE)[1:]
    assert len(printed) == len(blocks)
    problems = {
        " / ".join(commands)[:80]: missing
        for (commands, answers), out in zip(blocks, printed, strict=True)
        if (missing := unanswered(answers, out.splitlines()))
    }
    assert not problems, f"{problems}\nprinted:\n{done.stdout}\nstderr:\n{done.stderr}"


def test_a_second_shell_reports_on_the_local_hosts_clock(running: Running) -> None:
    sandbox = running.local.sandbox
    sandbox.clock.advance(DAY_S)
    done = subprocess.run(
        [str(BIN / "gpufarm"), "report", "--format", "json"],
        env=second_shell(running),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # A day on the sandbox's clock, which the wall clock has not seen: the period ends at the sandbox's now.
    assert report["period"]["end"][:13] == _iso(sandbox.clock.now())[:13]


def _iso(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_local_env_prints_the_hosts_variables(running: Running) -> None:
    done = subprocess.run(
        [str(BIN / "gpufarm"), "local", "env"],
        env=second_shell(running),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    exported = dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines())
    assert exported["GPUFARM_DATADOG_HOST"] == running.local.url
    assert set(exported) == set(running.local.env)


def test_a_busy_port_is_refused_naming_the_port_and_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFARM_LOCAL_STATE", str(tmp_path / "local.json"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(local, ["--port", str(port), "--no-setup"])
    assert result.exit_code == 2, result.output
    assert f"port {port} on 127.0.0.1 is in use" in result.output and "--port" in result.output
    assert not (tmp_path / "local.json").exists()


def test_a_stale_state_file_is_ignored_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "local.json"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    local_state.write_state(
        state, "http://127.0.0.1:8320", {"GPUFARM_DATADOG_HOST": "http://127.0.0.1:8320"}, pid=int(gone.stdout)
    )
    monkeypatch.setenv("GPUFARM_LOCAL_STATE", str(state))
    for name in local_state.DEPLOYMENT_ENV:
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(local, ["env"])
    assert result.exit_code == 1
    assert f"ignored a stale state file {state}" in result.output and "no gpufarm local is running" in result.output
    result = CliRunner().invoke(gpufarm_cli, ["report", "--since", "nonsense"])
    assert f"ignored a stale state file {state}" in result.output
    assert "GPUFARM_DATADOG_HOST" not in os.environ


def test_a_second_local_host_leaves_a_running_ones_state_file(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gpufarm_sandbox.localhost.cli import publish_state

    state = tmp_path / "local.json"
    first = {"GPUFARM_DATADOG_HOST": "http://127.0.0.1:8320"}
    local_state.write_state(state, "http://127.0.0.1:8320", first, pid=os.getppid())  # a live process, not this one
    said = publish_state(state, SimpleNamespace(url="http://127.0.0.1:8321", env={"A": "b"}))  # type: ignore[arg-type]
    assert said[0].startswith("note: the gpufarm local at http://127.0.0.1:8320") and "owns" in said[0]
    running = local_state.find_running(state, print)
    assert running is not None and dict(running.env) == first
