"""The agent's copy of the tag contract (gpufarm_node.tags) agrees with the runtime's (gpufarm.core)."""

from __future__ import annotations

import pytest

from gpufarm.core import inventory, ir
from gpufarm.core.errors import ValidationFailed
from gpufarm.core.inventory import GpuHost
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
    assert tags.normalize_tag(tag) == inventory.normalize_tag(tag)


def test_inventory_keys_agree() -> None:
    assert (tags.MANAGED_TAG, tags.GPU_MODEL_KEY, tags.GPU_COUNT_KEY, tags.ENVIRONMENT_KEY, tags.CLUSTER_KEY) == (
        inventory.MANAGED_TAG,
        inventory.GPU_MODEL_KEY,
        inventory.GPU_COUNT_KEY,
        inventory.ENVIRONMENT_KEY,
        inventory.CLUSTER_KEY,
    )
    assert tags.IR_KEY == inventory.IR_KEY == ir.TAG_KEY
    assert tags.tag_values(["ir:ir-1", "team:a", "ir:ir-2"], "ir") == inventory.tag_values(
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
