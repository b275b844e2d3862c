"""The agent's copy of the tag contract (gpufarm_node.tags) agrees with the runtime's (gpufarm.core)."""

from __future__ import annotations

import pytest

from gpufarm.core.kernel import hosts, ir
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm_node import tags

IR_TEXTS = [
    "IR-123",
    "ir-123",
    "ir:ir-123",
    "#123",
    "123",
    " IR-7 ",
    "IR123",
    "ir:123",
    "IR-0",
    "IR--1",
    "IR-1234567890",
    "IR-12a",
    "",
    "IR-",
    "incident 5",
    "ir-٣",
    "IR-²",
    "0",
    "000042",
    "IR-999999999",
]
TAGS = ["Team:NLP", "env:Onprem HPC", "gpu_model:H100 SXM", "a" * 250, "x/y.z-w:v", "ümlaut:Ä", "tab\there"]


def _runtime_value(text: str) -> str | None:
    try:
        return ir.ir_tag_value(ir.parse_ir(text))
    except ValidationFailed:
        return None


@pytest.mark.parametrize("text", IR_TEXTS)
def test_ir_tag_values_agree(text: str) -> None:
    assert tags.ir_tag_value(text) == _runtime_value(text)


@pytest.mark.parametrize("tag", TAGS)
def test_normalisation_agrees(tag: str) -> None:
    assert tags.normalize_tag(tag) == hosts.normalize_tag(tag)


def test_inventory_keys_agree() -> None:
    assert (tags.MANAGED_TAG, tags.GPU_MODEL_KEY, tags.GPU_COUNT_KEY, tags.ENVIRONMENT_KEY, tags.CLUSTER_KEY) == (
        hosts.MANAGED_TAG,
        hosts.GPU_MODEL_KEY,
        hosts.GPU_COUNT_KEY,
        hosts.ENVIRONMENT_KEY,
        hosts.CLUSTER_KEY,
    )
    assert tags.IR_KEY == hosts.IR_KEY == ir.TAG_KEY
    assert tags.tag_values(["ir:ir-1", "team:a", "ir:ir-2"], "ir") == hosts.tag_values(
        ["ir:ir-1", "team:a", "ir:ir-2"], "ir"
    )


@pytest.mark.parametrize(
    ("model", "count", "env", "cluster"),
    [("H100", 8, "onprem-hpc", "hpc-a"), ("A100 80GB", 4, "Shared Slices", "k8s/shared"), ("L4", 1, "cloud", "x")],
)
def test_a_registered_node_is_what_the_runtime_reads_as_inventory(
    model: str, count: int, env: str, cluster: str
) -> None:
    host = GpuHost.from_tags("gpu-node-01", tags.registration_tags(model, count, env, cluster))
    assert host is not None
    assert (host.gpu_model, host.gpu_count) == (tags.normalize_tag(model).upper(), count)
    assert (host.environment, host.cluster) == (tags.normalize_tag(env), tags.normalize_tag(cluster))


@pytest.mark.parametrize("text", ["ir-٣", "IR-²", "IR-\uff11\uff12"])
def test_only_ascii_digits_make_an_ir(text: str) -> None:
    assert tags.ir_tag_value(text) is None
    assert _runtime_value(text) is None


def test_unit_and_assign_keys_agree() -> None:
    assert (tags.GPU_UNIT_KEY, tags.GPU_ASSIGN_KEY) == (hosts.GPU_UNIT_KEY, hosts.GPU_ASSIGN_KEY)


def _mig_snapshot_units() -> list[str]:
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.nvml.source import NvmlSource
    from gpufarm_node.registration import unit_tags
    from gpufarm_node.topology import load_topology, packaged_topology

    topology = load_topology(packaged_topology("a100-mig-slicing"), seed="t")
    source = NvmlSource(FakeNvml(topology), xid_mode="off")
    source.start()
    try:
        return unit_tags(source.snapshot())
    finally:
        source.close()


def test_a_sliced_nodes_published_units_are_what_the_runtime_schedules() -> None:
    published = _mig_snapshot_units()
    host = GpuHost.from_tags("gpu-slc-01", [*tags.registration_tags("A100", 2, "shared-slices", "k8s"), *published])
    assert host is not None
    assert len(host.units) == len(published) == 14
    assert all(u.is_mig and u.profile == "1g.10gb" and u.uuid and u.uuid.startswith("mig-") for u in host.units)
    assert sorted(hosts.unit_tag(u) for u in host.units) == sorted(published)


@pytest.mark.parametrize(
    ("index", "uuid", "gi", "profile"),
    [
        (0, "GPU-5D4E1C2B-0000-4000-8000-00000000AB01", None, None),
        (7, "gpu-00000000-0000-4000-8000-000000000007", None, None),
        (1, "MIG-1b2c3d4e-0000-4000-8000-0000000000c1", 3, "3g.40gb"),
        (2, "MIG-1b2c3d4e-0000-4000-8000-0000000000c2", 13, "1g.10gb+me"),
    ],
)
def test_a_unit_tag_reads_back_as_the_same_unit(index: int, uuid: str, gi: int | None, profile: str | None) -> None:
    [unit] = hosts.parse_units([tags.unit_tag(index, uuid, gi, profile)])
    assert (unit.index, unit.gi, unit.uuid) == (index, gi, uuid.lower())
    assert unit.profile == (tags.normalize_tag(profile) if profile else None)


def test_assign_tags_read_the_same_on_both_sides() -> None:
    written = [
        hosts.assign_tag("ir-12", "mig-1b2c3d4e-0000-4000-8000-0000000000c1"),
        hosts.assign_tag("ir-13", "gpu-00000000-0000-4000-8000-000000000007"),
        "gpu_assign:ir-14",
        "gpu_assign:bogus/gpu-1",
        "gpu_assign:ir-²/gpu-1",
    ]
    host = GpuHost.from_tags("h", [*tags.registration_tags("A100", 2, "e", "c"), *written])
    assert host is not None
    assert (
        dict(tags.assignments(written))
        == host.assignments
        == {
            "mig-1b2c3d4e-0000-4000-8000-0000000000c1": "ir-12",
            "gpu-00000000-0000-4000-8000-000000000007": "ir-13",
        }
    )


def test_registration_replaces_units_that_are_gone_and_keeps_the_allocators_tags() -> None:
    from gpufarm_node.registration import merge_registration

    old = tags.unit_tag(0, "MIG-1b2c3d4e-0000-4000-8000-0000000000c1", 7, "1g.10gb")
    new = tags.unit_tag(0, "MIG-1b2c3d4e-0000-4000-8000-0000000000d1", 1, "3g.40gb")
    base = tags.registration_tags("A100", 1, "e", "c")
    allocator = ["ir:ir-5", "gpu_assign:ir-5/mig-1b2c3d4e-0000-4000-8000-0000000000c1", "team:nlp"]
    append, replace = merge_registration([*base, old, *allocator], tags.registration_tags("A100", 1, "e", "c", [new]))
    assert append == [] and old not in replace and new in replace
    assert all(t in replace for t in allocator)
    assert merge_registration([*base, new], tags.registration_tags("A100", 1, "e", "c", [new])) == ([], [])


def test_the_runtime_normalises_each_distinct_tag_once_and_answers_the_same() -> None:
    hosts.normalize_tag.cache_clear()
    first = hosts.normalize_tag("Environment:Cloud AWS")
    again = hosts.normalize_tag("Environment:Cloud AWS")
    assert first == again == tags.normalize_tag("Environment:Cloud AWS") == "environment:cloud_aws"
    info = hosts.normalize_tag.cache_info()
    assert (info.misses, info.hits, info.maxsize) == (1, 1, hosts.NORMALIZED_TAGS_KEPT)
