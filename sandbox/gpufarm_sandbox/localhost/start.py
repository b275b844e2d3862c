"""`start_local`: a sandbox, the local function host on it and an HTTP server, with the process environment the
functions read, for as long as a block runs (`gpufarm local`, the demo and the tests)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpufarm_sandbox.localhost import setup as local_setup
from gpufarm_sandbox.localhost.env import DROPPED_LOCALLY
from gpufarm_sandbox.localhost.host import LocalHost
from gpufarm_sandbox.localhost.setup import LocalSetup

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox
    from gpufarm_sandbox.emulator.server import ServerThread


@dataclass
class LocalEnv:
    """A running local environment: the sandbox, the function host, the base URL and the variables set."""

    sandbox: Sandbox
    host: LocalHost
    url: str
    env: dict[str, str]
    server: ServerThread
    # What `gpufarm datadog apply` did on the sandbox at start (start_local(setup=True)); None when not asked.
    setup: LocalSetup | None = None


def _connect_host(host: str) -> str:
    if host in ("", "0.0.0.0"):  # noqa: S104 - a comparison: clients of a wildcard bind use loopback
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _clear_process_caches() -> None:
    # A new local host is a new container: AWS clients cached by a previous run (its endpoints, e.g. the S3 of its
    # own moto server) must not leak into this one.
    from gpufarm.adapters.aws import forget_clients

    forget_clients()


@contextlib.contextmanager
def start_local(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    template: Path | None = None,
    root: Path | None = None,
    parameters: Mapping[str, str] | None = None,
    setup: bool = False,
    profiles: bool = False,
    quirks: str | Iterable[str] = (),
) -> Iterator[LocalEnv]:
    """Sandbox + LocalHost + HTTP server; sets sb.base_url and os.environ for the functions (restored on exit).

    With profiles, S3 for profiler runs is moto's server on a loopback port (localhost.profiles).
    With setup, `gpufarm datadog apply` runs on the sandbox (localhost.setup) before the Function URLs accept
    requests (they answer 503 until then) and the environment is yielded; what it did is in LocalEnv.setup.
    quirks: the Datadog quirk modes the sandbox plays (gpufarm_sandbox.emulator.quirks); ValueError for a bad name.
    """
    # Imported when a host starts: the seams (an entry point of the gpufarm runtime) import this package.
    from gpufarm_sandbox.emulator.app import Sandbox
    from gpufarm_sandbox.emulator.server import ServerThread

    sandbox = Sandbox(quirks=quirks)
    # Started before the host mounts its routes (stop() needs a running server); nobody knows the URL yet.
    server = ServerThread(sandbox, host, port).start()
    url = f"http://{_connect_host(host)}:{server.port}"
    sandbox.base_url = url
    try:
        local = LocalHost(sandbox, template=template, root=root, parameters=parameters, held=setup)
    except BaseException:
        server.stop()
        raise
    stack = contextlib.ExitStack()
    if profiles:
        # Profiler runs: moto's S3 server, the profile_upload and profile_pages functions (localhost.profiles).
        from gpufarm_sandbox.localhost.profiles import local_profiles

        try:
            local.env.update(
                stack.enter_context(
                    local_profiles(local.urls.function("profile_pages"), local.urls.function("profile_upload"))
                )
            )
        except BaseException:
            local.close()
            server.stop()
            raise
    names = set(local.env) | DROPPED_LOCALLY
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(local.env)
    for name in DROPPED_LOCALLY:
        os.environ.pop(name, None)
    _clear_process_caches()
    try:
        running = LocalEnv(sandbox=sandbox, host=local, url=url, env=dict(local.env), server=server)
        if setup:
            # Looked up when called: a test replaces it to look at the host while the setup runs.
            running.setup = local_setup.apply_local_setup(running)
            local.held = False
        yield running
    finally:
        local.close()
        server.stop()
        stack.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _clear_process_caches()
