"""The local host's state file: its format read back and checked, where it lives, a stale or broken one ignored with
a note, and its variables added only where the environment names no deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufarm.cli import local_state

URL = "http://127.0.0.1:8320"
ENV = {"GPUFARM_DATADOG_HOST": URL, "GPUFARM_LOCAL_INVOKE_URL": f"{URL}/_local/invoke", "GPUFARM_USER": "U0000000009"}


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(done.stdout)


def test_what_it_writes_it_reads_back_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "run" / "local.json"
    local_state.write_state(path, URL, ENV)
    assert path.stat().st_mode & 0o777 == 0o600
    said: list[str] = []
    state = local_state.find_running(path, said.append)
    assert state is not None and (state.pid, state.url, dict(state.env)) == (os.getpid(), URL, ENV)
    assert said == []


def test_where_it_lives() -> None:
    assert local_state.state_path({"GPUFARM_LOCAL_STATE": "/x/s.json", "XDG_RUNTIME_DIR": "/run/u"}) == Path(
        "/x/s.json"
    )
    assert local_state.state_path({"XDG_RUNTIME_DIR": "/run/u"}) == Path("/run/u/gpufarm/local.json")
    assert local_state.state_path({}) == Path.home() / ".cache" / "gpufarm" / "local.json"


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (b"{", "not JSON"),
        (json.dumps({"version": 2, "pid": 1, "url": URL, "env": {}}).encode(), "not a version-1"),
        (json.dumps({"version": 1, "pid": True, "url": URL, "env": {}}).encode(), "pid"),
        (json.dumps({"version": 1, "pid": 1, "url": "file:///etc", "env": {}}).encode(), "url"),
        (json.dumps({"version": 1, "pid": 1, "url": URL, "env": {"lower": "x"}}).encode(), "bad variable"),
        (json.dumps({"version": 1, "pid": 1, "url": URL, "env": {"A": 3}}).encode(), "bad variable"),
        (b" " * (local_state.MAX_BYTES + 1), "over"),
    ],
)
def test_a_file_of_another_shape_is_refused(doc: bytes, why: str) -> None:
    with pytest.raises(local_state.StateFileError, match=why):
        local_state.parse_state(doc)


def test_a_broken_or_stale_file_is_ignored_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "local.json"
    said: list[str] = []
    assert local_state.find_running(path, said.append) is None and said == []  # none: nothing to say
    path.write_text("not json")
    assert local_state.find_running(path, said.append) is None
    assert said[-1].startswith(f"note: {path} is not a gpufarm local state file")
    pid = _dead_pid()
    local_state.write_state(path, URL, ENV, pid=pid)
    assert local_state.find_running(path, said.append) is None
    assert said[-1] == f"note: ignored a stale state file {path}: its gpufarm local (pid {pid}) is not running"


def test_variables_are_added_only_where_no_deployment_is_named_and_taken_back(tmp_path: Path) -> None:
    path = tmp_path / "local.json"
    local_state.write_state(path, URL, {**ENV, "GPUFARM_USER": "U0000000001"})
    env = {"GPUFARM_LOCAL_STATE": str(path), "GPUFARM_USER": "U0000000007"}
    restore = local_state.apply(env, print)
    # The researcher's own GPUFARM_USER stays.
    assert env == {"GPUFARM_LOCAL_STATE": str(path), **ENV, "GPUFARM_USER": "U0000000007"}
    restore()
    assert env == {"GPUFARM_LOCAL_STATE": str(path), "GPUFARM_USER": "U0000000007"}

    deployed = {"GPUFARM_LOCAL_STATE": str(path), "DD_API_KEY": "x" * 32}
    local_state.apply(deployed, print)()
    assert deployed == {"GPUFARM_LOCAL_STATE": str(path), "DD_API_KEY": "x" * 32}


def test_a_host_removes_only_its_own_file(tmp_path: Path) -> None:
    path = tmp_path / "local.json"
    local_state.write_state(path, URL, ENV, pid=os.getppid())
    local_state.remove_state(path)
    assert path.exists()
    local_state.write_state(path, URL, ENV)
    local_state.remove_state(path)
    assert not path.exists()
    local_state.remove_state(path)  # gone already: nothing to do
