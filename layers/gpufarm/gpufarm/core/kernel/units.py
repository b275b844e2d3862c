"""Which GPUs and MIG slices a lease holds on a shared pool: the units chosen, recorded, tagged and shown.

On a shared pool a host is split between leases, so a count per host is not enough: the agent could not tell whose
slice is whose. The allocator picks specific free units (the ones the host's agent publishes as `gpu_unit` tags,
or GPUs 0..n-1 by index for an agent that publishes none), records them in the incident's `gpufarm_devices` field
(`host=<unit>`, one entry per unit), and puts one `gpu_assign:ir-<N>/<uuid>` tag per unit on the host next to
its `ir:` tag (units known by index only get none: their agent reads no assignment); reclaim removes exactly
those, and the sync's repair restores or removes them like `ir:` tags.

A unit is free when no other live lease records it and no other IR's `gpu_assign` tag names it. Pure functions:
the caller reads and writes; the tags they become are gpufarm.core.kernel.tags'.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufarm.core.kernel.hosts import (
    MAX_UNITS,
    UNKNOWN_PROFILE,
    GpuHost,
    GpuUnit,
)
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.model import Allocation

# The device plugin's resource for whole GPUs; MIG slices are `nvidia.com/mig-<profile>` (the "mixed" strategy).
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

# host -> the units held there, in unit order.
Devices = dict[str, tuple[GpuUnit, ...]]


# -- the incident field -------------------------------------------------------------------------------------------


def encode_devices(devices: Mapping[str, Sequence[GpuUnit]]) -> list[str]:
    """`{"h": (unit 0.1, unit 0.2)}` -> `["h=0.1/mig-…/1g.10gb", "h=0.2/mig-…/1g.10gb"]`, by host then unit."""
    return [f"{host}={unit.tag_value()}" for host, units in sorted(devices.items()) for unit in units]


def decode_devices(entries: Iterable[str]) -> Devices:
    """The inverse of encode_devices; malformed entries (and a unit listed twice) are skipped."""
    out: dict[str, list[GpuUnit]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        host, sep, value = entry.partition("=")
        unit = GpuUnit.parse(value) if sep and host else None
        if unit is None or (host, unit.id) in seen or len(out[host]) >= MAX_UNITS:
            continue
        seen.add((host, unit.id))
        out[host].append(unit)
    return {host: tuple(units) for host, units in sorted(out.items()) if units}


def lease_devices(alloc: Allocation) -> Devices:
    """The units a lease records, per host (empty for a dedicated lease or one allocated before units were kept)."""
    return decode_devices(alloc.devices)


# -- what is held -------------------------------------------------------------------------------------------------


@dataclass
class Holding:
    """What other leases hold on one host: units by id, and a count of units recorded by count only."""

    ids: set[str] = field(default_factory=set)
    # Units of leases that recorded no devices (allocated before units were recorded): which ones is unknown.
    anonymous: int = 0

    @property
    def used(self) -> int:
        """How many of the host's units are taken."""
        return len(self.ids) + self.anonymous


def holdings(
    hosts: Iterable[GpuHost], holders: Iterable[Allocation], exclude_ir: int | None = None
) -> dict[str, Holding]:
    """Per host, the units other leases hold: what their incidents record and what other IRs' tags name."""
    me = ir_tag_value(exclude_ir) if exclude_ir is not None else None
    out: dict[str, Holding] = defaultdict(Holding)
    for alloc in holders:
        if alloc.ir == exclude_ir:
            continue
        recorded = lease_devices(alloc)
        for name, count in alloc.host_gpus.items():
            units = recorded.get(name)
            if units:
                out[name].ids.update(u.id for u in units)
            else:
                out[name].anonymous += count
    for host in hosts:
        # A tag whose lease's field the search does not show yet (index lag, a half-finished allocation).
        tagged = {unit for unit, ir in host.assignments.items() if ir != me}
        if tagged:
            out[host.name].ids |= tagged
    return dict(out)


def free_units(host: GpuHost, holding: Holding | None) -> list[GpuUnit]:
    """The host's units no other lease holds by id (units held by count only still reduce what may be taken)."""
    held = holding.ids if holding is not None else set()
    return [u for u in host.units if u.id not in held]


# -- choosing -------------------------------------------------------------------------------------------------------


def choose_units(free: Sequence[GpuUnit], count: int, prefer: Iterable[str] = ()) -> tuple[GpuUnit, ...] | None:
    """`count` of the free units, or None when there are fewer.

    Slices of one GPU go together: the fewest physical GPUs, best fit first, so a GPU with most of its slices free
    stays whole for a bigger request and one lease's slices share a GPU. Units in `prefer` (tagged for this lease by
    an earlier attempt) win ties, so a retry converges on the same units.
    """
    if count < 1 or len(free) < count:
        return None
    wanted = set(prefer)
    by_gpu: dict[int, list[GpuUnit]] = defaultdict(list)
    for unit in free:
        by_gpu[unit.index].append(unit)
    groups = [
        sorted(units, key=lambda u: (u.id not in wanted, -1 if u.gi is None else u.gi)) for units in by_gpu.values()
    ]

    def rank(units: list[GpuUnit]) -> tuple[int, int, int]:
        return (len(units), -sum(u.id in wanted for u in units), units[0].index)

    fitting = [g for g in groups if len(g) >= count]
    if fitting:
        return tuple(_ordered(min(fitting, key=rank)[:count]))
    chosen: list[GpuUnit] = []
    for units in sorted(groups, key=lambda g: (-len(g), rank(g))):
        chosen += units[: count - len(chosen)]
        if len(chosen) == count:
            break
    return tuple(_ordered(chosen))


def assign_units(
    hosts: Mapping[str, GpuHost],
    plan: Mapping[str, int],
    held: Mapping[str, Holding],
    ir: int,
) -> Devices | None:
    """The units to take on each planned host for the lease `ir`; None when a host cannot give its share by unit."""
    me = ir_tag_value(ir)
    out: Devices = {}
    for name, count in sorted(plan.items()):
        host = hosts.get(name)
        if host is None:
            return None
        mine = [unit for unit, owner in host.assignments.items() if owner == me]
        chosen = choose_units(free_units(host, held.get(name)), count, mine)
        if chosen is None:
            return None
        out[name] = chosen
    return out


def _ordered(units: Iterable[GpuUnit]) -> list[GpuUnit]:
    return sorted(units, key=lambda u: (u.index, -1 if u.gi is None else u.gi, u.id))


# -- telling the researcher -------------------------------------------------------------------------------------


def cuda_visible_devices(units: Sequence[GpuUnit]) -> str:
    """`0,1` for whole GPUs (their indexes), `MIG-…,MIG-…` for slices (their UUIDs as NVML spells them)."""
    return ",".join(nvml_uuid(u.uuid) if u.is_mig and u.uuid else str(u.index) for u in units)


def nvml_uuid(uuid: str) -> str:
    """A lowercased tag uuid as NVML and CUDA_VISIBLE_DEVICES spell it: `MIG-…` / `GPU-…`."""
    prefix, _, rest = uuid.partition("-")
    return f"{prefix.upper()}-{rest}"


def kubernetes_resources(units: Iterable[GpuUnit]) -> dict[str, int]:
    """The NVIDIA device plugin's resources for these units: `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.

    A slice whose profile the agent could not read names no resource (none would be right).
    """
    out: dict[str, int] = {}
    for unit in units:
        if unit.is_mig and unit.profile in (None, UNKNOWN_PROFILE):
            continue
        resource = f"{MIG_RESOURCE_PREFIX}{unit.profile}" if unit.is_mig else GPU_RESOURCE
        out[resource] = out.get(resource, 0) + 1
    return dict(sorted(out.items()))
