"""Bounded keeps and operator exemptions (gpufarm.core.idle.keeps, gpufarm.core.config.keeps)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat import command_text
from gpufarm.core.chat.command_text import Command, Verb
from gpufarm.core.commands import executor
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import Conflict, NotAllowed, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

USER = "U0000000001"
OTHER_OPS = "U00000OPS02"
OPS = "U0000000OPS"
OPS_CHANNEL = "C0000000001"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
_ids = itertools.count(1)

KEEPS_YAML = """
keeps:
  max_keeps: 2
  keep_hours: 24
  max_exempt_days: 14
  environments:
    cloud: {max_keeps: 0}
  teams:
    vision: {keep_hours: 4}
"""


@dataclass
class World:
    svc: GpuFarm
    chat: FakeChat
    clock: FakeClock

    def lease(self, env: str = "hpc", model: str = "H100") -> int:
        values = {"gpu_count": "8", "gpu_model": model, "environment": env, "team": "nlp", "project": "p"}
        request = build_request(
            values, self.svc.context.farm, requester=USER, channel=None, request_id=f"k-{next(_ids):06d}"
        )
        alloc, _ = self.svc.create_request(request)
        self.svc.decide_request(alloc.ir)
        self.svc.allocate(self.svc.allocation(alloc.ir))
        assert self.svc.allocation(alloc.ir).phase is Phase.ALLOCATED
        return alloc.ir

    def alloc(self, ir: int) -> Allocation:
        return self.svc.allocation(ir)

    def ops_posts(self) -> list[str]:
        return [m.text for m in self.chat.to(OPS_CHANNEL)]


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock()
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    hosts.seed("cloud-0", "A100", 8, "cloud")
    chat = FakeChat(operators=frozenset({OPS, OTHER_OPS}))
    farm = parse_farm(FARM_YAML + KEEPS_YAML)
    svc = GpuFarm(incidents=FakeIncidents(clock), hosts=hosts, chat=chat, clock=clock, farm=farm)
    yield World(svc, chat, clock)


def test_the_policy_overrides_per_environment_then_team() -> None:
    farm = parse_farm(FARM_YAML + KEEPS_YAML)
    assert farm.keeps.policy("hpc", "nlp").model_dump() == {"max_keeps": 2, "keep_hours": 24, "max_exempt_days": 14}
    assert farm.keeps.policy("cloud", "nlp").max_keeps == 0
    assert farm.keeps.policy("cloud", "vision").model_dump() == {"max_keeps": 0, "keep_hours": 4, "max_exempt_days": 14}
    assert parse_farm(FARM_YAML).keeps.policy().model_dump() == {
        "max_keeps": 2,
        "keep_hours": 24,
        "max_exempt_days": 30,
    }


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("keeps: {environments: {nowhere: {max_keeps: 1}}}", "keeps.environments: 'nowhere' is not an environment"),
        ("keeps: {teams: {ghosts: {max_keeps: 1}}}", "keeps.teams: 'ghosts' is not a team"),
        ("keeps: {keep_hours: 0}", "keeps.keep_hours"),
        ("keeps: {max_keeps: 1000}", "keeps.max_keeps"),
        ("keeps: {disable_reclaim: true}", "keeps.disable_reclaim"),
    ],
)
def test_a_bad_keeps_section_is_refused_at_load(section: str, problem: str) -> None:
    with pytest.raises(FarmConfigError, match=problem):
        parse_farm(FARM_YAML + section)


def test_keep_is_bounded_counted_and_told_to_operators(world: World) -> None:
    ir = world.lease()
    world.svc.idle_triggered(ir)
    first = world.svc.keep(ir, USER)
    a = world.alloc(ir)
    assert (a.phase, a.keep_count, a.idle_warned_at) == (Phase.ALLOCATED, 1, None)
    assert a.kept_until == world.clock.now() + timedelta(hours=24)
    assert f"IR-{ir} kept until" in first.text and "(keep 1 of 2)" in first.text
    assert f"<@{USER}> kept IR-{ir}" in world.ops_posts()[-1] and "keep 1 of 2" in world.ops_posts()[-1]
    # While kept, the idle monitor's re-notifications change nothing.
    assert world.svc.idle_triggered(ir).action.startswith(f"nothing to do: IR-{ir} is kept until")
    world.clock.advance(hours=25)
    world.svc.idle_triggered(ir)
    assert "(keep 2 of 2)" in world.svc.keep(ir, USER).text
    world.clock.advance(hours=25)
    world.svc.idle_triggered(ir)
    before = world.alloc(ir)
    refused = world.svc.keep(ir, USER)
    assert "cannot be kept again: it has used its 2 keeps of 24 h" in refused.text
    assert "ask the GPU operators" in refused.text and f"/gpu exempt IR-{ir} 3d" in refused.text
    assert world.alloc(ir) == before  # nothing written
    # The warning's history stays: every warning and keep is an entry.
    steps = [e.step for e in map(history.parse, world.alloc(ir).history) if e is not None]
    assert steps.count("warned") == 3 and steps.count("kept") == 2
    kept = [e.details for e in map(history.parse, world.alloc(ir).history) if e is not None and e.step == "kept"]
    assert kept[0].startswith("1 of 2; until ") and kept[1].startswith("2 of 2; until ")
    # Past the grace, reclaimed as usual.
    world.clock.advance(hours=2)
    world.svc.idle_triggered(ir)
    assert world.alloc(ir).reclaim_reason is ReclaimReason.IDLE


def test_a_pool_with_no_keeps_refuses_the_first(world: World) -> None:
    ir = world.lease("cloud", "A100")
    world.svc.idle_triggered(ir)
    assert "it has used its 0 keeps" in world.svc.keep(ir, USER).text
    assert world.alloc(ir).phase is Phase.IDLE_WARNED


def test_only_operators_exempt_and_the_exemption_holds_reclaim_off(world: World) -> None:
    ir = world.lease()
    world.svc.idle_triggered(ir)
    with pytest.raises(NotAllowed, match="only GPU operators can exempt"):
        world.svc.exempt(ir, USER, 3, "I need it")
    assert world.alloc(ir).phase is Phase.IDLE_WARNED
    with pytest.raises(ValidationFailed, match="at most 14 days"):
        world.svc.exempt(ir, OPS, 30, "long run")
    with pytest.raises(ValidationFailed, match="say why"):
        world.svc.exempt(ir, OPS, 3, "  ")
    reply = world.svc.exempt(ir, OPS, 3, "benchmark\nrun for the paper")
    a = world.alloc(ir)
    assert (a.phase, a.idle_warned_at, a.exempt_by) == (Phase.ALLOCATED, None, OPS)
    assert a.exempt_until is not None and f"until {a.exempt_until:%Y-%m-%d}" in reply.text
    assert "exempted" in world.ops_posts()[-1] and "benchmark run for the paper" in world.ops_posts()[-1]
    assert "exempted" in world.chat.to(USER)[-1].text
    entry = history.parse(a.history[-1])
    assert entry is not None and (entry.actor, entry.step) == (OPS, "exempted")
    assert entry.details.endswith("reason: benchmark run for the paper")
    # Idle alerts and the sync leave it alone until the end date; a Keep click says so and changes nothing.
    assert "exempt from idle reclaim until" in world.svc.idle_triggered(ir).action
    assert "nothing to keep" in world.svc.keep(ir, USER).text
    # Exempted by someone else: a clear answer, nothing changed.
    with pytest.raises(Conflict, match=f"already exempt from idle reclaim until .* \\(granted by operator {OPS}\\)"):
        world.svc.exempt(ir, OTHER_OPS, 5, "mine")
    assert world.alloc(ir).exempt_by == OPS
    world.clock.advance(days=4)
    assert world.svc.idle_triggered(ir).action == "warned"


def test_actions_on_an_ended_lease_change_nothing(world: World) -> None:
    ir = world.lease()
    world.svc.idle_triggered(ir)
    world.svc.release(ir, USER)
    before = world.alloc(ir)
    assert "has ended (released by the requester); nothing to keep" in world.svc.keep(ir, USER).text
    assert "has ended (released by the requester); nothing to exempt" in world.svc.exempt(ir, OPS, 3, "x").text
    assert world.alloc(ir) == before


def test_exempt_is_an_incident_command_and_a_redelivery_is_answered_not_applied(world: World) -> None:
    ir = world.lease()
    cmd = IncidentCommand(op=Op.EXEMPT, ir=ir, actor=OPS, days=3, reason="paper deadline", response_url=URL)
    executor.execute(world.svc.context, cmd)
    once = world.alloc(ir).history
    executor.execute(world.svc.context, cmd)
    assert world.alloc(ir).history == once
    answers = [m.text for m in world.chat.to(URL)]
    assert answers[-1].startswith(f"IR-{ir} is exempt from idle reclaim until")


def test_the_exempt_command_parses_days_and_reason() -> None:
    assert command_text.parse_command("exempt IR-12 3d benchmark for the paper") == Command(
        Verb.EXEMPT, ir=12, days=3, reason="benchmark for the paper"
    )
    assert command_text.parse_command("exempt IR-12 5 why not").days == 5
    for text, field in (("exempt IR-12", "days"), ("exempt IR-12 3d", "reason"), ("exempt IR-12 xd no", "days")):
        with pytest.raises(ValidationFailed) as info:
            command_text.parse_command(text)
        assert info.value.field == field
