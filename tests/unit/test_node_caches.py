"""What the agent caches between cycles (tag tuples, container plans, the attributor's joined workloads, the
sender's value texts) never changes what it emits: the same node run with every cache emptied before each cycle
emits the same series, cycle after cycle, on every built-in topology."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufarm_node import series_tags
from gpufarm_node.collect import CollectOptions, Series
from gpufarm_node.fakenode import FakeNode, fake_node
from gpufarm_node.sender import DatadogSender
from gpufarm_node.topology import TOPOLOGY_DIR, load_topology

TOPOLOGIES = sorted(TOPOLOGY_DIR.glob("*.yaml"))
START = 1_700_000_000.0
CYCLES = 8


class Quiet:
    """A sender that drops everything (the series are compared, not sent)."""

    def send(self, series: object, timestamp: int) -> None:
        """Ignore."""

    def flush(self) -> bool:
        """Nothing pending."""
        return True

    def take_dropped(self) -> dict[str, int]:
        """No drops."""
        return {}

    def close(self) -> None:
        """Nothing held."""


def _node(topology: Path, workdir: Path, now: list[float], *, per_process: bool) -> FakeNode:
    return fake_node(
        load_topology(topology, seed="caches"),
        workdir,
        Quiet(),
        hostname="node-1",
        clock=lambda: now[0],
        options=CollectOptions(per_process=per_process),
        pcie=True,
    )


def _forget(node: FakeNode) -> None:
    """Every cache the agent keeps across cycles, emptied: the next cycle works everything out afresh."""
    node.agent.builder._tag_cache.clear()
    attributor = node.attributor
    attributor._cache.clear()
    attributor._joined.clear()
    series_tags.ir_tags.cache_clear()
    series_tags.reason_flags.cache_clear()


def _comparable(series: list[Series]) -> list[tuple[str, float, tuple[str, ...]]]:
    return [tuple(s) for s in series if s.metric != "gpufarm.node.cycle_time"]  # type: ignore[misc]


@pytest.mark.parametrize("per_process", [False, True])
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda p: p.stem)
def test_series_are_the_same_with_warm_and_with_emptied_caches(
    topology: Path, per_process: bool, tmp_path: Path
) -> None:
    now = [START]
    warm = _node(topology, tmp_path / "warm", now, per_process=per_process)
    cold = _node(topology, tmp_path / "cold", now, per_process=per_process)
    warm.agent.start()
    cold.agent.start()
    try:
        for cycle in range(CYCLES):
            warm.agent.cycle()
            _forget(cold)
            cold.agent.cycle()
            assert _comparable(warm.agent.last_series) == _comparable(cold.agent.last_series), f"cycle {cycle}"
            now[0] += 15
    finally:
        warm.agent.close()
        cold.agent.close()


class Kept:
    encoding = "gzip"

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def post(self, compressed: bytes) -> None:
        self.bodies.append(compressed)


def test_each_value_is_written_as_its_float_s_repr_and_zeros_alike() -> None:
    import gzip

    intake = Kept()
    sender = DatadogSender(intake, "node-1", clock=lambda: START)
    values: list[float] = [0, -0.0, 0.0, 1e-7, 81_920.0, 0.1 + 2, 1e16, 12.5]
    tags = [("environment:e", f"gpu_uuid:gpu-{i}") for i in range(len(values))]
    for cycle in range(2):
        sender.send(
            [Series("gpufarm.gpu.utilization", v, t) for v, t in zip(values, tags, strict=True)], int(START) + cycle
        )
    assert sender.flush()
    body = gzip.decompress(intake.bodies[0]).decode()
    written = [point["value"] for series in json.loads(body)["series"] for point in series["points"]]
    assert written == [v for v in values for _ in range(2)]
    texts = body.split('"value":')[1:]
    assert [t.partition("}")[0] for t in texts] == [repr(float(v) + 0.0) for v in values for _ in range(2)]
