"""The host's tags read every cycle: devices attributed from `gpu_assign` tags from the next cycle on, reads paced
by Datadog's rate-limit headers, and a cycle that never fails because the read did."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpufarm_node.collect import Series
from gpufarm_node.fakenode import FakeNode, fake_node
from gpufarm_node.hosttags import HostTagWatch, RateLimit
from gpufarm_node.topology import topology_from_dict

HOST = "gpu-shared-01"
START = 1_800_000_000.0
# Two whole H100 and one in two MIG slices; nothing carries GPUFARM_IR except pid 7002.
TOPOLOGY = {
    "name": "shared",
    "gpus": [{"model": "H100", "count": 2}, {"model": "H100", "mig": {"profile": "3g.40gb", "count": 2}}],
    "processes": [
        {"pid": 7000, "gpu": 0, "workload": "busy", "memory_mib": 4000},
        {"pid": 7001, "gpu": 2, "mig": 0, "workload": "busy"},
        {
            "pid": 7002,
            "gpu": 1,
            "docker": "auto",
            "workload": "busy",
            "env": {"GPUFARM_IR": "IR-99"},
            "memory_mib": 2000,
        },
    ],
}


class ScriptedTags:
    """A tags endpoint whose answers the test sets: status, tags and rate-limit headers."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.status = 200
        self.headers: dict[str, str] = {}
        self.fail: Exception | None = None
        self.calls = 0

    def get(self) -> tuple[int, bytes, Mapping[str, str]]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        headers = {name.lower(): value for name, value in self.headers.items()}
        return self.status, json.dumps({"host": HOST, "tags": self.tags}).encode(), headers


class Keep:
    """A sender that keeps nothing but the last cycle."""

    def send(self, series: Any, timestamp: int) -> None:
        """Ignore."""

    def flush(self) -> bool:
        """Nothing pending."""
        return True

    def take_dropped(self) -> dict[str, int]:
        """No drops."""
        return {}

    def close(self) -> None:
        """Nothing held."""


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[FakeNode, ScriptedTags, list[float]]]:
    now = [START]
    tags = ScriptedTags()
    watch = HostTagWatch(tags, HOST, clock=lambda: now[0])
    built = fake_node(
        topology_from_dict(TOPOLOGY, seed=HOST),
        tmp_path,
        Keep(),
        hostname=HOST,
        clock=lambda: now[0],
        host_tags=watch,
    )
    built.agent.start()
    yield built, tags, now
    built.agent.close()


def _cycle(built: FakeNode, now: list[float]) -> list[Series]:
    now[0] += 15
    built.agent.cycle()
    return built.agent.last_series


def _uuids(built: FakeNode) -> tuple[str, str, str]:
    """(GPU 0, GPU 1, the first MIG slice of GPU 2), lower-cased as tags spell them."""
    snap = built.source.snapshot()
    return snap.gpus[0].uuid.lower(), snap.gpus[1].uuid.lower(), snap.gpus[2].migs[0].uuid.lower()


def _ir_of(series: list[Series], metric: str, uuid: str) -> set[str]:
    return {
        t.partition(":")[2]
        for s in series
        if s.metric == metric and f"gpu_uuid:{uuid}" in s.tags
        for t in s.tags
        if t.startswith("gpu_ir:")
    }


def test_devices_take_the_lease_of_their_gpu_assign_tag_from_the_next_cycle(node: Any) -> None:
    built, tags, now = node
    gpu0, gpu1, slice0 = _uuids(built)
    series = _cycle(built, now)
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"none"}
    assert _ir_of(series, "gpufarm.gpu.memory.used", slice0) == {"none"}

    # The allocator tags the host between two cycles: the very next cycle attributes the devices.
    tags.tags = ["ir:ir-41", "ir:ir-42", f"gpu_assign:ir-41/{gpu0}", f"gpu_assign:ir-42/{slice0}"]
    series = _cycle(built, now)
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"ir-41"}
    assert _ir_of(series, "gpufarm.gpu.mig.activity", slice0) == {"ir-42"}
    assert _ir_of(series, "gpufarm.gpu.idle_state", slice0) == {"ir-42"}
    # Two `ir:` tags (a shared host) name no host IR: an unassigned device is attributed by its processes.
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu1) == {"ir-99"}
    gpu1_container = [s for s in series if s.metric == "gpufarm.container.processes" and f"gpu_uuid:{gpu1}" in s.tags]
    assert {t for s in gpu1_container for t in s.tags if t.startswith("gpu_ir:")} == {"gpu_ir:ir-99"}
    rollups = {t for s in series if s.metric == "gpufarm.ir.gpus" for t in s.tags if t.startswith("gpu_ir:")}
    assert {"gpu_ir:ir-41", "gpu_ir:ir-42", "gpu_ir:ir-99"} <= rollups

    # Released: the next cycle drops the attribution.
    tags.tags = []
    series = _cycle(built, now)
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"none"}


def test_an_assigned_device_keeps_its_lease_when_a_process_claims_another(node: Any) -> None:
    built, tags, now = node
    _, gpu1, _ = _uuids(built)
    tags.tags = ["ir:ir-7", f"gpu_assign:ir-7/{gpu1}"]
    series = _cycle(built, now)
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu1) == {"ir-7"}
    # The process's own IR is its own: its container series say ir-99, the device's series ir-7.
    container = [s for s in series if s.metric == "gpufarm.container.memory.used" and f"gpu_uuid:{gpu1}" in s.tags]
    assert {t for s in container for t in s.tags if t.startswith("gpu_ir:")} == {"gpu_ir:ir-99"}


def test_the_single_ir_tag_of_a_dedicated_host_attributes_every_device(node: Any) -> None:
    built, tags, now = node
    gpu0, _, slice0 = _uuids(built)
    tags.tags = ["ir:ir-5"]
    series = _cycle(built, now)
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"ir-5"}
    assert _ir_of(series, "gpufarm.gpu.mig.activity", slice0) == {"ir-5"}


# The GPU-slicing pool's hosts (topologies/a100-mig-slicing.yaml: 2 x A100, each in 7 x 1g.10gb) with a busy
# process on every slice and no IR of their own: what one lease holding 2 of the 14 slices is charged.
SLICED = {
    "name": "sliced",
    "gpus": [{"model": "A100", "count": 2, "mig": {"profile": "1g.10gb", "count": 7}}],
    "processes": [{"pid": 8000 + 7 * g + m, "gpu": g, "mig": m, "workload": "busy"} for g in (0, 1) for m in range(7)],
}


def test_a_shared_host_charges_its_one_lease_only_the_slices_assigned_to_it(tmp_path: Path) -> None:
    now = [START]
    tags = ScriptedTags()
    built = fake_node(
        topology_from_dict(SLICED, seed=HOST),
        tmp_path,
        Keep(),
        hostname=HOST,
        clock=lambda: now[0],
        host_tags=HostTagWatch(tags, HOST, clock=lambda: now[0]),
    )
    built.agent.start()
    try:
        slices = [m.uuid.lower() for g in built.source.snapshot().gpus for m in g.migs]
        assert len(slices) == 14
        tags.tags = ["ir:ir-2", f"gpu_assign:ir-2/{slices[0]}", f"gpu_assign:ir-2/{slices[8]}"]
        series = _cycle(built, now)
    finally:
        built.agent.close()
    by_slice = {uuid: _ir_of(series, "gpufarm.gpu.mig.activity", uuid) for uuid in slices}
    assert {u for u, irs in by_slice.items() if irs == {"ir-2"}} == {slices[0], slices[8]}
    # The 12 busy slices no tag assigns are unattributed use, not the lease's.
    assert all(by_slice[u] == {"none"} for u in slices if u not in (slices[0], slices[8]))
    charged = [s for s in series if s.metric == "gpufarm.ir.gpus" and "gpu_ir:ir-2" in s.tags]
    assert charged and all(s.value == 2.0 for s in charged)


def test_mig_slices_report_process_presence_without_gpm(node: Any) -> None:
    built, _, now = node
    _, _, slice0 = _uuids(built)
    series = _cycle(built, now)
    activity = [s for s in series if s.metric == "gpufarm.gpu.mig.activity"]
    assert len(activity) == 2
    by_uuid = {next(t for t in s.tags if t.startswith("gpu_uuid:")): s for s in activity}
    busy = by_uuid[f"gpu_uuid:{slice0}"]
    assert "activity_source:processes" in busy.tags or "activity_source:gpm" in busy.tags
    empty = next(s for key, s in by_uuid.items() if key != f"gpu_uuid:{slice0}")
    if "activity_source:processes" in empty.tags:
        assert empty.value == 0.0
    if "activity_source:processes" in busy.tags:
        assert busy.value == 100.0


def test_low_remaining_budget_slows_reads_until_the_window_turns_and_a_429_keeps_the_last_tags(node: Any) -> None:
    built, tags, now = node
    gpu0, _, _ = _uuids(built)
    tags.tags = [f"gpu_assign:ir-3/{gpu0}"]
    # Plenty left: a read every cycle.
    tags.headers = {"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "900", "X-RateLimit-Reset": "40"}
    _cycle(built, now)
    _cycle(built, now)
    assert tags.calls == 2
    # Under a tenth of the window left: the next read waits for the window to turn (40 s plus this host's
    # place in the spread), and the cycles in between keep the last tags.
    tags.headers = {
        "X-RateLimit-Limit": "1000",
        "X-RateLimit-Remaining": "50",
        "X-RateLimit-Reset": "40",
        "X-RateLimit-Period": "60",
    }
    _cycle(built, now)
    calls = tags.calls
    series = _cycle(built, now)
    assert tags.calls == calls
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"ir-3"}
    for _ in range(4):
        _cycle(built, now)
    assert tags.calls > calls
    watch = built.agent.host_tags
    assert watch is not None and watch.stats["slowed"] >= 1
    # The budget is back: after the wait this read set, every cycle again.
    tags.headers = {"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "990", "X-RateLimit-Reset": "30"}
    for _ in range(5):
        _cycle(built, now)
    calls = tags.calls
    _cycle(built, now)
    _cycle(built, now)
    assert tags.calls == calls + 2

    # Throttled: 429 keeps the tags and waits the whole Reset.
    tags.status, tags.headers = (
        429,
        {"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "50"},
    )
    calls = tags.calls
    series = _cycle(built, now)
    assert tags.calls == calls + 1 and watch.stats["throttled"] == 1
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"ir-3"}
    tags.status, tags.headers = 200, {}
    _cycle(built, now)
    _cycle(built, now)
    assert tags.calls == calls + 1  # 30 s later: still inside the 50 s
    for _ in range(3):
        _cycle(built, now)
    assert tags.calls > calls + 1


def test_a_failing_read_never_fails_the_cycle_and_backs_off(node: Any) -> None:
    built, tags, now = node
    gpu0, _, _ = _uuids(built)
    tags.tags = [f"gpu_assign:ir-8/{gpu0}"]
    _cycle(built, now)
    tags.fail = OSError("connection refused")
    calls = tags.calls
    for _ in range(6):
        series = _cycle(built, now)
        assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"ir-8"}
    # 5 s, then 10 s, 20 s, 40 s between tries: fewer tries than cycles.
    assert calls < tags.calls < calls + 6
    tags.fail = None
    tags.status = 500
    _cycle(built, now)
    tags.status = 200
    tags.tags = []
    for _ in range(12):
        series = _cycle(built, now)
    assert _ir_of(series, "gpufarm.gpu.memory.used", gpu0) == {"none"}


def test_malformed_answers_and_assignment_tags_change_nothing() -> None:
    now = [0.0]
    tags = ScriptedTags()
    watch = HostTagWatch(tags, HOST, clock=lambda: now[0])
    good = "gpu-0e6a0b7a-3d2d-5c8c-9a3f-7c1b2d4e5f60"
    tags.tags = [f"gpu_assign:ir-4/{good}", "gpu_assign:ir-x/gpu-1", "gpu_assign:nothing", "ir:ir-4"]
    assert watch.poll()
    # A host carrying assignments is shared: its one `ir:` tag names no lease for the whole host.
    assert watch.assignments == {good: "ir-4"} and watch.host_ir is None

    class Garbage(ScriptedTags):
        def get(self) -> tuple[int, bytes, Mapping[str, str]]:
            return 200, b"<html>not json</html>", {"X-RateLimit-Remaining": "lots"}

    watch._transport = Garbage()
    now[0] += 100
    assert not watch.poll()
    assert watch.assignments == {good: "ir-4"}
    assert RateLimit.from_headers({"x-ratelimit-remaining": "²"}).remaining is None
