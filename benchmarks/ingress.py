"""Slack ingress latency: a cold process handling one signed command, and slash command → IR number end to end.

1. Cold start: a fresh Python process imports the ingress's Lambda entry point and handles one signed
   `/gpu request ...` (events/slack_command_request_inline.json) with the hand-off to the worker stubbed;
   median of N runs, whole process wall time and the in-process import + handle part. Target: <= 300 ms.
2. End to end under the local function host (`gpufarm local` in-process): the sandbox types a slash command as
   a Slack user; the clock runs until the IR number appears in the sandbox's Slack messages (the worker's
   answer through the response_url). Each request is released afterwards so quotas never run out.

Run: .venv/bin/python benchmarks/ingress.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COLD_TARGET_MS = 300.0

COLD_SCRIPT = r"""
import time
started = time.perf_counter()
import json, sys
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
from gpufarm.handlers import runtime

class Clock:
    def epoch(self):
        return 1700000000.0
    def now(self):
        from datetime import UTC, datetime
        return datetime.fromtimestamp(1700000000, UTC)

class Stub:
    def invoke(self, function, payload):
        self.payload = payload

stub = Stub()
runtime.override(clock=Clock(), invoker=stub)
with open("events/slack_command_request_inline.json") as fh:
    event = json.load(fh)
answer = slack_ingress.handler(event, None)
assert answer["statusCode"] == 200 and stub.payload["kind"] == "request", answer
print(json.dumps({"inside_ms": (time.perf_counter() - started) * 1000,
                  "datadog": any(m.startswith("datadog_api_client") for m in sys.modules),
                  "boto3": "boto3" in sys.modules}))
"""


def cold_runs(runs: int) -> dict[str, Any]:
    """Fresh interpreters, each handling one signed slash command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env.update(
        {
            "GPUFARM_SLACK_SIGNING_SECRET": "fakesigningsecret000000000000000",
            "GPUFARM_WORKER_FUNCTION": "SlackWorkerFunction",
            "GPUFARM_FARM_CONFIG": str(ROOT / "config" / "farm.example.yaml"),
            "PYTHONDONTWRITEBYTECODE": "",
        }
    )
    # One untimed run so .pyc files exist, as they do in a deployed layer.
    subprocess.run([sys.executable, "-c", COLD_SCRIPT], cwd=ROOT, env=env, check=True, capture_output=True)
    wall: list[float] = []
    inside: list[float] = []
    heavy = False
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", COLD_SCRIPT], cwd=ROOT, env=env, check=True, capture_output=True, text=True
        )
        wall.append((time.perf_counter() - started) * 1000)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        inside.append(result["inside_ms"])
        heavy = heavy or result["datadog"] or result["boto3"]
    return {
        "runs": runs,
        "process_median_ms": statistics.median(wall),
        "process_max_ms": max(wall),
        "import_and_handle_median_ms": statistics.median(inside),
        "imported_datadog_or_boto3": heavy,
    }


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def end_to_end(runs: int) -> dict[str, Any]:
    """Slash command → IR number in the sandbox's Slack messages, under the local function host."""
    import re

    from gpufarm.config import Settings
    from gpufarm.core.farm import parse_farm
    from gpufarm_sandbox.demo.lifecycle_stage import ALICE, LocalFarm
    from gpufarm_sandbox.localhost import start_local

    with start_local(port=0) as env:
        farm = LocalFarm(env.url, env.host, Settings())
        farm.seed_workspace()
        farm.seed_hosts()
        farm.apply_setup(parse_farm((ROOT / "config" / "farm.example.yaml").read_text()).valid_values())
        to_ir: list[float] = []
        acks: list[float] = []
        to_allocated: list[float] = []
        seen = 0
        for n in range(runs):
            started = time.perf_counter()
            sent = farm.slash(ALICE, f"request 8 H100 project=bench-{n} team=nlp env=onprem-hpc days=1")
            acks.append(float(sent["latency_ms"]))
            ir = None
            while ir is None and time.perf_counter() - started < 30:
                messages = _get(f"{env.url}/_sandbox/slack/messages?user={ALICE.id}&kind=response")["messages"]
                for message in messages[seen:]:
                    match = re.search(r"\bIR-(\d+)\b", message["text"])
                    if match:
                        ir = int(match.group(1))
                if ir is None:
                    time.sleep(0.002)
            if ir is None:
                raise RuntimeError("no IR number within 30 s")
            to_ir.append((time.perf_counter() - started) * 1000)
            seen = len(_get(f"{env.url}/_sandbox/slack/messages?user={ALICE.id}&kind=response")["messages"])
            while farm.allocation(ir).phase.value != "allocated" and time.perf_counter() - started < 30:
                time.sleep(0.005)
            to_allocated.append((time.perf_counter() - started) * 1000)
            farm.slash(ALICE, f"release IR-{ir}")
            farm.settle()
            seen = len(_get(f"{env.url}/_sandbox/slack/messages?user={ALICE.id}&kind=response")["messages"])
        farm.close()
    return {
        "runs": runs,
        "ack_median_ms": statistics.median(acks),
        "command_to_ir_median_ms": statistics.median(to_ir),
        "command_to_ir_max_ms": max(to_ir),
        "command_to_hosts_tagged_median_ms": statistics.median(to_allocated),
    }


def main() -> None:
    """Run both measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    cold = cold_runs(args.runs)
    verdict = "meets" if cold["process_median_ms"] <= COLD_TARGET_MS else "MISSES"
    print(
        f"cold ingress process, median of {cold['runs']}: {cold['process_median_ms']:.0f} ms "
        f"(max {cold['process_max_ms']:.0f} ms; import + handle inside it {cold['import_and_handle_median_ms']:.0f} ms)"
        f" - {verdict} the {COLD_TARGET_MS:.0f} ms target"
    )
    print(f"  datadog_api_client or boto3 imported on the ingress path: {cold['imported_datadog_or_boto3']}")
    e2e = end_to_end(args.runs)
    print(
        f"slash command -> IR number in Slack (local host), median of {e2e['runs']}: "
        f"{e2e['command_to_ir_median_ms']:.0f} ms (max {e2e['command_to_ir_max_ms']:.0f} ms); "
        f"ack {e2e['ack_median_ms']:.0f} ms; hosts tagged after {e2e['command_to_hosts_tagged_median_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
