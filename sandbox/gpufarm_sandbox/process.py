"""`gpufarm sandbox` in a process of its own on loopback, for measurements that keep its CPU off the caller's clock.

Benchmarks start it here so the client's work is all their own process measures, and talk to its control plane
(`/_sandbox/...`) with `control`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from typing import Any

# `gpufarm sandbox` exits with this status on a usage error (click), e.g. an unknown Datadog quirk name.
USAGE_ERROR = 2


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_sandbox(
    port: int, *, timeout_s: float = 30.0, quirks: str | Iterable[str] = ()
) -> tuple[subprocess.Popen[bytes], float]:
    """Start `gpufarm sandbox` on `port` in its own process; returns it and the seconds until it answered.

    quirks: the Datadog quirk modes it plays (`--datadog-quirks`, gpufarm_sandbox.emulator.quirks: names or a
    comma-separated list; the sandbox checks them). Exits the program if the process ends before answering (an
    unknown quirk, say) or does not answer its health check within `timeout_s` (a benchmark has nothing to measure
    without it), killing it first.
    """
    played = quirks if isinstance(quirks, str) else ",".join(quirks)
    args = [sys.executable, "-m", "gpufarm", "sandbox", "--port", str(port)]
    args += ["--datadog-quirks", played] if played else []
    started = time.perf_counter()
    proc = subprocess.Popen(  # noqa: S603 - this interpreter and fixed arguments
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = started + timeout_s
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            usage = " (a usage error: is every Datadog quirk name known?)" if proc.returncode == USAGE_ERROR else ""
            raise SystemExit(f"sandbox exited with status {proc.returncode} before it answered{usage}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sandbox/health", timeout=1):
                return proc, time.perf_counter() - started
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise SystemExit("sandbox did not start")


def control(url: str, path: str, method: str = "GET", body: Any = None) -> Any:
    """One call to the sandbox's control plane at `url` (`/_sandbox/...`); its decoded JSON answer."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an HTTP URL: {url!r}")
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=headers)  # noqa: S310
    with urllib.request.urlopen(request, timeout=600) as answer:  # noqa: S310 - scheme checked above
        return json.loads(answer.read() or b"null")
