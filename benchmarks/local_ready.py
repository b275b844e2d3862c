"""`gpufarm local` from the command to ready and to the first request answered (goal <= 30 s after the venv exists).

Each run starts the real command in its own process on a free port, with its own state file (GPUFARM_LOCAL_STATE
in a temporary folder): the Datadog setup, the example workspace, the example farm's nodes sending their first
cycle and the first sync. Measured from outside: the seconds until it prints `ready in`, until its state file
exists, and until a researcher's `/gpu request` (the README's first request, through the sandbox's slash-command
endpoint) has its allocation DM. Then it is stopped with SIGTERM and must remove its state file.

Run: .venv/bin/python benchmarks/local_ready.py [--runs 3]. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

GOAL_S = 30.0
REQUEST = "request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=3"
ALICE = "U0000000001"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _dm_arrived(base: str) -> bool:
    with urllib.request.urlopen(f"{base}/_sandbox/slack/messages?user={ALICE}", timeout=10) as response:
        messages = json.loads(response.read())["messages"]
    return any(m["kind"] == "dm" and "is allocated on" in m["text"] for m in messages)


def one_run(gpufarm: Path) -> dict[str, float]:
    """One start of `gpufarm local`, measured."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "local.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
        env["GPUFARM_LOCAL_STATE"] = str(state)
        started = time.perf_counter()
        process = subprocess.Popen(
            [str(gpufarm), "local", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("ready in"):
                    break
            else:
                raise RuntimeError(f"gpufarm local ended before it was ready (exit {process.wait()})")
            ready = time.perf_counter() - started
            if not state.exists():
                raise RuntimeError("ready, but no state file")
            _post(
                f"{base}/_sandbox/slack/commands", {"user": ALICE, "text": REQUEST, "url": f"{base}/fn/slack_ingress/"}
            )
            deadline = time.perf_counter() + 60
            while not _dm_arrived(base):
                if time.perf_counter() > deadline:
                    raise RuntimeError("no allocation DM within 60 s of the request")
                time.sleep(0.05)
            answered = time.perf_counter() - started
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        if state.exists():
            raise RuntimeError("the state file outlived its local host")
    return {"ready_s": round(ready, 2), "first_request_allocated_s": round(answered, 2)}


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    gpufarm = Path(sys.executable).parent / "gpufarm"
    runs = [one_run(gpufarm) for _ in range(args.runs)]
    ready = [r["ready_s"] for r in runs]
    answered = [r["first_request_allocated_s"] for r in runs]
    print(
        json.dumps(
            {
                "runs": runs,
                "ready_s_median": statistics.median(ready),
                "first_request_allocated_s_median": statistics.median(answered),
                "goal_s": GOAL_S,
                "met": max(answered) <= GOAL_S,
                "load": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
