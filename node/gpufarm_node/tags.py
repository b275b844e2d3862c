"""The tag contract the agent shares with the gpufarm runtime: inventory keys, IR tag values, normalisation.

The agent ships without the runtime package (no pydantic, no boto3, no Slack on a GPU node), so it carries its
own copy of these few rules; `tests/unit/test_node_tags.py` checks that both sides agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MANAGED_TAG = "gpufarm:managed"
GPU_MODEL_KEY = "gpu_model"
GPU_COUNT_KEY = "gpu_count"
ENVIRONMENT_KEY = "environment"
CLUSTER_KEY = "cluster"
IR_KEY = "ir"
# The schedulable units registration publishes, one host tag each: `gpu_unit:<index>/<uuid>` for a GPU not in MIG
# mode, `gpu_unit:<index>.<gi>/<mig uuid>/<profile>` for each MIG slice (GPU instance `gi`), uuids lowercased.
GPU_UNIT_KEY = "gpu_unit"
# The allocator's assignment of a unit to a lease on a shared host: `gpu_assign:ir-<N>/<uuid>`, one per unit.
GPU_ASSIGN_KEY = "gpu_assign"

_IR_RE = re.compile(r"^\s*(?:ir:)?(?:ir-?)?#?([0-9]{1,9})\s*$", re.IGNORECASE | re.ASCII)


def ir_tag_value(text: str) -> str | None:
    """`IR-123`, `ir-123`, `ir:ir-123`, `#123` or `123` as the tag value `ir-123`; None for anything else."""
    match = _IR_RE.match(text or "")
    if not match or int(match.group(1)) <= 0:
        return None
    return f"ir-{int(match.group(1))}"


def normalize_tag(tag: str) -> str:
    """Datadog's normalisation: lowercase, at most 200 characters, odd characters become `_`."""
    return "".join(ch if ch.isalnum() or ch in "_-:./" else "_" for ch in tag.lower()[:200])


def tag_values(tags: Iterable[str], key: str) -> list[str]:
    """Every value of `key:value` tags, in order."""
    prefix = f"{key}:"
    return [tag[len(prefix) :] for tag in tags if tag.startswith(prefix)]


def registration_tags(
    gpu_model: str, gpu_count: int, environment: str, cluster: str, units: Iterable[str] = ()
) -> list[str]:
    """The tags a node sets on itself so it joins the inventory, with its units' `gpu_unit` tags (unit_tag)."""
    return [
        MANAGED_TAG,
        normalize_tag(f"{GPU_MODEL_KEY}:{gpu_model}"),
        f"{GPU_COUNT_KEY}:{gpu_count}",
        normalize_tag(f"{ENVIRONMENT_KEY}:{environment}"),
        normalize_tag(f"{CLUSTER_KEY}:{cluster}"),
        *dict.fromkeys(units),
    ]


def unit_tag(index: int, uuid: str, gpu_instance: int | None = None, profile: str | None = None) -> str:
    """`gpu_unit:3/gpu-…` for a whole GPU, `gpu_unit:3.1/mig-…/1g.10gb` for GPU instance 1 of GPU 3."""
    label = str(index) if gpu_instance is None else f"{index}.{gpu_instance}"
    parts = [label, uuid.lower(), *([profile] if gpu_instance is not None and profile else [])]
    return normalize_tag(f"{GPU_UNIT_KEY}:{'/'.join(parts)}")


def assignments(tags: Iterable[str]) -> Mapping[str, str]:
    """Unit uuid (lowercased) -> `ir-N` of a host's `gpu_assign` tags; malformed ones skipped, the first one wins."""
    out: dict[str, str] = {}
    for value in tag_values(tags, GPU_ASSIGN_KEY):
        ir_text, sep, uuid = value.partition("/")
        ir = ir_tag_value(ir_text) if ir_text.startswith("ir-") else None
        if sep and ir is not None and uuid and "/" not in uuid:
            out.setdefault(uuid.lower(), ir)
    return out


def host_lease(tags: Iterable[str]) -> str | None:
    """The lease a whole host belongs to: its one `ir:` tag, on a host that carries no `gpu_assign` tag.

    A dedicated host is held whole by one lease, which tags it `ir:` only. A shared host's leases hold units, and the
    allocator names each unit of each lease in a `gpu_assign` tag in the same write as its `ir:` tag: there a
    device no tag assigns belongs to no lease, however few `ir:` tags the host carries (one lease holding 2 of 14
    slices must not be charged the other 12). A host with two `ir:` tags names no lease either.
    """
    tags = list(tags)
    if tag_values(tags, GPU_ASSIGN_KEY):
        return None
    irs = sorted(set(tag_values(tags, IR_KEY)))
    return irs[0] if len(irs) == 1 else None
