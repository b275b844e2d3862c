"""Choosing hosts for an allocation: whole hosts in dedicated pools, GPU units in shared ones.

Pure functions over the inventory (hosts as their tags describe them) and what live incidents already hold. The
caller serializes allocation per pool; these functions only decide.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufarm.core.config.farm import PoolKind
from gpufarm.core.kernel.hosts import GpuHost


@dataclass(frozen=True)
class Capacity:
    """A host of a pool with the units still free on it."""

    host: GpuHost
    free: int

    @property
    def name(self) -> str:
        """The host name."""
        return self.host.name


def pool_hosts(hosts: Iterable[GpuHost], environment: str, gpu_model: str) -> list[GpuHost]:
    """Inventory hosts of one pool carrying one model, sorted by name for stable choices."""
    model = gpu_model.upper()
    return sorted((h for h in hosts if h.environment == environment and h.gpu_model == model), key=lambda h: h.name)


def free_capacity(
    kind: PoolKind, hosts: Iterable[GpuHost], used: Mapping[str, int], *, holder_ir: str | None = None
) -> list[Capacity]:
    """Free units per host: dedicated hosts are free only without any ir: tag; shared ones have units - used.

    A shared host's units are the GPUs and MIG slices its agent publishes (GpuHost.units; by count for an agent
    that publishes none); which ones a lease gets is gpufarm.core.kernel.units' choice.

    `holder_ir` (an `ir-123` tag value) marks an allocation being retried: hosts already tagged for it count as
    free for it, so a retry after a partial failure converges on the same hosts.
    """
    out: list[Capacity] = []
    for host in hosts:
        irs = host.irs
        if kind is PoolKind.DEDICATED:
            if not irs or (holder_ir is not None and irs == [holder_ir]):
                out.append(Capacity(host, host.gpu_count))
        else:
            free = len(host.units) - used.get(host.name, 0)
            if free > 0:
                out.append(Capacity(host, free))
    return out


def place(
    kind: PoolKind, free: list[Capacity], count: int, prefer: frozenset[str] = frozenset()
) -> dict[str, int] | None:
    """Units to take on each chosen host, or None when the pool cannot hold `count` now.

    `prefer` names hosts already tagged for this allocation (a retry after a partial failure): among equally good
    choices the one reusing them wins, so the retry converges instead of leaving stray tags.
    """
    if count < 1 or sum(c.free for c in free) < count:
        return None
    if kind is PoolKind.DEDICATED:
        return place_dedicated(free, count, prefer)
    return place_shared(free, count, prefer)


def place_dedicated(free: list[Capacity], count: int, prefer: frozenset[str] = frozenset()) -> dict[str, int] | None:
    """Whole hosts: fewest hosts, then least GPUs left unused, one cluster preferred over spanning clusters."""
    best: list[Capacity] | None = None
    for members in _by_cluster(free).values():
        chosen = _fewest_hosts(members, count, prefer)
        if chosen is not None and (best is None or _cost(chosen, count, prefer) < _cost(best, count, prefer)):
            best = chosen
    if best is None:
        # No single cluster can hold it: span clusters, still with the fewest hosts.
        best = _fewest_hosts(free, count, prefer)
    if best is None:
        return None
    # The whole host is held, so the incident records every GPU of it.
    return {c.name: c.host.gpu_count for c in sorted(best, key=lambda c: c.name)}


def place_shared(free: list[Capacity], count: int, prefer: frozenset[str] = frozenset()) -> dict[str, int] | None:
    """GPU units: best fit on one host when possible (keeps big holes for big requests), else fewest hosts."""
    best: list[tuple[Capacity, int]] | None = None
    for members in _by_cluster(free).values():
        chosen = _pack(members, count, prefer)
        if chosen is not None and (best is None or _pack_cost(chosen, prefer) < _pack_cost(best, prefer)):
            best = chosen
    if best is None:
        best = _pack(free, count, prefer)
    if best is None:
        return None
    return {cap.name: units for cap, units in sorted(best, key=lambda item: item[0].name)}


def _by_cluster(free: list[Capacity]) -> dict[str, list[Capacity]]:
    groups: dict[str, list[Capacity]] = defaultdict(list)
    for cap in free:
        groups[cap.host.cluster].append(cap)
    return dict(sorted(groups.items()))


def _fewest_hosts(members: list[Capacity], count: int, prefer: frozenset[str]) -> list[Capacity] | None:
    """Largest hosts first until covered, then swap the last one for the smallest host that still covers."""
    ordered = sorted(members, key=lambda c: (-c.free, c.name not in prefer, c.name))
    chosen: list[Capacity] = []
    total = 0
    for cap in ordered:
        if total >= count:
            break
        chosen.append(cap)
        total += cap.free
    if total < count:
        return None
    before_last = total - chosen[-1].free
    rest = [c for c in ordered if c not in chosen[:-1]]
    fits = [c for c in rest if before_last + c.free >= count]
    chosen[-1] = min(fits, key=lambda c: (c.free, c.name not in prefer, c.name))
    return chosen


def _cost(chosen: list[Capacity], count: int, prefer: frozenset[str]) -> tuple[int, int, int, str]:
    reused = sum(1 for c in chosen if c.name in prefer)
    return (len(chosen), sum(c.free for c in chosen) - count, -reused, min(c.name for c in chosen))


def _pack(members: list[Capacity], count: int, prefer: frozenset[str]) -> list[tuple[Capacity, int]] | None:
    fitting = [c for c in members if c.free >= count]
    if fitting:
        best = min(fitting, key=lambda c: (c.free, c.name not in prefer, c.name))
        return [(best, count)]
    out: list[tuple[Capacity, int]] = []
    left = count
    for cap in sorted(members, key=lambda c: (-c.free, c.name not in prefer, c.name)):
        take = min(cap.free, left)
        out.append((cap, take))
        left -= take
        if left == 0:
            return out
    return None


def _pack_cost(chosen: list[tuple[Capacity, int]], prefer: frozenset[str]) -> tuple[int, int, int, str]:
    leftover = sum(cap.free - units for cap, units in chosen)
    reused = sum(1 for cap, _ in chosen if cap.name in prefer)
    return (len(chosen), leftover, -reused, min(cap.name for cap, _ in chosen))
