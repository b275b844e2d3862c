"""The tags series carry beyond their device's own: the IR (`gpu_ir`, and `ir` when there is one), a container's
and its pod's, the source of a slice's activity, and the 0/1 flags of clock event reasons."""

from __future__ import annotations

from functools import lru_cache

from gpufarm_node.attribution import DeviceOwner, Workload
from gpufarm_node.catalog import CLOCK_EVENT_REASONS
from gpufarm_node.tags import normalize_tag

NO_IR = "none"


@lru_cache(maxsize=1024)
def reason_flags(bits: int) -> tuple[float, ...]:
    """The 0/1 value of each clock event reason for a bitmask (a GPU's mask changes rarely)."""
    return tuple(1.0 if bits & bit else 0.0 for bit, _ in CLOCK_EVENT_REASONS)


def with_source(tags: tuple[str, ...], source: str) -> tuple[str, ...]:
    """A slice activity's tags with where the value comes from (`gpm` or `processes`)."""
    return (*tags, f"activity_source:{source}")


@lru_cache(maxsize=4096)
def ir_tags(ir: str) -> tuple[str, ...]:
    """`gpu_ir` always (the agent's attribution, which hosts never carry); `ir` too when there is one."""
    return (f"gpu_ir:{ir}",) if ir == NO_IR else (f"gpu_ir:{ir}", f"ir:{ir}")


def container_tags(workload: Workload | None) -> tuple[str, ...]:
    """A process's container and pod tags; none outside a container."""
    if workload is None or workload.container_id is None:
        return ()
    pod = pod_tags(workload.pod_uid, workload.pod_name, workload.namespace, workload.container_name)
    return (f"container_id:{workload.container_id}", *pod)


def owner_tags(owner: DeviceOwner) -> tuple[str, ...]:
    """The pod tags of the container that holds a device (pod-resources)."""
    return pod_tags(owner.pod_uid, owner.pod, owner.namespace, owner.container)


def pod_tags(uid: str | None, name: str | None, namespace: str | None, container: str | None) -> tuple[str, ...]:
    """Kubernetes tags, Datadog's names, for whatever of the pod is known."""
    pairs = (("pod_uid", uid), ("pod_name", name), ("kube_namespace", namespace), ("kube_container_name", container))
    return tuple(f"{key}:{value}" for key, value in pairs if value)


def identity_tags(environment: str, cluster: str) -> tuple[str, ...]:
    """Tags on every series of a node."""
    return (normalize_tag(f"environment:{environment}"), normalize_tag(f"cluster:{cluster}"))
