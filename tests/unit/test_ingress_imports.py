"""The Slack ingress path never imports Datadog's aggregate model package (nor the client, nor boto3).

Checked in a fresh interpreter: import the Lambda entry point, handle one signed slash command with the
hand-off stubbed, then look at sys.modules. A parent test process has imported everything already, so only a
subprocess can tell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, "functions/slack_ingress")
import slack_ingress
from gpufarm.handlers import runtime

class Clock:
    def now(self):
        from datetime import datetime, UTC
        return datetime.fromtimestamp(1700000000, UTC)
    def epoch(self):
        return 1700000000.0

class Invoker:
    calls = []
    def invoke(self, function, payload):
        self.calls.append((function, payload))

invoker = Invoker()
runtime.override(clock=Clock(), invoker=invoker)
event = json.load(open("events/slack_command_request_inline.json"))
answer = slack_ingress.handler(event, None)
print(json.dumps({
    "status": answer["statusCode"],
    "body": json.loads(answer["body"]),
    "handed_off": invoker.calls,
    "ms": (time.perf_counter() - started) * 1000,
    "modules": sorted(m for m in sys.modules if m.startswith(("datadog_api_client", "boto3", "botocore"))),
}))
"""


def test_ingress_handles_a_command_without_importing_datadog_or_boto3() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_"))}
    env.update(
        {
            "GPUFARM_SLACK_SIGNING_SECRET": "fakesigningsecret000000000000000",
            "GPUFARM_WORKER_FUNCTION": "SlackWorkerFunction",
            "GPUFARM_FARM_CONFIG": "config/farm.example.yaml",
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 200
    assert result["body"]["response_type"] == "ephemeral"
    assert "Requesting 8x H100 in onprem-hpc for nlp/llm-ko" in result["body"]["text"]
    [(function, payload)] = result["handed_off"]
    assert function == "SlackWorkerFunction"
    assert payload["kind"] == "request" and payload["request"]["gpu_count"] == 8
    assert result["modules"] == [], f"the ingress imported {result['modules'][:5]}"
