"""The foundation demo stage against a sandbox on loopback: every step verified, failures reported, not raised."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.hosts import ALLOCATION_KEYS
from gpufarm.handlers import runtime
from gpufarm_sandbox.demo import foundation_stage as stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.localhost import seams
from gpufarm_sandbox.localhost.start import start_local

pytestmark = pytest.mark.integration


def _context(sandbox: Sandbox, url: str, lines: list[str], settings: Settings | None = None) -> DemoContext:
    return DemoContext(sandbox=sandbox, base_url=url, settings=settings or Settings(), out=lines.append)


def test_stage_verifies_every_step_and_leaves_the_farm_as_it_found_it(
    sandbox: Sandbox, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPUFARM_FARM_CONFIG", "GPUFARM_FARM_CONFIG_PARAMETER", "GPUFARM_INCIDENT_WEBHOOK_URL"):
        monkeypatch.delenv(name, raising=False)
    # Keys that belong to some other Datadog must not be sent to the sandbox.
    monkeypatch.setenv("DD_API_KEY", "a-real-looking-key")
    lines: list[str] = []
    ctx = _context(sandbox, sandbox_url, lines)

    stage.run(ctx)

    output = "\n".join(lines)
    assert ctx.failures == [], output
    assert ctx.checks >= 14
    foundation = ctx.shared["foundation"]
    ir = foundation["ir"]
    assert f"IR-{ir}" in output
    assert f"ir:ir-{ir}: 80.0%" in output
    assert "a-real-looking-key" not in output

    # What the sandbox holds afterwards: the incident resolved, the hosts registered and free.
    state = _get(f"{sandbox_url}/_sandbox/state")
    hosts = state["hosts"]["hosts"]
    for name in stage.HOSTS:
        user_tags = hosts[name]["tags_by_source"]["user"]
        assert "gpufarm:managed" in user_tags
        assert not [t for t in user_tags if t.split(":", 1)[0] in ALLOCATION_KEYS]
    incident = sandbox.incidents.dump()
    assert "resolved" in json.dumps(incident)


def test_stage_uses_the_farm_configuration_choices_too(
    sandbox: Sandbox, sandbox_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text("gpu_models:\n  A100: {}\nenvironments:\n  cloud:\n    gpu_models: [A100]\nteams:\n  nlp: {}\n")
    monkeypatch.setenv("GPUFARM_FARM_CONFIG", str(farm))
    lines: list[str] = []
    ctx = _context(sandbox, sandbox_url, lines)

    stage.run(ctx)

    assert ctx.failures == [], "\n".join(lines)
    admin = DatadogAdmin(stage.stage_settings(ctx))
    choices = {
        d["attributes"]["name"]: [v["value"] for v in d["attributes"].get("valid_values") or []]
        for d in admin.list_field_definitions()
    }
    admin.close()
    assert choices["team"] == ["foundation-demo", "nlp"]
    assert choices["environment"] == ["cloud", "foundation-lab"]
    assert choices["gpu_model"] == ["A100", "H100"]


def test_a_failing_backend_fails_checks_instead_of_crashing(sandbox: Sandbox, sandbox_url: str) -> None:
    # Host tagging keeps failing: the stage records it and stops before it would report on hosts it never tagged.
    _post(f"{sandbox_url}/_sandbox/faults", {"rate": 1.0, "statuses": [500], "paths": "^/api/v1/tags/hosts/"})
    lines: list[str] = []
    ctx = _context(sandbox, sandbox_url, lines, Settings(max_retries=0))

    stage.run(ctx)

    output = "\n".join(lines)
    assert ctx.failures, output
    assert any("raised UpstreamError" in failure for failure in ctx.failures)
    assert "foundation" not in ctx.shared
    assert "Submit GPU utilization" not in output


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _post(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


# -- the AWS adapters' local variants against the real local function host (over loopback) ----------------------------

RECORDER_TEMPLATE = """
Transform: AWS::Serverless-2016-10-31
Resources:
  RecorderFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: recorder/
      Handler: recorder.handler
      Runtime: python3.12
      Events:
        Work:
          Type: SQS
          Properties:
            Queue: !GetAtt WorkQueue.Arn
  WorkQueue:
    Type: AWS::SQS::Queue
    Properties:
      FifoQueue: true
"""

RECORDER = """
import json

EVENTS = []


def handler(event, context):
    EVENTS.append(event)
    return {"batchItemFailures": []} if "Records" in event else None
"""


def test_local_invoker_and_queue_reach_the_local_function_host(tmp_path: Any) -> None:
    (tmp_path / "recorder").mkdir()
    (tmp_path / "recorder" / "recorder.py").write_text(RECORDER)
    template = tmp_path / "template.yaml"
    template.write_text(RECORDER_TEMPLATE)

    with start_local(template=template, root=tmp_path) as env:
        invoker = runtime.current().invoker()  # the local host's seam, in place of the Lambda invoker
        queue = seams.HostQueue(f"{env.url}/_local/queues/WorkQueue")
        assert isinstance(invoker, seams.HostInvoker)

        invoker.invoke("RecorderFunction", {"kind": "request", "n": 8})
        queue.send({"incident_id": "a"}, group="pool:cloud", dedup_id="a-1")
        queue.send({"incident_id": "a"}, group="pool:cloud", dedup_id="a-1")  # a duplicate within 5 minutes
        assert env.host.drain(15)

        events = env.host.module("RecorderFunction").EVENTS
        assert {"kind": "request", "n": 8} in events
        records = [r for e in events for r in e.get("Records", [])]
        assert [json.loads(r["body"]) for r in records] == [{"incident_id": "a"}]
        assert records[0]["attributes"]["MessageGroupId"] == "pool:cloud"

        with pytest.raises(UpstreamError, match="answered 404"):
            invoker.invoke("NoSuchFunction", {})
        with pytest.raises(UpstreamError, match="answered 400"):
            seams.HostQueue(f"{env.url}/_local/queues/NoSuchQueue").send({}, group="g", dedup_id="d")
    with pytest.raises(UpstreamError, match="local function host failed"):
        invoker.invoke("RecorderFunction", {})  # the host is gone: connection refused
