"""The local host's state file: how a `gpufarm` command in another shell finds a running `gpufarm local`.

`gpufarm local` writes it once it is ready and removes it when it stops. Format (version 1), one JSON object, mode
0600:

    {"version": 1, "pid": 4242, "url": "http://127.0.0.1:8320", "env": {"DD_API_KEY": "...", ...}}

`pid` is the local host's process, `url` its base URL, `env` the environment its functions run with (the sandbox's
endpoints and its fixed development credentials). Where it lives: `$GPUFARM_LOCAL_STATE`, else
`$XDG_RUNTIME_DIR/gpufarm/local.json`, else `~/.cache/gpufarm/local.json`.

A command of this distribution applies it only where the environment names no deployment (neither `DD_API_KEY`
nor `GPUFARM_DATADOG_HOST` is set): the file's variables are added for that command, those already set stay (a
researcher's `GPUFARM_UPLOAD_TOKEN`). A file whose process is gone, or that is not this format, is ignored with a note.
The runtime knows only this format, never the local host that writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

VERSION = 1
PATH_ENV = "GPUFARM_LOCAL_STATE"
# Any of these set: the environment already names a deployment, and the state file is not read.
DEPLOYMENT_ENV = ("DD_API_KEY", "GPUFARM_DATADOG_HOST")
MAX_BYTES = 64 * 1024
MAX_VARIABLES = 200
MAX_VALUE_CHARS = 4096
_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_URL = re.compile(r"^https?://[A-Za-z0-9.\[\]:-]{1,200}$")

Note = Callable[[str], None]


@dataclass(frozen=True)
class LocalState:
    """A running local host as its state file describes it."""

    pid: int
    url: str
    env: Mapping[str, str]


class StateFileError(ValueError):
    """The file is not a version-1 state file."""


def state_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the state file lives for this environment."""
    env = os.environ if env is None else env
    if env.get(PATH_ENV):
        return Path(env[PATH_ENV])
    runtime_dir = env.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return Path(runtime_dir) / "gpufarm" / "local.json"
    return Path.home() / ".cache" / "gpufarm" / "local.json"


def parse_state(data: bytes) -> LocalState:
    """A state file's content, checked; StateFileError for anything else."""
    if len(data) > MAX_BYTES:
        raise StateFileError(f"over {MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise StateFileError("not JSON") from exc
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise StateFileError(f"not a version-{VERSION} state file")
    pid, url, env = doc.get("pid"), doc.get("url"), doc.get("env")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 1 << 31:
        raise StateFileError("pid is not a process id")
    if not isinstance(url, str) or not _URL.match(url):
        raise StateFileError("url is not an http(s) base URL")
    if not isinstance(env, dict) or len(env) > MAX_VARIABLES:
        raise StateFileError(f"env is not an object of at most {MAX_VARIABLES} variables")
    for name, value in env.items():
        if not _NAME.match(name) or not isinstance(value, str) or len(value) > MAX_VALUE_CHARS or "\0" in value:
            raise StateFileError(f"env holds a bad variable {name[:64]!r}")
    return LocalState(pid, url, dict(env))


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def find_running(path: Path, note: Note) -> LocalState | None:
    """The running local host the file names; None (with a note saying why) for a stale or broken file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        note(f"note: cannot read the local host's state file {path}: {exc.strerror or exc}; ignored")
        return None
    try:
        state = parse_state(data)
    except StateFileError as exc:
        note(f"note: {path} is not a gpufarm local state file ({exc}); ignored")
        return None
    if not process_alive(state.pid):
        note(f"note: ignored a stale state file {path}: its gpufarm local (pid {state.pid}) is not running")
        return None
    return state


def deployment_named(env: Mapping[str, str]) -> bool:
    """Whether the environment already names a deployment (the state file is then not read)."""
    return any(env.get(name) for name in DEPLOYMENT_ENV)


def apply(env: MutableMapping[str, str], note: Note) -> Callable[[], None]:
    """Add a running local host's variables to env where it names no deployment; returns what puts env back."""
    if deployment_named(env):
        return _nothing
    state = find_running(state_path(env), note)
    if state is None:
        return _nothing
    added = {name: value for name, value in state.env.items() if name not in env}
    env.update(added)

    def restore() -> None:
        for name, value in added.items():
            if env.get(name) == value:
                del env[name]

    return restore


def write_state(path: Path, url: str, env: Mapping[str, str], pid: int | None = None) -> None:
    """Write the state file whole (a temporary file beside it, renamed into place), readable by its owner only."""
    body = json.dumps(
        {"version": VERSION, "pid": os.getpid() if pid is None else pid, "url": url, "env": dict(env)},
        indent=1,
        sort_keys=True,
    ).encode()
    parse_state(body)  # what it writes, it must read back
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(body)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def remove_state(path: Path, pid: int | None = None) -> None:
    """Remove the state file if it is this process's (another local host's, written since, stays)."""
    pid = os.getpid() if pid is None else pid
    try:
        state = parse_state(path.read_bytes())
    except (OSError, StateFileError):
        return
    if state.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _nothing() -> None:
    return None
