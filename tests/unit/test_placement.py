"""Host placement: whole hosts in dedicated pools, GPU units in shared pools."""

from __future__ import annotations

from gpufarm.core.config.farm import PoolKind
from gpufarm.core.inventory.placement import Capacity, free_capacity, place, pool_hosts
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm_node.tags import registration_tags


def host(
    name: str, count: int, cluster: str = "a", env: str = "hpc", model: str = "H100", irs: tuple[str, ...] = ()
) -> GpuHost:
    tags = [*registration_tags(model, count, env, cluster), *(f"ir:{v}" for v in irs)]
    built = GpuHost.from_tags(name, tags)
    assert built is not None
    return built


def caps(*hosts: GpuHost) -> list[Capacity]:
    return [Capacity(h, h.gpu_count) for h in hosts]


def test_dedicated_prefers_one_big_host() -> None:
    hosts = caps(host("n1", 4), host("n2", 8), host("n3", 4))
    assert place(PoolKind.DEDICATED, hosts, 8) == {"n2": 8}


def test_dedicated_fewest_hosts_then_least_waste() -> None:
    hosts = caps(host("n1", 8), host("n2", 8), host("n3", 4), host("n4", 2))
    # 10 GPUs: two hosts either way; 8 + 2 wastes nothing, 8 + 8 would waste 6.
    assert place(PoolKind.DEDICATED, hosts, 10) == {"n1": 8, "n4": 2}
    # 3 GPUs fit one 4-GPU host better than an 8-GPU one.
    assert place(PoolKind.DEDICATED, hosts, 3) == {"n3": 4}


def test_dedicated_prefers_a_single_cluster() -> None:
    hosts = caps(host("a1", 8, "a"), host("b1", 8, "b"), host("b2", 8, "b"))
    assert place(PoolKind.DEDICATED, hosts, 16) == {"b1": 8, "b2": 8}


def test_dedicated_spans_clusters_only_when_it_must() -> None:
    hosts = caps(host("a1", 8, "a"), host("b1", 8, "b"))
    assert place(PoolKind.DEDICATED, hosts, 16) == {"a1": 8, "b1": 8}


def test_not_enough_capacity_is_none() -> None:
    assert place(PoolKind.DEDICATED, caps(host("n1", 8)), 9) is None
    assert place(PoolKind.SHARED, [], 1) is None
    assert place(PoolKind.DEDICATED, caps(host("n1", 8)), 0) is None


def test_tagged_hosts_are_not_free_in_dedicated_pools_except_for_their_own_ir() -> None:
    hosts = [host("n1", 8, irs=("ir-1",)), host("n2", 8), host("n3", 8, irs=("ir-2", "ir-3"))]
    assert [c.name for c in free_capacity(PoolKind.DEDICATED, hosts, {})] == ["n2"]
    assert [c.name for c in free_capacity(PoolKind.DEDICATED, hosts, {}, holder_ir="ir-1")] == ["n1", "n2"]


def test_shared_best_fit_then_packs() -> None:
    hosts = [host("s1", 8, env="slices", model="A100"), host("s2", 4, env="slices", model="A100")]
    free = free_capacity(PoolKind.SHARED, hosts, {"s1": 5, "s2": 1})
    assert [(c.name, c.free) for c in free] == [("s1", 3), ("s2", 3)]
    assert place(PoolKind.SHARED, free, 2) == {"s1": 2}
    assert place(PoolKind.SHARED, free, 5) == {"s1": 3, "s2": 2}
    assert place(PoolKind.SHARED, free, 7) is None


def test_shared_hosts_can_hold_several_irs() -> None:
    hosts = [host("s1", 8, env="slices", model="A100", irs=("ir-1", "ir-2"))]
    free = free_capacity(PoolKind.SHARED, hosts, {"s1": 6})
    assert place(PoolKind.SHARED, free, 2) == {"s1": 2}


def test_pool_hosts_filters_and_sorts() -> None:
    hosts = [host("z", 8), host("a", 8), host("c", 8, env="cloud"), host("d", 8, model="A100")]
    assert [h.name for h in pool_hosts(hosts, "hpc", "h100")] == ["a", "z"]
