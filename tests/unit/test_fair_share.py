"""Fair share (gpufarm.core.leases.ordering, fair_share, config.scheduling): a pool's queue ordered by each team's
GPU-hours over the window against its share, ties by age, every position saying why; FIFO unchanged."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, ask_hpc

from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.config.scheduling import QueuePolicy
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.leases import fair_share, terms
from gpufarm.core.leases.ordering import FIFO, Order, Standing
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

NLP = "U0000000001"
VIS = "U0000000002"
OPS = "U0000000OPS"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

FAIR_YAML = (
    FARM_YAML.replace("hpc: {H100: {gpus: 8, hard_limit: 16}}", "hpc: {H100: {gpus: 16, hard_limit: 16}}")
    .replace("hpc: {H100: {gpus: 0, hard_limit: 8}}", "hpc: {H100: {gpus: 16, hard_limit: 16}}")
    .replace(
        "idle: {grace_minutes: 60}",
        "idle: {grace_minutes: 60}\nscheduling:\n  environments:\n    hpc: {queue: fair-share}",
    )
)


def _lease(ir: int, team: str, phase: Phase = Phase.WAITING, **values: object) -> Allocation:
    state = State.STABLE if phase in (Phase.ALLOCATED, Phase.IDLE_WARNED) else State.ACTIVE
    fields = {"incident_id": f"i{ir}", "ir": ir, "title": "t", "state": state, "phase": phase, "team": team}
    return Allocation.model_validate({**fields, "environment": "hpc", "gpu_model": "H100", "gpu_count": 8, **values})


# ---- the ordering, pure ------------------------------------------------------------------------------------------


def test_fifo_serves_by_age_and_says_so() -> None:
    queue = [_lease(7, "vision"), _lease(3, "nlp"), _lease(5, "nlp")]
    assert [a.ir for a in FIFO.ranked(queue)] == [3, 5, 7]
    assert [a.ir for a in FIFO.ahead(queue[0], queue)] == [3, 5]
    spot = terms.position(queue[0], queue)
    assert str(spot) == "3rd of 3 waiting for H100: first come, first served"


def test_fair_share_serves_the_team_furthest_below_its_share_first_ties_by_age() -> None:
    order = Order(
        QueuePolicy.FAIR_SHARE,
        7,
        {"nlp": Standing("nlp", 140.0, 300.0), "vision": Standing("vision", 290.0, 300.0)},
    )
    queue = [_lease(3, "vision"), _lease(5, "nlp"), _lease(4, "nlp"), _lease(2, "audio")]
    # nlp (140/300) before vision (290/300); nlp's two by age; audio has no share here: last.
    assert [a.ir for a in order.ranked(queue)] == [4, 5, 3, 2]
    assert str(terms.position(queue[0], queue, order)) == (
        "3rd of 4 waiting for H100: vision used 290 of its 300 GPU-hour share this week; nlp (ahead) used 140 of 300"
    )
    assert order.why(queue[2], order.ranked(queue)) == "nlp used 140 of its 300 GPU-hour share this week"
    assert order.standing("audio").ratio == math.inf
    assert "has no quota share here" in order.why(queue[3], order.ranked(queue))
    # vision's IR-3 waits behind nlp's newer IR-4 and IR-5: fair share put them ahead.
    wait = order.waiting_reason(queue[0], order.ranked(queue), behind=True)
    assert wait.code.value == "queued-fair-share" and wait.sentence.startswith("3rd of 4 waiting for H100; others")
    # nlp's IR-4 waits behind nobody newer: the pool is full.
    assert order.waiting_reason(queue[2], order.ranked(queue), behind=False).code.value == "queued-capacity"


def test_window_hours_take_the_part_of_the_accrued_hours_inside_the_window() -> None:
    # Held 8 GPUs for 8 days ending 2 days ago (1,536 GPU-hours); a 7-day window holds its last 5 days: 960.
    ended = _lease(
        1,
        "nlp",
        Phase.RECLAIMED,
        state=State.RESOLVED,
        allocated_at=T0 - timedelta(days=10),
        hours_held=1536.0,
        hours_until=T0 - timedelta(days=2),
    )
    assert fair_share.window_hours(ended, T0 - timedelta(days=7), T0) == pytest.approx(960.0)
    # A live lease accrues the stretch since its last accrual: 8 GPUs for 24 h, all inside.
    live = _lease(2, "nlp", Phase.ALLOCATED, allocated_at=T0 - timedelta(hours=24), host_gpus={"hpc-0": 8})
    assert fair_share.window_hours(live, T0 - timedelta(days=7), T0) == pytest.approx(192.0)
    assert fair_share.window_hours(_lease(3, "nlp"), T0 - timedelta(days=7), T0) == 0.0  # never allocated


def test_a_teams_share_is_its_quota_part_of_the_pool_over_the_window() -> None:
    farm = parse_farm(FAIR_YAML)
    start = T0 - timedelta(days=7)
    standings = fair_share.standings_of(
        farm, environment="hpc", gpu_model="H100", leases=[], start=start, now=T0, capacity=16
    )
    # Both teams have 16 of 32 quota GPUs: half of 16 GPUs over 168 h each.
    assert standings["nlp"] == Standing("nlp", 0.0, 8 * 168.0)
    assert standings["vision"] == Standing("vision", 0.0, 8 * 168.0)


# ---- the configuration ------------------------------------------------------------------------------------------


def test_the_queue_policy_is_fifo_unless_a_pool_says_fair_share() -> None:
    farm = parse_farm(FAIR_YAML)
    assert farm.scheduling.pool("hpc").queue is QueuePolicy.FAIR_SHARE
    assert farm.scheduling.pool("cloud").queue is QueuePolicy.FIFO
    assert farm.scheduling.pool("hpc").usage_window_days == 7
    assert farm.scheduling.pool("hpc").unapprovable_withdraw_hours == 24
    with pytest.raises(FarmConfigError, match="'nowhere' is not an environment"):
        parse_farm(FAIR_YAML.replace("    hpc: {queue: fair-share}", "    nowhere: {queue: fair-share}"))
    for bad in ("{queue: lottery}", "{usage_window_days: 0}", "{usage_window_days: 91}"):
        with pytest.raises(FarmConfigError):
            parse_farm(FAIR_YAML.replace("{queue: fair-share}", bad))


# ---- the pool serves its queue in that order --------------------------------------------------------------------


@pytest.fixture
def farm() -> Iterator[tuple[GpuFarm, FakeIncidents, FakeClock]]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FAIR_YAML))
    yield svc, incidents, clock


def _state(svc: GpuFarm, ir: int) -> Phase:
    return svc.allocation(ir).phase


def test_a_fair_share_pool_serves_the_team_that_used_less_first(farm: tuple[GpuFarm, FakeIncidents, FakeClock]) -> None:
    svc, incidents, clock = farm
    nlp_lease = ask_hpc(svc, incidents, NLP, 8, 30, team="nlp")
    clock.advance(hours=72)  # nlp has held 8 GPUs for 3 days: 576 GPU-hours
    vision_lease = ask_hpc(svc, incidents, VIS, 8, 14, team="vision")
    nlp_waiting = ask_hpc(svc, incidents, NLP, 8, 7, team="nlp")
    vision_waiting = ask_hpc(svc, incidents, VIS, 8, 7, team="vision")  # newer, but vision used far less
    assert [_state(svc, ir) for ir in (nlp_lease, vision_lease, nlp_waiting, vision_waiting)] == [
        Phase.ALLOCATED,
        Phase.ALLOCATED,
        Phase.WAITING,
        Phase.WAITING,
    ]
    listed = svc.list_allocations("all", OPS).text
    assert "1st of 2 waiting for H100: vision used 0 of its 1344 GPU-hour share this week" in listed
    assert "2nd of 2 waiting for H100: nlp used 576 of its 1344 GPU-hour share this week; vision (ahead)" in listed
    svc.release(nlp_lease, NLP)
    svc.process(svc.allocation(nlp_lease).incident_id)
    # The newer vision request got the freed hosts; nlp's older one still waits.
    assert _state(svc, vision_waiting) is Phase.ALLOCATED
    assert _state(svc, nlp_waiting) is Phase.WAITING
    assert svc.allocation(nlp_waiting).reason == "queued-capacity"


def test_the_same_requests_in_a_fifo_pool_are_served_oldest_first(
    farm: tuple[GpuFarm, FakeIncidents, FakeClock],
) -> None:
    svc, incidents, clock = farm
    svc.context.farm = parse_farm(FAIR_YAML.replace("{queue: fair-share}", "{queue: fifo}"))
    nlp_lease = ask_hpc(svc, incidents, NLP, 8, 30, team="nlp")
    clock.advance(hours=72)
    ask_hpc(svc, incidents, VIS, 8, 14, team="vision")
    nlp_waiting = ask_hpc(svc, incidents, NLP, 8, 7, team="nlp")
    vision_waiting = ask_hpc(svc, incidents, VIS, 8, 7, team="vision")
    svc.release(nlp_lease, NLP)
    svc.process(svc.allocation(nlp_lease).incident_id)
    assert _state(svc, nlp_waiting) is Phase.ALLOCATED
    assert _state(svc, vision_waiting) is Phase.WAITING
