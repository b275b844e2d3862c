"""Function telemetry in Lambda: one JSON line per record, gpufarm's module loggers included, correlation keys.

Each case runs in a fresh interpreter with the variables Lambda sets (AWS_LAMBDA_FUNCTION_NAME, AWS_LAMBDA_LOG_LEVEL
from LoggingConfig), because the setup changes the process's logging for good, as it should in a container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, logging, sys
# The Lambda runtime's own root handler (JSON under LoggingConfig) is in place before the entry point is imported.
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="ROOT %(name)s %(message)s")
sys.path.insert(0, "functions/quota_sync")
import quota_sync
from gpufarm.handlers import quota_sync as module
from gpufarm.handlers import telemetry

class Context:
    function_name = "QuotaSyncFunction"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:QuotaSyncFunction"
    def __init__(self, request_id):
        self.aws_request_id = request_id

def handle(event, context):
    if event.get("keys"):
        telemetry.correlate(ir=42, slack_user="U0123ABCD", request_id="slack-cmd-1", incident_id="0000-1", pool="p1")
    log = logging.getLogger("gpufarm.core.service")
    log.info("allocated %d GPUs", 8)
    log.warning("reclaim soon")
    logging.getLogger("botocore.credentials").info("a third-party line")
    return "done"

handler = telemetry.instrument(handle)
print(json.dumps({"wrapped": quota_sync.handler is not module.handle}), flush=True)
handler({"keys": True}, Context("req-1"))
handler({}, Context("req-2"))
"""


def run(env_overrides: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_", "AWS_", "POWERTOOLS"))}
    env.update({"AWS_LAMBDA_FUNCTION_NAME": "QuotaSyncFunction", **env_overrides})
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    first, *lines = done.stdout.strip().splitlines()
    root = [line for line in lines if line.startswith("ROOT ")]
    return json.loads(first), [json.loads(line) for line in lines if line not in root], root


@pytest.mark.parametrize("service", ["gpufarm", "gpufarm-prod"])
def test_gpufarm_records_are_json_lines_with_the_context_and_correlation_keys(service: str) -> None:
    meta, lines, root = run({"POWERTOOLS_SERVICE_NAME": service, "AWS_LAMBDA_LOG_LEVEL": "INFO"})
    assert meta == {"wrapped": True}
    # Both invocations wrote their two gpufarm lines once each (never again through the runtime's root handler);
    # the third-party line stays with the root handler.
    assert root == ["ROOT botocore.credentials a third-party line"] * 2
    assert [(line["level"], line["message"]) for line in lines] == [
        ("INFO", "allocated 8 GPUs"),
        ("WARNING", "reclaim soon"),
        ("INFO", "allocated 8 GPUs"),
        ("WARNING", "reclaim soon"),
    ]
    first, _, second, _ = lines
    assert first["service"] == service and first["name"] == "gpufarm.core.service"
    assert (first["function_name"], first["function_request_id"], first["cold_start"]) == (
        "QuotaSyncFunction",
        "req-1",
        True,
    )
    assert (first["ir"], first["slack_user"], first["request_id"], first["incident_id"], first["pool"]) == (
        "IR-42",
        "U0123ABCD",
        "slack-cmd-1",
        "0000-1",
        "p1",
    )
    # The next invocation starts without the previous one's keys.
    assert (second["function_request_id"], second["cold_start"]) == ("req-2", False)
    assert not {"ir", "slack_user", "request_id", "incident_id", "pool"} & set(second)


def test_the_level_comes_from_the_functions_logging_config() -> None:
    _, lines, _ = run({"AWS_LAMBDA_LOG_LEVEL": "WARN", "POWERTOOLS_LOG_LEVEL": "WARN"})
    assert [line["message"] for line in lines] == ["reclaim soon", "reclaim soon"]


def test_outside_lambda_the_handler_runs_as_written_within_its_time_budget() -> None:
    from gpufarm.adapters import time_budget
    from gpufarm.handlers import telemetry

    seen: list[bool] = []

    def handle(event: Any, context: Any) -> Any:
        seen.append(time_budget.allows(1.0))
        return event

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 1500

    wrapped = telemetry.instrument(handle)
    assert wrapped({"a": 1}, None) == {"a": 1}  # no context: no budget
    assert wrapped({"a": 2}, Context()) == {"a": 2}  # 1.5 s left, 0.3 s of it kept for the answer: no 1 s wait
    assert seen == [True, False]
    assert time_budget.allows(1.0)  # the budget ends with the invocation
    telemetry.correlate(ir=1, slack_user="U1")  # nothing is set up, nothing happens
