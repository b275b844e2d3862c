"""Charging what is held: on dedicated pools a request counts against its team's quota by the whole hosts it takes.

A dedicated host is held whole (gpufarm.core.inventory.placement), so a 1-GPU request on a pool of 8-GPU hosts keeps 8
GPUs from everyone else; charging the 1 asked would let a team hold far beyond its quota while its figures said
otherwise. A granted lease that holds hosts is charged what its incident records (`host_gpus`: whole hosts on
dedicated pools, units on shared ones); one still waiting for hosts is charged what placement would take in its
pool (the smallest set of whole hosts that fits, the smallest host when one is enough). Shared pools charge the
units asked. Placement's choice on an empty pool depends on the sizes of its hosts per cluster, never on which
host is which, so a charge is computed from those sizes (gpufarm.core.context.reads.Reads.host_sizes counts them without
listing the pool). The farm YAML's `charging:` section may send to operators, or refuse, a request that would waste
most of a host (FarmConfig.charging; per environment and team overrides).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpufarm.core.config.farm import FarmConfig, PoolKind, WasteAction
from gpufarm.core.inventory.placement import Capacity, place_dedicated
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation

# Phases whose incident records the hosts it holds.
# Hosts of a pool's model per (cluster, GPUs per host).
HostSizes = Mapping[tuple[str, int], int]


@dataclass(frozen=True)
class Charge:
    """What a request asks for and what it counts against its team's quota."""

    environment: str
    asked: int
    charged: int
    # Sizes of the whole hosts it would take (dedicated pools; empty on shared ones or when nothing fits).
    hosts: tuple[int, ...] = ()

    @property
    def wasted_percent(self) -> float:
        """The share of the charged GPUs the request did not ask for."""
        return 100.0 * (self.charged - self.asked) / self.charged if self.charged > self.asked else 0.0

    def explain(self) -> str | None:
        """`1 GPU asked, an 8-GPU host is the smallest unit in onprem-hpc: 8 GPUs count against your quota`."""
        if self.charged <= self.asked:
            return None
        asked = f"{self.asked} GPU{'s' if self.asked != 1 else ''} asked"
        if len(self.hosts) == 1:
            unit = f"{_article(self.hosts[0])} {self.hosts[0]}-GPU host"
            return (
                f"{asked}, {unit} is the smallest unit in {self.environment}: "
                f"{self.charged} GPUs count against your quota"
            )
        sizes = " + ".join(str(size) for size in self.hosts)
        return (
            f"{asked}, the fewest whole hosts in {self.environment} that hold it are {sizes} GPUs: "
            f"{self.charged} GPUs count against your quota"
        )


def sizes_of(hosts: Iterable[GpuHost]) -> dict[tuple[str, int], int]:
    """Hosts per (cluster, GPUs per host)."""
    out: dict[tuple[str, int], int] = {}
    for host in hosts:
        out[(host.cluster, host.gpu_count)] = out.get((host.cluster, host.gpu_count), 0) + 1
    return out


def charge(farm: FarmConfig, environment: str, sizes: HostSizes, asked: int) -> Charge:
    """What a request for `asked` GPUs is charged in a pool whose model's hosts have these sizes (all of the pool)."""
    env = farm.environments.get(environment)
    if env is None or env.kind is not PoolKind.DEDICATED or asked < 1:
        return Charge(environment, asked, asked)
    # The pool as if empty: the charge is what the request takes, not what happens to be free now.
    plan = place_dedicated(_empty_pool(environment, sizes, asked), asked)
    if plan is None:
        return Charge(environment, asked, asked)  # it can never fit; the policy refuses it on its own terms
    taken = tuple(sorted(plan.values(), reverse=True))
    return Charge(environment, asked, max(asked, sum(taken)), taken)


def held(alloc: Allocation, farm: FarmConfig, sizes_of_pool: Callable[[str, str], HostSizes]) -> int:
    """GPUs a granted lease counts against its team: what it holds, or what it will take once allocated."""
    if alloc.phase in HOLDING and alloc.host_gpus:
        return sum(alloc.host_gpus.values())
    env = alloc.environment or ""
    pool = farm.environments.get(env)
    if pool is None or pool.kind is not PoolKind.DEDICATED:
        return alloc.gpu_count
    return charge(farm, env, sizes_of_pool(env, (alloc.gpu_model or "").upper()), alloc.gpu_count).charged


def waste_verdict(farm: FarmConfig, team: str, charged: Charge) -> tuple[WasteAction, str] | None:
    """The waste policy's action and its reason when `charged` leaves more of its hosts unused than allowed."""
    if charged.charged <= charged.asked:
        return None
    policy = farm.charging.policy(charged.environment, team)
    if policy.waste is WasteAction.ALLOW or charged.wasted_percent <= policy.waste_threshold_percent:
        return None
    unused = charged.charged - charged.asked
    reason = (
        f"{unused} of the {charged.charged} GPUs it holds would sit unused ({charged.wasted_percent:.0f} %, "
        f"over {team}'s limit of {policy.waste_threshold_percent:g} % in {charged.environment})"
    )
    return policy.waste, reason


def _empty_pool(environment: str, sizes: HostSizes, asked: int) -> list[Capacity]:
    """Stand-ins for a pool's hosts, every GPU free: as many of each size as a placement of `asked` could take.

    Placement takes the largest hosts until covered, then swaps the last for the smallest that still covers, so it
    never takes more than ceil(asked / size) hosts of one size from a cluster, nor needs more to choose. Names only
    break ties between equal choices, which charge the same; between clusters of equal cost they may name other
    sizes in the explanation (16 + 8 where the pool's names would pick 12 + 12), never another charge.
    """
    out: list[Capacity] = []
    for (cluster, gpus), hosts in sorted(sizes.items()):
        if gpus < 1:
            continue  # holds nothing: never part of a placement
        for i in range(min(hosts, -(-asked // gpus))):
            host = GpuHost(f"{cluster}/{gpus}/{i:06d}", "", gpus, environment, cluster)
            out.append(Capacity(host, gpus))
    return out


def _article(number: int) -> str:
    """`an` before a number said with a vowel sound (8, 11, 18, 80-89), else `a`."""
    text = str(number)
    return "an" if text.startswith("8") or (len(text) in (2, 5) and text.startswith(("11", "18"))) else "a"
