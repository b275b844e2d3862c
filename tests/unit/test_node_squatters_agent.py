"""The real agent on a fake host finds squatters from what it reads: the host's tags, /proc, the pod list."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import Any

from gpufarm_node.collect import Series
from gpufarm_node.fakenode import FakeNode, fake_node
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.sender import DatadogSender
from gpufarm_node.squatters import Squatter, user_tag_value
from gpufarm_node.topology import topology_from_dict

START = 1_700_000_000.0
CYCLE = 15.0


class _Drop:
    encoding = "gzip"

    def post(self, compressed: bytes) -> None:
        return None


class _Tags:
    """The host's user tags, as Datadog answers them."""

    def __init__(self, tags: list[str]) -> None:
        self.tags = tags

    def get(self) -> tuple[int, bytes, dict[str, str]]:
        return 200, json.dumps({"tags": self.tags}).encode(), {}


def _node(tmp_path: Path, processes: list[dict[str, Any]], tags: list[str], now: list[float]) -> FakeNode:
    doc = {"name": "squat", "gpus": [{"model": "H100", "count": 2}], "processes": processes}
    return fake_node(
        topology_from_dict(doc, seed="squat"),
        tmp_path,
        DatadogSender(_Drop(), "gpu-sq-01", clock=lambda: now[0]),
        hostname="gpu-sq-01",
        environment="onprem-hpc",
        cluster="hpc-a",
        clock=lambda: now[0],
        host_tags=HostTagWatch(_Tags(tags), "gpu-sq-01", clock=lambda: now[0]),
    )


def _own_user() -> str:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = ""
    return user_tag_value(name, uid)


def _squatter_series(series: list[Series]) -> list[Series]:
    return [s for s in series if s.metric == "gpufarm.process.squatter"]


def test_a_squatter_started_between_cycles_is_reported_by_the_next_one_with_its_user(tmp_path: Path) -> None:
    now = [START]
    processes = [
        {"pid": 4001, "gpu": 0, "env": {"GPUFARM_IR": "IR-5"}, "workload": "busy"},
        # Claims another lease, on GPU 1 of the host IR-5 holds, from 20 s in (between the second and third cycles).
        {"pid": 4002, "gpu": 1, "env": {"GPUFARM_IR": "IR-9"}, "workload": "busy", "start": 20.0},
    ]
    node = _node(tmp_path, processes, ["gpufarm:managed", "ir:ir-5"], now)
    node.agent.start()
    try:
        seen: list[list[Squatter]] = []
        for _ in range(3):
            node.agent.cycle()
            seen.append(list(node.agent.builder.squatters))
            now[0] += CYCLE
        series = node.agent.last_series
    finally:
        node.agent.close()
    assert seen[0] == [] and seen[1] == []
    (found,) = seen[2]
    assert (found.pid, found.device_ir, found.claimed_ir) == (4002, "ir-5", "ir-9")
    (row,) = _squatter_series(series)
    assert "pid:4002" in row.tags and "gpu_ir:ir-5" in row.tags and "claimed_ir:ir-9" in row.tags
    # The fake's /proc entries are this test's process's, so the squatter runs as its user.
    assert f"user:{_own_user()}" in row.tags
    counts = {t for s in series if s.metric == "gpufarm.gpu.squatters" and s.value == 1.0 for t in s.tags}
    assert "gpu_ir:ir-5" in counts


def test_a_hostile_environment_claims_nothing_and_reaches_no_tag(tmp_path: Path) -> None:
    now = [START]
    hostile = "IR-5\n<!channel> *bold* `x` <https://evil.example|click>"
    processes = [{"pid": 4101, "gpu": 0, "env": {"GPUFARM_IR": hostile}, "workload": "busy"}]
    # A host no lease holds: every busy process on it is a squatter, whatever its environment says.
    node = _node(tmp_path, processes, ["gpufarm:managed"], now)
    node.agent.start()
    try:
        node.agent.cycle()
        series = node.agent.last_series
        squatters = list(node.agent.builder.squatters)
    finally:
        node.agent.close()
    assert [(s.pid, s.claimed_ir) for s in squatters] == [(4101, None)]
    for row in _squatter_series(series):
        assert all(ch not in tag for tag in row.tags for ch in "<>*`|\n !")
        assert "claimed_ir:none" in row.tags
