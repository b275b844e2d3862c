"""Topology files: what they may say, and the clear error for what they may not."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufarm_node.topology import TOPOLOGY_DIR, load_topology, packaged_topology, topology_from_dict
from gpufarm_node.topology_spec import Profile, TopologyError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "node"


@pytest.mark.parametrize(
    "path", sorted(TOPOLOGY_DIR.glob("*.yaml")) + sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_shipped_and_fixture_topology_loads(path: Path) -> None:
    topology = load_topology(path)
    assert topology.gpus and len({g.uuid for g in topology.gpus}) == len(topology.gpus)


def test_counts_expand_and_uuids_are_stable_per_seed_and_distinct_across_seeds() -> None:
    data = {"gpus": [{"model": "H100", "count": 7}, {"model": "H100", "mig": {"profile": "1g.10gb", "count": 7}}]}
    a, b, c = (
        topology_from_dict(data, seed="n1"),
        topology_from_dict(data, seed="n1"),
        topology_from_dict(data, seed="n2"),
    )
    assert len(a.gpus) == 8 and [g.index for g in a.gpus] == list(range(8))
    assert a.gpus[7].mig is not None and len(a.gpus[7].mig_uuids) == 7
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in c.gpus}


def test_profiles() -> None:
    square = Profile("square", high=90, low=10, period=10, duty=0.3)
    assert [square.at(t) for t in (0, 2.9, 3, 9.9, 10)] == [90, 90, 10, 10, 90]
    ramp = Profile("ramp", start=0, end=100, duration=50)
    assert [ramp.at(t) for t in (0, 25, 50, 99)] == [0, 50, 100, 100]
    steps = Profile("steps", steps=((0, 5), (10, 50), (20, 0)))
    assert [steps.at(t) for t in (0, 9, 10, 25)] == [5, 5, 50, 0]


def test_workload_presets_and_explicit_profiles() -> None:
    topology = topology_from_dict(
        {
            "gpus": [{"model": "A100"}],
            "processes": [
                {"pid": 2, "gpu": 0, "workload": "idle-held"},
                {"pid": 3, "gpu": 0, "memory_mib": 1000, "sm": {"kind": "constant", "value": 33}},
            ],
        }
    )
    held, explicit = topology.processes
    assert held.sm.at(0) == 0 and held.memory_mib.at(0) == pytest.approx(81920 * 0.45)
    assert (explicit.memory_mib.at(5), explicit.sm.at(5)) == (1000, 33)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": []}, "at least one GPU"),
        ({"gpus": [{"model": "X9"}]}, "unknown model"),
        ({"gpus": [{"model": "H100", "mig": {"profile": "4g.40gb", "count": 2}}]}, "7 compute slices"),
        ({"gpus": [{"model": "H100", "mig": {"profile": "big", "count": 1}}]}, "not a MIG profile"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2, "gpu": 3}]}, "GPU 3 does not exist"),
        (
            {
                "gpus": [{"model": "H100", "mig": {"profile": "1g.10gb", "count": 2}}],
                "processes": [{"pid": 2, "gpu": 0}],
            },
            "name a slice",
        ),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2, "gpu": 0, "mig": 1}]}, "no MIG slice"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2}, {"pid": 2}]}, "used twice"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2, "pod": "nope"}]}, "no pod named"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2, "workload": "sleepy"}]}, "unknown workload"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2, "sm": {"kind": "sine"}}]}, "not constant"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 2, "start": 5, "end": 5}]}, "end must come after"),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": "2"}]}, "pid must be an integer"),
        ({"gpus": [{"model": "H100"}], "errors": [{"function": "open", "error": "Unknown"}]}, "NVML function"),
        ({"gpus": [{"model": "H100"}], "errors": [{"function": "*", "error": "Oops"}]}, "is not one of"),
        ({"gpus": [{"model": "H100"}], "pods": [{"name": "p", "uid": "UPPER"}]}, "lowercase UUID"),
        ({"gpus": [{"model": "H100"}], "sample_period": 0}, "sample_period"),
        ("just text", "must be a mapping"),
    ],
)
def test_malformed_topologies_name_what_is_wrong(data: object, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        topology_from_dict(data)


def test_unknown_packaged_topology_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="h100x8-mig"):
        packaged_topology("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(bad)
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")
