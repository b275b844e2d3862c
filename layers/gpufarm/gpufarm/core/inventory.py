"""Host tags that make a host part of the GPU inventory, and the allocation tags gpufarm writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufarm.core.bounded import ascii_digits

MANAGED_TAG = "gpufarm:managed"
GPU_MODEL_KEY = "gpu_model"
GPU_COUNT_KEY = "gpu_count"
ENVIRONMENT_KEY = "environment"
CLUSTER_KEY = "cluster"
PROJECT_KEY = "project"
TEAM_KEY = "team"
IR_KEY = "ir"
# Tags a host carries because an incident holds it; reclaim removes exactly these.
ALLOCATION_KEYS = frozenset({IR_KEY, PROJECT_KEY, TEAM_KEY})


def tag_value(tags: Iterable[str], key: str) -> str | None:
    """The value of the first `key:value` tag, or None."""
    prefix = f"{key}:"
    for tag in tags:
        if tag.startswith(prefix):
            return tag[len(prefix) :]
    return None


def tag_values(tags: Iterable[str], key: str) -> list[str]:
    """Every value of `key:value` tags, in order."""
    prefix = f"{key}:"
    return [tag[len(prefix) :] for tag in tags if tag.startswith(prefix)]


def normalize_tag(tag: str) -> str:
    """Datadog's normalisation: lowercase, at most 200 characters, odd characters become `_`."""
    return "".join(ch if ch.isalnum() or ch in "_-:./" else "_" for ch in tag.lower()[:200])


@dataclass(frozen=True)
class GpuHost:
    """A host of the inventory as its tags describe it."""

    name: str
    gpu_model: str
    gpu_count: int
    environment: str
    cluster: str
    tags: tuple[str, ...] = ()

    @property
    def irs(self) -> list[str]:
        """`ir-123` values of the incidents holding this host."""
        return tag_values(self.tags, IR_KEY)

    @classmethod
    def from_tags(cls, name: str, tags: Iterable[str]) -> GpuHost | None:
        """Build from host tags; None unless the host carries the full set of inventory tags."""
        tag_list = tuple(tags)
        if MANAGED_TAG not in tag_list:
            return None
        model = tag_value(tag_list, GPU_MODEL_KEY)
        count = tag_value(tag_list, GPU_COUNT_KEY)
        env = tag_value(tag_list, ENVIRONMENT_KEY)
        gpus = ascii_digits(count or "")
        if not model or gpus is None or not env:
            return None
        cluster = tag_value(tag_list, CLUSTER_KEY) or "default"
        return cls(name, model.upper(), gpus, env, cluster, tag_list)
