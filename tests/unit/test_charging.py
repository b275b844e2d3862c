"""Charging what is held (issue 11 point 4): dedicated pools count whole hosts against a team's quota."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance import charging
from gpufarm.core.governance.policy import Ask, Verdict, build_request, decide_grant
from gpufarm.core.inventory.placement import Capacity, place_dedicated
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.service import GpuFarm
from gpufarm_node.tags import registration_tags

USER, OPS = "U0000000001", "U0000000OPS"
_ids = itertools.count(1)


def _host(name: str, count: int, env: str = "hpc", model: str = "H100", cluster: str = "c1") -> GpuHost:
    """An inventory host as its node agent registers it."""
    host = GpuHost.from_tags(name, registration_tags(model, count, env, cluster))
    assert host is not None
    return host


def test_one_gpu_on_eight_gpu_hosts_is_charged_the_whole_host_and_says_so() -> None:
    farm = parse_farm(FARM_YAML)
    charged = charging.charge(farm, "hpc", charging.sizes_of([_host("a", 8), _host("b", 8)]), 1)
    assert (charged.asked, charged.charged, charged.hosts) == (1, 8, (8,))
    assert charged.explain() == (
        "1 GPU asked, an 8-GPU host is the smallest unit in hpc: 8 GPUs count against your quota"
    )
    assert charged.wasted_percent == pytest.approx(87.5)


def test_the_smallest_host_that_fits_sets_the_unit_and_big_requests_take_the_fewest_hosts() -> None:
    farm = parse_farm(FARM_YAML)
    hosts = [_host("big", 8), _host("small", 4), _host("small2", 4)]
    assert charging.charge(farm, "hpc", charging.sizes_of(hosts), 3).charged == 4
    assert (
        charging.charge(farm, "hpc", charging.sizes_of(hosts), 8).explain() is None
    )  # a whole host asked: nothing to explain
    twelve = charging.charge(farm, "hpc", charging.sizes_of(hosts), 10)
    assert (twelve.charged, twelve.hosts) == (12, (8, 4))
    assert "the fewest whole hosts in hpc that hold it are 8 + 4 GPUs: 12 GPUs" in (twelve.explain() or "")
    # Shared pools hand out units: charged what is asked. A request nothing can hold is charged what it asks.
    assert charging.charge(farm, "slices", charging.sizes_of(hosts), 1).charged == 1
    assert charging.charge(farm, "hpc", charging.sizes_of(hosts), 40).charged == 40


def test_the_waste_policy_sends_to_operators_or_refuses() -> None:
    text = FARM_YAML.replace(
        "defaults:",
        "charging:\n  waste: operators\n  teams:\n    vision: {waste: refuse, waste_threshold_percent: 80}\ndefaults:",
    )
    farm = parse_farm(text)
    one = charging.charge(farm, "hpc", charging.sizes_of([_host("a", 8)]), 1)
    nlp = decide_grant(Ask("nlp", "hpc", "H100", 1, charge=one), farm, team_used=0, pool_capacity=8)
    assert nlp.verdict is Verdict.NEEDS_OPERATOR
    assert nlp.reason.startswith("1 GPU asked, an 8-GPU host is the smallest unit in hpc: 8 GPUs count")
    assert "7 of the 8 GPUs it holds would sit unused (88 %, over nlp's limit of 50 % in hpc)" in nlp.reason
    vision = decide_grant(Ask("vision", "hpc", "H100", 1, charge=one), farm, team_used=0, pool_capacity=8)
    assert vision.verdict is Verdict.REFUSE and "ask for whole hosts, or use a shared pool" in vision.reason
    four = charging.charge(farm, "hpc", charging.sizes_of([_host("a", 8)]), 4)  # 50 % unused: within vision's 80 %
    assert decide_grant(Ask("vision", "hpc", "H100", 4, charge=four), farm, team_used=0, pool_capacity=8).verdict is (
        Verdict.NEEDS_OPERATOR  # vision's quota is 0: an operator decides, as before charging
    )
    # The default policy allows: charged and granted as the quota allows.
    allow = parse_farm(FARM_YAML)
    granted = decide_grant(Ask("nlp", "hpc", "H100", 1, charge=one), allow, team_used=0, pool_capacity=8)
    assert granted.verdict is Verdict.APPROVE and "within team nlp's quota (8 of 8 H100 in hpc)" in granted.reason


@dataclass
class World:
    svc: GpuFarm
    metrics: FakeMetrics


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock()
    hosts = FakeHosts()
    for i in range(3):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    metrics = FakeMetrics()
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=hosts,
        chat=FakeChat(operators=frozenset({OPS})),
        clock=clock,
        farm=parse_farm(FARM_YAML),
        metrics=metrics,
    )
    yield World(svc, metrics)


def _ask(svc: GpuFarm, count: int) -> str:
    values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
    request = build_request(values, svc.context.farm, requester=USER, channel=None, request_id=f"c-{next(_ids):06d}")
    answer = svc.submit_request(request)
    # The fallback text and what the blocks show (the reason is the context line under the answer).
    shown = [e["text"] for b in answer.blocks for e in ([b["text"]] if "text" in b else b.get("elements", []))]
    return " ".join([answer.text, *shown])


def test_quota_and_gauges_count_held_gpus_not_requested_ones(world: World) -> None:
    svc = world.svc
    first = _ask(svc, 1)
    assert "1 GPU asked, an 8-GPU host is the smallest unit in hpc: 8 GPUs count against your quota" in first
    alloc = svc.allocate(svc.allocation(1))
    assert alloc.action == "allocated" and svc.allocation(1).host_gpus == {"hpc-0": 8}
    # The next in-quota-looking request is not "approved by policy": the team already holds its 8.
    second = _ask(svc, 1)
    assert "Sent to the GPU operators" in second
    assert "team nlp would hold 16 H100 in hpc, beyond its quota of 8" in second
    assert "`nlp` H100 in `hpc`: 8 / 8" in svc.quota("nlp").blocks[0]["text"]["text"]
    svc.publish_gauges()
    assert world.metrics.value("gpufarm.quota.allocated", "team:nlp", "environment:hpc") == 8.0
    assert svc.allocation(2).phase is Phase.REQUESTED


def test_a_charge_from_host_sizes_is_placements_on_the_hosts_themselves() -> None:
    """Placement on an empty pool depends on sizes per cluster, not names: the size census charges the same."""
    farm = parse_farm(FARM_YAML)
    rng = random.Random(11)
    for _ in range(400):
        hosts = [
            _host(f"{cluster}-{size}-{i}", size, cluster=cluster)
            for cluster in rng.sample(["c1", "c2", "c3"], rng.randint(1, 3))
            for size in rng.sample([1, 2, 4, 8, 16], rng.randint(1, 3))
            for i in range(rng.randint(0, 5))
        ]
        asked = rng.randint(1, 48)
        plan = place_dedicated([Capacity(h, h.gpu_count) for h in hosts], asked)
        want = max(asked, sum(plan.values())) if plan else asked
        got = charging.charge(farm, "hpc", charging.sizes_of(hosts), asked)
        assert got.charged == want, (sorted(charging.sizes_of(hosts).items()), asked)
        if plan and len({h.cluster for h in hosts}) == 1:
            assert got.hosts == tuple(sorted(plan.values(), reverse=True))
