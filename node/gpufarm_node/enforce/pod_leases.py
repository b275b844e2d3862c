"""On a shared (sliced, MIG) Kubernetes pool a taint cannot hold one device of a node for one lease: there each pod's
`gpufarm.io/ir` label is checked against the lease of the device kubelet gave it (pure).

A device's lease is its `gpu_assign:ir-<n>/<uuid>` host tag, or on a host a dedicated lease holds whole, that lease
(gpufarm_node.tags). A device's pod comes from kubelet's pod-resources API, its label from the pod list
(gpufarm_node.attribution.PodResourcesOwners). A pod whose label names another lease than its device's, or none on a
leased device, or one on a device no lease holds, is a mismatch: the data the squatter report is built from. A pod
without a label on a device without a lease is not one here (whether that device is busy is the report's question).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gpufarm_node.attribution import DeviceOwner


@dataclass(frozen=True, slots=True)
class PodMismatch:
    """A pod on a device of another lease (or of none): the device's uuid (lower-case), the pod, both leases."""

    device: str
    namespace: str | None
    pod: str | None
    pod_ir: str | None
    device_ir: str | None


def pod_mismatches(
    owners: Mapping[str, DeviceOwner], assigned: Mapping[str, str], host_ir: str | None = None
) -> list[PodMismatch]:
    """Every device whose pod's lease label differs from the device's lease, sorted by device.

    `owners`: device uuid -> the pod holding it (Attributor.device_owners); `assigned`: lower-case device uuid ->
    `ir-<n>` (HostTagWatch.assignments); `host_ir`: the lease holding the whole host (HostTagWatch.host_ir)."""
    return sorted(_mismatches(owners, assigned, host_ir), key=lambda m: (m.device, m.namespace or "", m.pod or ""))


def _mismatches(
    owners: Mapping[str, DeviceOwner], assigned: Mapping[str, str], host_ir: str | None
) -> Iterator[PodMismatch]:
    for uuid, owner in owners.items():
        if owner.pod is None:
            continue
        device = uuid.lower()
        device_ir = assigned.get(device, host_ir)
        if owner.ir != device_ir:
            yield PodMismatch(device, owner.namespace, owner.pod, owner.ir, device_ir)
