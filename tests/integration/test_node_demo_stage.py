"""The metrics demo stage against the sandbox: standalone, and fed with a lifecycle stage's allocations."""

from __future__ import annotations

import pytest

from gpufarm.config import Settings
from gpufarm_node.datadog import DatadogTarget, api_client, tags_api
from gpufarm_node.tags import registration_tags
from gpufarm_sandbox.demo import metrics_stage as stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

pytestmark = pytest.mark.integration


def _context(sandbox: Sandbox, url: str, lines: list[str]) -> DemoContext:
    return DemoContext(sandbox=sandbox, base_url=url, settings=Settings(), out=lines.append)


def test_standalone_stage_shows_each_ir_and_two_irs_on_one_sliced_node(sandbox: Sandbox, sandbox_url: str) -> None:
    lines: list[str] = []
    ctx = _context(sandbox, sandbox_url, lines)
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures == [], output
    assert ctx.checks >= 14
    assert "IR-9003 holds 2 of its devices" in output and "IR-9003: 2 devices idle_held" in output


def test_stage_uses_the_allocations_and_inventory_an_earlier_stage_left(sandbox: Sandbox, sandbox_url: str) -> None:
    client = api_client(DatadogTarget(sandbox_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY))
    tags = tags_api(client)
    from datadog_api_client.v1.model.host_tags import HostTags

    for host, model, env, cluster, irs in (
        ("hpc-a-01", "H100", "onprem-hpc", "hpc-a", ["ir:ir-21"]),
        ("k8s-l4-01", "L4", "shared-slices", "k8s-shared", ["ir:ir-22", "ir:ir-23"]),
    ):
        tags.create_host_tags(
            host_name=host, body=HostTags(host=host, tags=registration_tags(model, 8, env, cluster) + irs)
        )
    lines: list[str] = []
    ctx = _context(sandbox, sandbox_url, lines)
    ctx.shared["allocations"] = {
        21: {"ir": "IR-21", "hosts": ["hpc-a-01"], "host_gpus": {"hpc-a-01": 8}},
        22: {"ir": "IR-22", "hosts": ["k8s-l4-01"], "host_gpus": {"k8s-l4-01": 2}},
        23: {"ir": "IR-23", "hosts": ["k8s-l4-01"], "host_gpus": {"k8s-l4-01": 2}},
    }
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures == [], output
    assert "k8s-l4-01: IR-22 holds 2 of its devices" in output and "IR-23: 2 devices idle_held" in output
    # The agents' registration kept the allocation tags the lifecycle wrote.
    assert {"ir:ir-22", "ir:ir-23"} <= set(sandbox.hosts.tags_for("k8s-l4-01"))
    client.close()


def test_allocated_hosts_without_inventory_tags_are_reported_and_the_stage_still_runs(
    sandbox: Sandbox, sandbox_url: str
) -> None:
    lines: list[str] = []
    ctx = _context(sandbox, sandbox_url, lines)
    ctx.shared["allocations"] = {5: {"hosts": ["unknown-host"], "host_gpus": {"unknown-host": 1}}}
    stage.run(ctx)
    assert ctx.failures == ["allocated hosts carry inventory tags (missing on unknown-host)"]
    assert any("IR-9001: 8 devices attributed" in line for line in lines)
