"""Lending idle quota and preemption on notice (gpufarm.core.config.lending, gpufarm.core.leases.lending,
gpufarm.core.leases.preemption)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.config.lending import Borrow
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

NLP, VISION, SPEECH = "U0000000001", "U0000000002", "U0000000003"
OPS = "U0000000OPS"
_ids = itertools.count(1)

# hpc: 2 hosts of 8 H100. nlp's quota is 8, speech's 8, vision's 0 (hard limit 8): vision can only borrow.
LENDING_FARM = FARM_YAML.replace(
    "idle: {grace_minutes: 60}",
    """  speech:
    quotas:
      hpc: {H100: {gpus: 8}}
idle: {grace_minutes: 60}""",
)


def farm_yaml(lending: str) -> str:
    return LENDING_FARM + lending


class Refusal(UpstreamError):
    def __init__(self, status: int | None) -> None:
        super().__init__(f"slack failed ({status})")
        self.status = status


class FlakyChat(FakeChat):
    def __init__(self) -> None:
        super().__init__(operators=frozenset({OPS}))
        self.failure: UpstreamError | None = None

    def tell_user(self, user: str, text: str, blocks: Sequence[Any] | None = None) -> str:
        if self.failure is not None:
            raise self.failure
        return super().tell_user(user, text, blocks)


@dataclass
class World:
    svc: GpuFarm
    chat: FlakyChat
    clock: FakeClock
    incidents: FakeIncidents

    def ask(self, team: str, user: str, count: int = 8) -> int:
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
        request = build_request(
            values, self.svc.context.farm, requester=user, channel=None, request_id=f"lend-{next(_ids):06d}"
        )
        self.svc.submit_request(request)
        ir = max(r.public_id for r in self.incidents.records.values())
        self.svc.process(self.incidents.by_ir(ir).id)
        return ir

    def alloc(self, ir: int) -> Allocation:
        return self.svc.allocation(ir)

    def dms(self, user: str) -> list[str]:
        return [m.text for m in self.chat.sent if m.kind == "dm" and m.target == user]


def make_world(lending: str, *, hosts_count: int = 2, nlp_quota: int = 8) -> World:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(hosts_count):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FlakyChat()
    text = farm_yaml(lending).replace("hpc: {H100: {gpus: 8, hard_limit: 16}}", f"hpc: {{H100: {{gpus: {nlp_quota}}}}}")
    farm = parse_farm(text)
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, metrics=FakeMetrics())
    return World(svc, chat, clock, incidents)


WHEN_IDLE = "lending: {environments: {hpc: {borrow: when-idle}}}\n"


def borrowed_and_full(world: World) -> int:
    """speech holds its 8, vision borrows nlp's idle 8: the pool is full. Returns the borrowing lease."""
    assert world.alloc(world.ask("speech", SPEECH)).phase is Phase.ALLOCATED
    ir = world.ask("vision", VISION)
    assert world.alloc(ir).phase is Phase.ALLOCATED
    return ir


def test_the_policy_per_pool_and_its_defaults() -> None:
    farm = parse_farm(
        farm_yaml(
            "lending:\n  notice_minutes: 45\n  classes: {research: {teams: [vision], rank: 5}}\n"
            "  environments: {hpc: {borrow: priority, classes: [research], protection_hours: 2}}\n"
        )
    )
    hpc, cloud = farm.lending.policy("hpc"), farm.lending.policy("cloud")
    assert (hpc.borrow, hpc.notice_minutes, hpc.protection_hours) == (Borrow.PRIORITY, 45, 2)
    assert hpc.classes == ("research",)
    assert (cloud.borrow, cloud.notice_minutes, cloud.protection_hours) == (Borrow.NEVER, 45, 1)
    assert farm.lending.may_borrow("hpc", "vision") and not farm.lending.may_borrow("hpc", "nlp")
    assert not farm.lending.may_borrow("cloud", "vision")
    assert (farm.lending.rank("vision"), farm.lending.rank("nlp")) == (5, 0)
    default = parse_farm(LENDING_FARM).lending.policy("hpc")
    assert (default.borrow, default.notice_minutes, default.protection_hours) == (Borrow.NEVER, 30, 1)


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("lending: {environments: {nowhere: {borrow: when-idle}}}", "'nowhere' is not an environment"),
        ("lending: {classes: {c: {teams: [ghosts]}}}", "lending.classes.c.teams: 'ghosts' is not a team"),
        ("lending: {environments: {hpc: {borrow: priority, classes: [c]}}}", "'c' is not a class"),
        ("lending: {environments: {hpc: {borrow: priority}}}", "borrow: priority names the classes"),
        ("lending: {borrow: sometimes}", "lending.borrow"),
        ("lending: {notice_minutes: 0}", "lending.notice_minutes"),
    ],
)
def test_a_bad_lending_section_is_refused_at_load(section: str, problem: str) -> None:
    with pytest.raises(FarmConfigError, match=problem):
        parse_farm(farm_yaml(section + "\n"))


def test_without_lending_a_request_beyond_quota_goes_to_the_operators() -> None:
    world = make_world("")
    ir = world.ask("vision", VISION)
    assert world.alloc(ir).phase is Phase.REQUESTED and world.alloc(ir).borrowed == 0


def test_a_request_beyond_quota_borrows_idle_quota_and_is_marked() -> None:
    world = make_world(WHEN_IDLE)
    ir = borrowed_and_full(world)
    alloc = world.alloc(ir)
    assert (alloc.borrowed, alloc.approved_by) == (8, "policy")
    approved = next(line for line in alloc.history if " approved: " in line)
    assert "borrows 8 idle H100 in hpc beyond its quota of 0" in approved and approved.endswith("[borrowed]")
    metrics = world.svc.context.metrics
    assert isinstance(metrics, FakeMetrics)
    world.svc.publish_gauges()
    assert metrics.value("gpufarm.quota.borrowed_gpus", "team:vision", "environment:hpc", "gpu_model:h100") == 8
    assert metrics.value("gpufarm.quota.borrowed_gpus", "team:nlp", "environment:hpc", "gpu_model:h100") == 0


def test_no_borrowing_beyond_what_teams_leave_unused() -> None:
    world = make_world(WHEN_IDLE)
    world.ask("nlp", NLP)  # nlp uses its 8: nothing left to lend but speech's 8
    world.ask("speech", SPEECH)  # now no team lends anything, though nothing else holds the pool
    ir = world.ask("vision", VISION, 4)
    assert world.alloc(ir).phase is Phase.REQUESTED


def test_priority_lends_only_to_the_pools_classes() -> None:
    classes = "lending:\n  classes: {research: {teams: [speech]}}\n"
    world = make_world(classes + "  environments: {hpc: {borrow: priority, classes: [research]}}\n")
    assert world.alloc(world.ask("vision", VISION)).phase is Phase.REQUESTED
    # speech's 16: 8 of its own quota and 8 of nlp's unused quota, while the pool's 16 are free.
    speech_more = world.svc.allocation(world.ask("speech", SPEECH, 16))
    assert (speech_more.phase, speech_more.borrowed) == (Phase.ALLOCATED, 8)


def test_the_lender_takes_its_quota_back_on_notice_after_the_protection_window() -> None:
    world = make_world(WHEN_IDLE)
    borrower = borrowed_and_full(world)
    world.clock.advance(hours=2)  # past the 1 h protection window
    lender = world.ask("nlp", NLP)
    assert world.alloc(lender).phase is Phase.WAITING
    victim = world.alloc(borrower)
    deadline = world.clock.now() + timedelta(minutes=30)
    assert (victim.preempt_at, victim.preempt_for, victim.phase) == (deadline, f"IR-{lender}", Phase.ALLOCATED)
    notice = world.dms(VISION)[-1]
    assert f"IR-{borrower}" in notice and "team nlp needs them back" in notice and f"IR-{lender}" in notice
    assert "30 min notice" in notice and NLP in notice
    step = victim.history[-1]
    assert " preempting: " in step and step.endswith("[preemption-notice]")
    assert world.alloc(lender).history[-1].endswith("[queued-preemption]")
    # Before the deadline nothing ends; after it the sync ends the borrower and the lender is allocated.
    world.clock.advance(minutes=29)
    world.svc.sync()
    assert world.alloc(borrower).phase is Phase.ALLOCATED
    world.clock.advance(minutes=2)
    world.svc.sync()
    ended = world.alloc(borrower)
    assert ended.reclaim_reason is ReclaimReason.PREEMPTED
    reclaimed = next(line for line in ended.history if " reclaimed: " in line)
    assert "reason: preempted" in reclaimed and reclaimed.endswith("[preempted]")
    world.svc.process(world.incidents.by_ir(borrower).id)  # the webhook's reclaim frees the hosts
    assert world.alloc(borrower).phase is Phase.RECLAIMED
    assert world.alloc(lender).phase is Phase.ALLOCATED


def test_a_lease_within_its_protection_window_is_not_preempted_and_the_lender_is_told_when() -> None:
    world = make_world(WHEN_IDLE)
    borrower = borrowed_and_full(world)
    allocated = world.alloc(borrower).allocated_at
    assert allocated is not None
    world.clock.advance(minutes=20)
    lender = world.ask("nlp", NLP)
    assert world.alloc(borrower).preempt_at is None
    waits = world.alloc(lender).history[-1]
    assert waits.endswith("[queued-protected]")
    assert f"IR-{borrower}, becomes preemptible at {isoformat(allocated + timedelta(hours=1))}" in waits
    assert "becomes preemptible" in world.dms(NLP)[-1]
    # Once the window has passed, the sync's retry of the waiting request gives the notice.
    world.clock.advance(minutes=41)
    world.svc.sync()
    assert world.alloc(borrower).preempt_for == f"IR-{lender}"


def test_an_operator_exemption_holds_preemption_off() -> None:
    world = make_world(WHEN_IDLE)
    borrower = borrowed_and_full(world)
    world.svc.exempt(borrower, OPS, 3, "deadline for a paper")
    world.clock.advance(hours=2)
    lender = world.ask("nlp", NLP)
    assert world.alloc(borrower).preempt_at is None
    assert world.alloc(lender).history[-1].endswith("[queued-protected]")


def test_an_undelivered_notice_makes_the_preemption_wait() -> None:
    world = make_world(WHEN_IDLE)
    borrower = borrowed_and_full(world)
    world.clock.advance(hours=2)
    world.chat.failure = Refusal(503)
    with pytest.raises(UpstreamError):
        world.ask("nlp", NLP)
    assert world.alloc(borrower).preempt_at is None  # nothing recorded: no deadline runs for an unseen notice
    world.chat.failure = None
    world.clock.advance(minutes=5)
    world.svc.sync()
    victim = world.alloc(borrower)
    assert victim.preempt_at == world.clock.now() + timedelta(minutes=30)


def test_a_notice_for_a_request_that_no_longer_waits_is_withdrawn() -> None:
    world = make_world(WHEN_IDLE)
    borrower = borrowed_and_full(world)
    world.clock.advance(hours=2)
    lender = world.ask("nlp", NLP)
    world.svc.release(lender, NLP)
    world.clock.advance(minutes=31)
    world.svc.sync()
    kept = world.alloc(borrower)
    assert (kept.phase, kept.preempt_at) == (Phase.ALLOCATED, None)
    assert "notice withdrawn" in kept.history[-1]


def test_a_notice_that_can_never_be_delivered_is_recorded_undelivered() -> None:
    world = make_world(WHEN_IDLE)
    borrower = borrowed_and_full(world)
    world.clock.advance(hours=2)
    world.chat.failure = Refusal(404)  # the holder's account is gone: no retry can deliver it
    world.ask("nlp", NLP)
    victim = world.alloc(borrower)
    assert victim.preempt_at == world.clock.now() + timedelta(minutes=30)
    assert "notice undelivered" in victim.history[-1]


def test_the_lowest_priority_class_is_preempted_first() -> None:
    classes = "lending:\n  classes: {low: {teams: [vision], rank: 0}, high: {teams: [speech], rank: 9}}\n"
    rules = classes + "  environments: {hpc: {borrow: priority, classes: [low, high]}}\n"
    world = make_world(rules, hosts_count=3, nlp_quota=16)  # 24 H100; nlp lends 16
    world.ask("speech", SPEECH)  # its own 8
    speech = world.ask("speech", SPEECH)  # 8 borrowed
    vision = world.ask("vision", VISION)  # 8 borrowed: the pool is full
    assert (world.alloc(speech).borrowed, world.alloc(vision).borrowed) == (8, 8)
    world.clock.advance(hours=2)
    lender = world.ask("nlp", NLP)
    assert world.alloc(vision).preempt_for == f"IR-{lender}" and world.alloc(speech).preempt_at is None
