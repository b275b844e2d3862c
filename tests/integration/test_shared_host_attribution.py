"""A shared host holding one lease: the lease is charged only the slices the allocator assigned it, and the busy
slices no lease holds show as unattributed use on the slicing and ledger dashboards (their own queries, evaluated on
the sandbox's metrics as the local dashboard pages evaluate them)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpufarm.core.config.farm import FarmConfig, parse_farm
from gpufarm.core.kernel.hosts import assign_tag
from gpufarm.setup.dashboards_farm.ledger import quota_ledger
from gpufarm.setup.dashboards_farm.slicing import slicing
from gpufarm.setup.dashboards_widgets import walk
from gpufarm_node.topology import packaged_topology
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.dashboard_evaluate import Evaluator, Result
from gpufarm_sandbox.localhost.seams import find_example_farm
from gpufarm_sandbox.simfarm import HostSpec, SimulatedFarm, simulate_hosts

HOST = "gpu-slc-901"


def _packaged_slicing_host() -> HostSpec:
    """The GPU-slicing pool's host as topologies/a100-mig-slicing.yaml describes it, every slice busy, no IR of its
    processes' own (no GPUFARM_IR, no pod)."""
    [gpu] = yaml.safe_load(packaged_topology("a100-mig-slicing").read_text())["gpus"]
    return HostSpec(
        HOST,
        "shared-slices",
        "k8s-shared",
        gpu["model"],
        gpu["count"],
        gpu["mig"]["profile"],
        gpu["mig"]["count"],
        profile="busy",
    )


@pytest.fixture
def farm(sandbox: Sandbox, sandbox_url: str) -> Iterator[SimulatedFarm]:
    built = simulate_hosts(
        [_packaged_slicing_host()],
        sandbox_url,
        DEFAULT_DD_API_KEY,
        DEFAULT_DD_APP_KEY,
        clock=sandbox.clock.now,
        background=False,
    )
    try:
        yield built
    finally:
        built.stop()


def _tag_host(sandbox_url: str, tags: list[str]) -> None:
    """What the allocator writes for a shared lease: its `ir:` tag and one `gpu_assign` tag per unit, in one write."""
    request = urllib.request.Request(
        f"{sandbox_url}/api/v1/tags/hosts/{HOST}?source=user",
        data=json.dumps({"host": HOST, "tags": tags}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "DD-API-KEY": DEFAULT_DD_API_KEY,
            "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY,
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 201)


def _widget(dashboard: dict[str, Any], title: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    [definition] = [w["definition"] for w in walk(dashboard["widgets"]) if w["definition"].get("title") == title]
    return definition, dashboard.get("template_variables") or []


def _evaluate(sandbox: Sandbox, dashboard: dict[str, Any], title: str) -> Result:
    definition, variables = _widget(dashboard, title)
    now = sandbox.clock.now()
    result = Evaluator(sandbox.metrics.query_series, now - 60, now, variables, {}).widget(definition)
    assert result.error is None, result.error
    return result


def _farm() -> FarmConfig:
    path = find_example_farm()
    assert path is not None
    return parse_farm(path.read_text())


def test_one_lease_holding_two_of_fourteen_busy_slices_is_charged_two(
    farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str
) -> None:
    node = farm.node(HOST)
    slices = [node.device_uuid(d).lower() for d in node.devices()]
    assert len(slices) == 14
    held = [slices[0], slices[8]]
    _tag_host(sandbox_url, ["ir:ir-2", *(assign_tag("ir-2", u) for u in held)])
    for _ in range(3):
        assert all(r.flushed for r in farm.step_all())
        sandbox.clock.advance(15)

    example = _farm()
    per_lease = _evaluate(sandbox, slicing(example), "MIG slices and shared GPUs per lease")
    assert [(keys, values) for keys, values in per_lease.rows] == [(("gpu_ir:ir-2",), [2.0])]
    unattributed = _evaluate(
        sandbox, quota_ledger(example), "Unattributed usage now: busy devices no lease holds, per host (node agents)"
    )
    assert [(keys, values) for keys, values in unattributed.rows] == [((f"host:{HOST}",), [12.0])]
    # Slice by slice: the two assigned slices carry the lease, the twelve others `none`.
    table = _evaluate(sandbox, slicing(example), "MIG slices: lease, activity, memory, processes")
    by_slice = {
        next(k for k in keys if k.startswith("gpu_uuid:")): next(k for k in keys if k.startswith("gpu_ir:"))
        for keys, _ in table.rows
    }
    assert {u for u, ir in by_slice.items() if ir == "gpu_ir:ir-2"} == {f"gpu_uuid:{u}" for u in held}
    assert sum(ir == "gpu_ir:none" for ir in by_slice.values()) == 12
