"""The agent loop: flush cadence, registration feeding host IRs, drop reporting, surviving a bad cycle."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gpufarm_node.collect import Series
from gpufarm_node.fakenode import fake_node
from gpufarm_node.registration import HostRegistrar
from gpufarm_node.topology import topology_from_dict

START = 1_700_000_000.0


class RecordingSender:
    """Keeps what the agent hands over; reports a drop once."""

    def __init__(self) -> None:
        self.cycles: list[tuple[int, list[Series]]] = []
        self.flushes = 0
        self.drops = {"overflow": 4}
        self.closed = False

    def send(self, series: Any, timestamp: int) -> None:
        self.cycles.append((timestamp, [Series(*row) for row in series]))

    def flush(self) -> bool:
        self.flushes += 1
        return True

    def take_dropped(self) -> dict[str, int]:
        drops, self.drops = self.drops, {}
        return drops

    def close(self) -> None:
        self.closed = True


class TagsApi:
    def __init__(self, tags: list[str]) -> None:
        self.tags = tags

    def get_host_tags(self, *, host_name: str, source: str) -> dict[str, Any]:
        return {"host": host_name, "tags": self.tags}

    def create_host_tags(self, *, host_name: str, body: Any, source: str) -> dict[str, Any]:
        self.tags = self.tags + list(body.tags)
        return {"host": host_name, "tags": list(body.tags)}


def _node(tmp_path: Path, sender: RecordingSender, now: list[float], **kwargs: Any) -> Any:
    topology = topology_from_dict({"gpus": [{"model": "H200", "count": 2}], "processes": [{"pid": 5, "gpu": 0}]})
    node = fake_node(
        topology, tmp_path, sender, hostname="n1", environment="onprem-hpc", clock=lambda: now[0], **kwargs
    )
    node.agent.start()
    return node


def test_flushes_follow_the_flush_interval_and_cycles_are_stamped_with_the_clock(tmp_path: Path) -> None:
    now = [START]
    sender = RecordingSender()
    node = _node(tmp_path, sender, now, flush_interval=60)
    for _ in range(6):
        node.agent.cycle()
        now[0] += 15
    assert [t for t, _ in sender.cycles] == [int(START) + 15 * i for i in range(6)]
    assert sender.flushes == 2  # at t=0 and t=60
    node.agent.close()
    assert sender.closed


def test_drops_reported_by_the_sender_appear_in_the_next_cycle(tmp_path: Path) -> None:
    now = [START]
    sender = RecordingSender()
    node = _node(tmp_path, sender, now)
    node.agent.cycle()
    dropped = [s for s in sender.cycles[0][1] if s.metric == "gpufarm.node.points_dropped"]
    assert [(s.value, s.tags[-1]) for s in dropped] == [(4.0, "drop_reason:overflow")]
    now[0] += 15
    node.agent.cycle()
    assert not [s for s in sender.cycles[1][1] if s.metric == "gpufarm.node.points_dropped"]


def test_registration_runs_when_due_and_the_host_ir_attributes_unclaimed_gpus(tmp_path: Path) -> None:
    now = [START]
    api = TagsApi(["ir:ir-77"])
    registrar = HostRegistrar(api, "n1", "onprem-hpc", "default", clock=lambda: now[0])
    sender = RecordingSender()
    node = _node(tmp_path, sender, now, registrar=registrar)
    node.agent.cycle()
    assert "gpufarm:managed" in api.tags and "gpu_model:h200" in api.tags and "gpu_count:2" in api.tags
    irs = {
        t
        for s in sender.cycles[0][1]
        if s.metric == "gpufarm.gpu.utilization"
        for t in s.tags
        if t.startswith("gpu_ir:")
    }
    assert irs == {"gpu_ir:ir-77"}


def test_run_survives_a_failing_cycle_and_stops_on_request(tmp_path: Path) -> None:
    now = [START]
    sender = RecordingSender()
    node = _node(tmp_path, sender, now)
    calls = {"n": 0}
    real_cycle = node.agent.cycle

    def cycle(at: float | None = None) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("driver hiccup")
        if calls["n"] == 3:
            stop.set()
        return real_cycle(at)

    node.agent.cycle = cycle
    stop = threading.Event()
    thread = threading.Thread(target=node.agent.run, args=(stop, 0.01))
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive() and calls["n"] == 3 and len(sender.cycles) == 2


def test_settle_process_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    # In a child: the collector's settings are the whole process's, and this test process is not an agent.
    code = (
        "import gc; from gpufarm_node.agent import GC_YOUNG_THRESHOLD, settle_process; "
        "older = gc.get_threshold()[1:]; settle_process(); "
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count(); "
        "assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *older), gc.get_threshold()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
