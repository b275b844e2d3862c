"""Everything the agent emits, on every sample topology, must match spec/metrics.yaml (and the spec must be used)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufarm_node.catalog import COUNT, GAUGE, METRICS
from gpufarm_node.collect import CollectOptions, Series
from gpufarm_node.fakenode import fake_node
from gpufarm_node.sender import DatadogSender, IntakeError, series_json
from gpufarm_node.topology import TOPOLOGY_DIR, load_topology

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "spec" / "metrics.yaml").read_text())
TOPOLOGIES = sorted(TOPOLOGY_DIR.glob("*.yaml"))
START = 1_700_000_000.0


class _Outage:
    """An intake that is always down, so the sender's buffer overflows and drops get reported."""

    encoding = "gzip"

    def post(self, compressed: bytes) -> None:
        raise IntakeError(0, "ConnectionRefusedError", retry=True)


def _run(topology: Path, workdir: Path, cycles: int = 9) -> Iterator[Series]:
    now = [START]
    node = fake_node(
        load_topology(topology, seed="spec"),
        workdir,
        DatadogSender(_Outage(), "node-1", max_points=1000, clock=lambda: now[0]),
        hostname="node-1",
        environment="onprem-hpc",
        cluster="hpc-a",
        clock=lambda: now[0],
        options=CollectOptions(per_process=True),
        pcie=True,
        event_queue_size=1,
        reinit_after=60.0,
    )
    node.agent.start()
    try:
        for _ in range(cycles):
            node.agent.cycle()
            yield from node.agent.last_series
            now[0] += 15
    finally:
        node.agent.close()


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Series]]:
    """Series per topology over nine 15 s cycles (a GPU is lost and recovered in `faults`)."""
    return {t.stem: list(_run(t, tmp_path_factory.mktemp(t.stem))) for t in TOPOLOGIES}


def _expand(names: list[str]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= set(SPEC["tagsets"].get(name, [name]))
    return out


def _problems(series: Series) -> list[str]:
    spec = SPEC["metrics"].get(series.metric)
    if spec is None:
        return [f"{series.metric} is not declared"]
    problems = []
    keys = [t.partition(":")[0] for t in series.tags]
    values = dict(t.partition(":")[::2] for t in series.tags)
    if len(keys) != len(set(keys)):
        problems.append(f"{series.metric} repeats a tag key: {series.tags}")
    required = _expand(spec["tags"].get("required", []))
    allowed = required | _expand(spec["tags"].get("optional", []))
    for tag, extra in SPEC["required_when"].items():
        if tag in series.tags:
            required |= _expand(extra)
    for key in keys:
        pattern = SPEC["tags"].get(key)
        if pattern is None or key not in allowed:
            problems.append(f"{series.metric} carries undeclared tag {key}")
        elif not re.search(pattern["value"], values[key]):
            problems.append(f"{series.metric}: {key}:{values[key]} does not match {pattern['value']}")
    missing = required - set(keys)
    if missing:
        problems.append(f"{series.metric} lacks {sorted(missing)}")
    modes = spec.get("device_modes")
    if modes is not None and values.get("gpu_slicing_mode") not in modes:
        problems.append(f"{series.metric} emitted for mode {values.get('gpu_slicing_mode')}, spec says {modes}")
    return problems


@pytest.mark.parametrize("topology", [t.stem for t in TOPOLOGIES])
def test_every_series_follows_the_spec(emitted: dict[str, list[Series]], topology: str) -> None:
    series = emitted[topology]
    assert len(series) > 100
    problems = sorted({p for s in series for p in _problems(s)})
    assert problems == [], "\n".join(problems[:20])


def test_every_declared_metric_is_emitted_somewhere(emitted: dict[str, list[Series]]) -> None:
    seen = {s.metric for series in emitted.values() for s in series}
    assert set(SPEC["metrics"]) - seen == set()


def test_payload_types_and_units_are_the_spec_s(emitted: dict[str, list[Series]]) -> None:
    kinds = {"gauge": GAUGE, "count": COUNT}
    for series in {s.metric: s for batch in emitted.values() for s in batch}.values():
        body = series_json(series, int(START), "node-1", 15)
        spec = SPEC["metrics"][series.metric]
        assert body["type"] == kinds[spec["type"]], series.metric
        assert body.get("unit") == spec["unit"], series.metric
        assert ("interval" in body) == (spec["type"] == "count"), series.metric


def test_catalogue_and_spec_agree() -> None:
    kinds = {"gauge": GAUGE, "count": COUNT}
    declared = {name: (kinds[m["type"]], m["unit"]) for name, m in SPEC["metrics"].items()}
    assert {name: (d.type, d.unit) for name, d in METRICS.items()} == declared


def test_names_use_our_prefix_and_every_tag_used_is_declared() -> None:
    for name, metric in SPEC["metrics"].items():
        assert name.startswith(SPEC["prefix"]) and not name.startswith(("nvml.", "dcgm.", "gpu."))
        assert metric["description"]
        for key in _expand(metric["tags"].get("required", []) + metric["tags"].get("optional", [])):
            assert key in SPEC["tags"], f"{name} uses undeclared tag {key}"
