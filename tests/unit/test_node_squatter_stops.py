"""The node agent carries out the stops gpufarm publishes on its host (gpufarm_node.squatter_stops): SIGTERM to a
real process that squats the named device and started by the episode's start, once; never on an exempt host, never
to a newer process under the same pid, never to the lease's own job, and never without a stop tag."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpufarm_node.enforce.pod_stops import PodStop
from gpufarm_node.fakenode import FakeNode, fake_node
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.sender import DatadogSender
from gpufarm_node.squatter_stops import ProcessStarts, SquatterStopper, StopOrder, stop_orders
from gpufarm_node.squatters import PodRef, Squatter
from gpufarm_node.topology import topology_from_dict

START = 1_700_000_000.0
CYCLE = 15.0


class _Drop:
    encoding = "gzip"

    def post(self, compressed: bytes) -> None:
        return None


class _Tags:
    def __init__(self, tags: list[str]) -> None:
        self.tags = tags

    def get(self) -> tuple[int, bytes, dict[str, str]]:
        return 200, json.dumps({"tags": self.tags}).encode(), {}


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that waits to be stopped."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _node(tmp_path: Path, pid: int, tags: list[str], now: list[float], claims: str = "IR-9") -> FakeNode:
    processes = [{"pid": pid, "gpu": 1, "env": {"GPUFARM_IR": claims}, "workload": "busy"}]
    doc = {"name": "squat", "gpus": [{"model": "H100", "count": 2}], "processes": processes}
    node = fake_node(
        topology_from_dict(doc, seed="squat"),
        tmp_path,
        DatadogSender(_Drop(), "gpu-sq-01", clock=lambda: now[0]),
        hostname="gpu-sq-01",
        environment="onprem-hpc",
        cluster="hpc-a",
        clock=lambda: now[0],
        host_tags=HostTagWatch(_Tags(tags), "gpu-sq-01", clock=lambda: now[0]),
        squatter_kill=os.kill,
    )
    return node


def _device_of(node: FakeNode) -> str:
    node.agent.cycle()
    (found,) = node.agent.builder.squatters
    return found.device


def test_a_real_squatting_process_gets_sigterm_once_the_host_carries_its_stop(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    now = [START]
    tags = ["gpufarm:managed", "ir:ir-5"]
    node = _node(tmp_path, child.pid, tags, now)
    node.agent.start()
    try:
        device = _device_of(node)  # found as a squatter, no stop asked: it runs on
        now[0] += CYCLE
        node.agent.cycle()
        assert child.poll() is None
        tags.append(f"gpufarm_stop:{device}/{int(START) + 60}")
        now[0] += CYCLE
        node.agent.cycle()
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        node.agent.close()


def test_an_exempt_host_the_lease_s_own_job_and_a_later_process_are_never_stopped(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    now = [START]
    tags = ["gpufarm:managed", "ir:ir-5", "gpufarm_exempt:squatters"]
    node = _node(tmp_path, child.pid, tags, now)
    node.agent.start()
    try:
        device = _device_of(node)
        tags.append(f"gpufarm_stop:{device}/{int(START) + 60}")
        for _ in range(2):
            now[0] += CYCLE
            node.agent.cycle()
        assert child.poll() is None  # exempt
        tags.remove("gpufarm_exempt:squatters")
        tags[-1] = f"gpufarm_stop:{device}/{int(START) - 3600}"  # an episode older than the process: a reused pid
        now[0] += CYCLE
        node.agent.cycle()
        assert child.poll() is None
    finally:
        node.agent.close()


def test_only_what_squats_the_named_device_is_signalled_once(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu 0\nbtime 1600000000\n")
    for pid, ticks in ((11, 100), (12, 100), (13, 100)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) S " + " ".join(["0"] * 18) + f" {ticks} 0 0\n")
    killed: list[tuple[int, int]] = []
    evicted: list[list[PodStop]] = []

    class Hook:
        def want(self, stops: Sequence[PodStop]) -> None:
            evicted.append(list(stops))

    stopper = SquatterStopper(
        ProcessStarts(str(tmp_path), ticks=100), kill=lambda pid, sig: killed.append((pid, sig)), evict=Hook()
    )
    dev = "gpu-00000000-0000-4000-8000-000000000001"
    other = "gpu-00000000-0000-4000-8000-000000000002"
    pod = PodRef("ml", "squatter-pod")
    squatters = [
        Squatter(dev, "ir-5", "ir-9", 11),
        Squatter(other, "ir-5", None, 12),  # another device: no stop names it
        Squatter(dev, "ir-5", "ir-5", 13),  # claims the device's lease: never a squatter to stop
        Squatter(dev, "ir-5", "ir-9", pod=pod),
    ]
    tags = ["ir:ir-5", f"gpufarm_stop:{dev}/1600000100", "gpufarm_stop:not-a-device/1", "gpufarm_stop:gpu-1/x"]
    assert stopper.apply(tags, squatters) == [11]
    assert stopper.apply(tags, squatters) == []  # once per process
    # The pod goes to the hook every cycle its stop stands (the hook evicts it once per episode).
    assert killed == [(11, signal.SIGTERM)] and evicted == [[PodStop("ml", "squatter-pod", dev, 1_600_000_100)]] * 2
    assert stop_orders(tags) == [StopOrder(dev, 1_600_000_100)]
    assert len(stop_orders([f"gpufarm_stop:{dev}/{1_600_000_000 + i}" for i in range(40)])) == 16
