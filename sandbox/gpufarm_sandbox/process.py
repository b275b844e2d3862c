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
from typing import Any


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_sandbox(port: int, *, timeout_s: float = 30.0) -> tuple[subprocess.Popen[bytes], float]:
    """Start `gpufarm sandbox` on `port` in its own process; returns it and the seconds until it answered.

    Exits the program if it does not answer its health check within `timeout_s` (a benchmark has nothing to
    measure without it), killing the process first.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(  # noqa: S603 - this interpreter and fixed arguments
        [sys.executable, "-m", "gpufarm", "sandbox", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = started + timeout_s
    while time.perf_counter() < deadline:
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
