"""Simulated nodes and the agent process against the sandbox over loopback: pools, profiles, IR assignment on
shared sliced nodes, inventory registration, the `gpufarm-node` executable, and DogStatsD over UDP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufarm.core.kernel.hosts import GpuHost
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.simfarm import HostSpec, SimulatedFarm, simulate_hosts, start_simulated_farm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "node"
AGENT = Path(sys.executable).parent / "gpufarm-node"


def _scalar(sandbox: Sandbox, query: str, window: float = 60) -> dict[tuple[str, ...], float]:
    now = sandbox.clock.now()
    return {g.group_tags: g.points[-1][1] for g in sandbox.metrics.query_series(query, now - window, now, 15)}


@pytest.fixture
def farm(sandbox: Sandbox, sandbox_url: str) -> Iterator[SimulatedFarm]:
    farm = start_simulated_farm(
        12, sandbox_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, clock=sandbox.clock.now, background=False
    )
    try:
        yield farm
    finally:
        farm.stop()


def _steps(farm: SimulatedFarm, sandbox: Sandbox, n: int = 3) -> None:
    for _ in range(n):
        reports = farm.step_all()
        assert all(r.flushed for r in reports)
        sandbox.clock.advance(15)


def test_twelve_nodes_cover_every_pool_and_profile_and_register_into_the_inventory(
    farm: SimulatedFarm, sandbox: Sandbox
) -> None:
    assert {(n.spec.environment, n.spec.profile) for n in farm.nodes} == {
        (env, profile)
        for env in ("cloud-aws", "onprem-hpc", "shared-slices")
        for profile in ("busy", "idle", "idle-held", "unattributed")
    }
    _steps(farm, sandbox, 2)
    hosts = [GpuHost.from_tags(h, sandbox.hosts.tags_for(h)) for h in farm.hosts]
    assert all(hosts) and {h.gpu_model for h in hosts if h} == {"H100", "A100"}
    states = _scalar(sandbox, "sum:gpufarm.ir.gpus_idle_held{*} by {host}")
    held = {n.hostname for n in farm.nodes if n.spec.profile == "idle-held" and n.spec.model != "A100"}
    assert {g[0].removeprefix("host:") for g, v in states.items() if v > 0} == held
    # Nothing is assigned yet: every running container's usage is unattributed.
    containers = _scalar(sandbox, "sum:gpufarm.container.processes{gpu_ir:none} by {host}")
    assert {g[0].removeprefix("host:") for g in containers} == {
        n.hostname for n in farm.nodes if n.spec.profile != "idle"
    }


def test_two_irs_on_one_sliced_node_are_told_apart_per_slice(farm: SimulatedFarm, sandbox: Sandbox) -> None:
    sliced = next(n for n in farm.nodes if n.spec.environment == "shared-slices" and n.spec.profile == "busy")
    first = farm.assign(sliced.hostname, 4101, gpus=["0/0", "0/1", "0/2"])
    second = farm.assign(sliced.hostname, "IR-4102", gpus=["0/3", "0/4", "1"])
    assert len(first) == 3 and len(second) == 2 + 7
    whole = next(n for n in farm.nodes if n.spec.environment == "cloud-aws" and n.spec.profile == "idle")
    farm.assign(whole.hostname, 4103)
    _steps(farm, sandbox)
    devices = _scalar(sandbox, f"sum:gpufarm.ir.gpus{{host:{sliced.hostname}}} by {{gpu_ir}}")
    assert devices == {("gpu_ir:ir-4101",): 3.0, ("gpu_ir:ir-4102",): 9.0, ("gpu_ir:none",): 2.0}
    slices = _scalar(sandbox, f"sum:gpufarm.gpu.processes{{host:{sliced.hostname},ir:ir-4101}} by {{gpu_uuid}}")
    assert len(slices) == 3 and all(v == 1.0 for v in slices.values())
    idle = _scalar(sandbox, "sum:gpufarm.ir.gpus_idle{gpu_ir:ir-4103}")
    assert idle == {(): 8.0}  # assigned but nothing runs there: the reclaim signal
    per_container = _scalar(
        sandbox, f"sum:gpufarm.container.processes{{host:{sliced.hostname}}} by {{gpu_ir,container_id}}"
    )
    assert {g[0] for g in per_container} == {"gpu_ir:ir-4101", "gpu_ir:ir-4102", "gpu_ir:none"}
    assert len({g[1] for g in per_container}) == 3  # one container per job on the shared node
    farm.release(sliced.hostname, gpus=["0/3", "0/4", "1"])
    _steps(farm, sandbox, 1)
    # Only the last cycle (15 s ago; the one before is 30 s ago).
    now_devices = _scalar(sandbox, f"sum:gpufarm.ir.gpus{{host:{sliced.hostname}}} by {{gpu_ir}}", window=20)
    assert ("gpu_ir:ir-4102",) not in now_devices and now_devices[("gpu_ir:none",)] == 11.0


def test_a_workload_change_shows_up_as_idle_held(farm: SimulatedFarm, sandbox: Sandbox) -> None:
    node = next(n for n in farm.nodes if n.spec.environment == "onprem-hpc" and n.spec.profile == "busy")
    farm.assign(node.hostname, 4200)
    farm.set_profile(node.hostname, "idle-held", gpus=[0, 1])
    _steps(farm, sandbox, 2)
    values = _scalar(sandbox, "sum:gpufarm.ir.gpus_idle_held{gpu_ir:ir-4200}")
    assert values == {(): 2.0}
    assert _scalar(sandbox, "sum:gpufarm.ir.gpus_busy{gpu_ir:ir-4200}") == {(): 6.0}
    with pytest.raises(ValueError, match="profile must be one of"):
        farm.set_profile(node.hostname, "sleepy")
    with pytest.raises(ValueError, match="no simulated host"):
        farm.assign("nope", 1)


def test_background_cycles_push_on_their_own(sandbox: Sandbox, sandbox_url: str) -> None:
    hosts = [HostSpec("gpu-bg-01", "aws-cloud", "c1", "H100", 2, profile="busy")]
    farm = simulate_hosts(hosts, sandbox_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, interval=0.05, register=False)
    try:
        deadline = time.monotonic() + 10
        while "gpufarm.gpu.utilization" not in sandbox.metrics.metric_names() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        farm.stop()
    assert "gpufarm.gpu.utilization" in sandbox.metrics.metric_names()


def _agent_env(sandbox_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DD_", "GPUFARM_"))}
    env.update(GPUFARM_DATADOG_HOST=sandbox_url, DD_API_KEY=DEFAULT_DD_API_KEY, DD_APP_KEY=DEFAULT_DD_APP_KEY)
    return env


def test_the_agent_executable_sends_and_registers(sandbox: Sandbox, sandbox_url: str) -> None:
    args = [
        str(AGENT),
        "--fake",
        str(FIXTURES / "tiny.yaml"),
        "--once",
        "--hostname",
        "gpu-cli-01",
        "--environment",
        "onprem-hpc",
    ]
    done = subprocess.run(args, env=_agent_env(sandbox_url), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "gpufarm:managed" in sandbox.hosts.tags_for("gpu-cli-01")
    now = sandbox.clock.now()
    groups = sandbox.metrics.query_series(
        "avg:gpufarm.gpu.utilization{host:gpu-cli-01} by {gpu_ir}", now - 120, now + 60
    )
    assert {g.group_tags for g in groups} == {("gpu_ir:ir-70",), ("gpu_ir:none",)}
    assert "DD_API_KEY" not in done.stderr and DEFAULT_DD_API_KEY not in done.stderr


def test_dogstatsd_datagrams_reach_a_local_agent() -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    port = receiver.getsockname()[1]
    args = [str(AGENT), "--fake", str(FIXTURES / "tiny.yaml"), "--once", "--dogstatsd", f"127.0.0.1:{port}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DD_")}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # The agent has exited: every datagram it sent is already queued on the socket.
    lines: list[str] = []
    receiver.setblocking(False)
    try:
        while True:
            lines += receiver.recv(65535).decode().split("\n")
    except BlockingIOError:
        pass
    finally:
        receiver.close()
    util = [line for line in lines if line.startswith("gpufarm.gpu.utilization:")]
    assert len(util) == 2 and all("|g|#" in line and "gpu_ir:" in line for line in util)
    assert any(line.startswith("gpufarm.node.gpus:2.0|g|#") for line in lines)


def test_the_local_hook_starts_background_nodes_and_returns_their_stop(sandbox: Sandbox, sandbox_url: str) -> None:
    from types import SimpleNamespace

    from gpufarm_sandbox.simfarm import local_nodes_hook

    hosts = ("gpu-aws-001", "gpu-hpc-002", "gpu-slc-003")

    def registered() -> bool:
        return all(GpuHost.from_tags(h, sandbox.hosts.tags_for(h)) for h in hosts)

    stop = local_nodes_hook(3, interval=0.05)(SimpleNamespace(url=sandbox_url, sandbox=sandbox))
    try:
        deadline = time.monotonic() + 10
        while not registered() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop()
    assert registered()
    with pytest.raises(ValueError, match="--nodes"):
        local_nodes_hook(0)
