"""Quota changes asked in chat (gpufarm.core.chat.quota_text, gpufarm.core.accounting.quota_requests,
gpufarm.core.accounting.overrides): asked, refused, approved, applied at once, shown and ended at their end."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.accounting import overrides, quota_requests
from gpufarm.core.chat.command_text import Verb, parse_command
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import Conflict, NotAllowed, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

USER, OPS, OPS_CHANNEL = "U0000000001", "U0000000OPS", "C0000000001"
_ids = itertools.count(1)


@dataclass
class World:
    svc: GpuFarm
    chat: FakeChat
    clock: FakeClock
    incidents: FakeIncidents
    metrics: FakeMetrics

    def ask_change(self, text: str) -> int:
        cmd = parse_command(text)
        assert cmd.args is not None
        quota_requests.ask(self.svc.context, USER, cmd.args, request_id=f"slack-quota-{next(_ids):08d}")
        return max(r.public_id for r in self.incidents.records.values())

    def ask_gpus(self, count: int, team: str = "vision") -> Allocation:
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
        request = build_request(
            values, self.svc.context.farm, requester=USER, channel=None, request_id=f"q-{next(_ids):06d}"
        )
        self.svc.submit_request(request)
        return self.svc.allocation(max(r.public_id for r in self.incidents.records.values()))


@pytest.fixture
def world() -> World:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    metrics = FakeMetrics()
    farm = parse_farm(FARM_YAML)
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, metrics=metrics)
    return World(svc, chat, clock, incidents, metrics)


def later(world: World, days: int) -> str:
    return (world.clock.now() + timedelta(days=days)).strftime("%Y-%m-%d")


def test_the_command_is_parsed_into_its_words() -> None:
    cmd = parse_command('quota request team=nlp +16 H100 env=onprem-hpc until 2027-01-31 reason="paper deadline"')
    assert cmd.verb is Verb.QUOTA
    assert cmd.args == {
        "team": "nlp",
        "delta": "+16",
        "gpu_model": "H100",
        "environment": "onprem-hpc",
        "until": "2027-01-31",
        "reason": "paper deadline",
    }
    assert parse_command("quota nlp").args is None
    bad_ones = (("quota request team=nlp H100", "delta"), ("quota request +1 +2", "delta"))
    bad_ones += (("quota request x=1", "text"),)
    for bad, field in bad_ones:
        with pytest.raises(ValidationFailed) as err:
            parse_command(bad)
        assert err.value.field == field


def test_an_approved_change_applies_at_once_and_is_on_record(world: World) -> None:
    assert world.ask_gpus(8).phase is Phase.REQUESTED  # vision's quota is 0: an operator would decide
    ir = world.ask_change(f"quota request team=vision +8 H100 env=hpc until {later(world, 10)} reason=deadline")
    asked = world.svc.allocation(ir)
    assert (asked.is_quota_override, asked.phase, asked.quota_delta, asked.gpu_count) == (True, Phase.REQUESTED, 8, 0)
    card = world.chat.to(OPS_CHANNEL)[-1]
    assert "+8 (0 → 8)" in str(card.blocks) and "Team holds 0 H100" in str(card.blocks)
    assert "16 of 16 H100 free" in str(card.blocks) and "gpu_approve" in str(card.blocks)
    # The operators' Approve is the lease's own command, in the pool's group.
    answer = world.svc.approve(ir, OPS)
    approved = world.svc.allocation(ir)
    assert (approved.phase, approved.state, approved.approved_by) == (Phase.ALLOCATED, State.STABLE, OPS)
    assert f"approved by {OPS}" in approved.history[-1] and approved.history[-1].endswith("[quota-changed]")
    assert "is 8 (0 +8)" in answer.text
    # Applied at once: vision's next request is within its quota, approved by policy; never taken for a lease.
    lease = world.ask_gpus(8)
    assert lease.phase is not Phase.REQUESTED and lease.approved_by == "policy"
    assert ir not in {a.ir for a in world.svc.context.live()}
    shown = world.svc.quota("vision").blocks[0]["text"]["text"]
    assert "`vision` H100 in `hpc`: 8 / 8 (hard 16)" in shown  # the file's 0 (hard 8), each +8
    assert f"IR-{ir}: vision +8 H100 in hpc until" in shown and f"approved by <@{OPS}>" in shown


def test_a_change_ends_on_its_own_at_its_end(world: World) -> None:
    ir = world.ask_change(f"quota request team=vision +8 H100 env=hpc until {later(world, 2)} reason=deadline")
    world.svc.approve(ir, OPS)
    world.clock.advance(days=1)
    world.svc.sweep()
    assert world.svc.allocation(ir).phase is Phase.ALLOCATED
    world.clock.advance(days=1, minutes=1)
    world.svc.sweep()
    ended = world.svc.allocation(ir)
    assert (ended.phase, ended.state) == (Phase.RECLAIMED, State.RESOLVED)
    assert ended.history[-1].endswith("[quota-expired]")
    assert world.ask_gpus(8).phase is Phase.REQUESTED  # back to the file's quota of 0
    assert overrides.live(world.svc.context) == []


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("team=ghosts +8 H100 env=hpc until {d} reason=x", "team"),
        ("team=vision +8 H100 env=nowhere until {d} reason=x", "environment"),
        ("team=vision +8 B200 env=hpc until {d} reason=x", "gpu_model"),
        ("team=vision +8 A100 env=hpc until {d} reason=x", "gpu_model"),
        ("team=vision +0 H100 env=hpc until {d} reason=x", "delta"),
        ("team=vision -1 H100 env=hpc until {d} reason=x", "delta"),
        ("team=vision +8 H100 env=hpc until 2020-01-01 reason=x", "until"),
        ("team=vision +8 H100 env=hpc until 3026-01-01 reason=x", "until"),
        ("team=vision +8 H100 env=hpc until tomorrow reason=x", "until"),
        ("team=vision +8 H100 env=hpc until {d}", "reason"),
    ],
)
def test_a_bad_change_is_refused_and_nothing_is_created(world: World, text: str, field: str) -> None:
    before = len(world.incidents.records)
    with pytest.raises(ValidationFailed) as err:
        world.ask_change("quota request " + text.format(d=later(world, 5)))
    assert err.value.field == field
    assert len(world.incidents.records) == before and not world.chat.to(OPS_CHANNEL)


def test_only_operators_decide_and_a_rejection_is_on_record(world: World) -> None:
    ir = world.ask_change(f"quota request team=nlp -4 H100 env=hpc until {later(world, 5)} reason=lend")
    with pytest.raises(NotAllowed):
        world.svc.approve(ir, USER)
    world.svc.reject(ir, OPS, "not now")
    rejected = world.svc.allocation(ir)
    assert rejected.phase is Phase.REJECTED and "reason: not now" in rejected.history[-1]
    with pytest.raises(Conflict):
        world.svc.approve(ir, OPS)


def test_an_undecided_change_is_withdrawn_at_its_end(world: World) -> None:
    ir = world.ask_change(f"quota request team=nlp +4 H100 env=hpc until {later(world, 1)} reason=x")
    world.clock.advance(days=1, minutes=1)
    world.svc.sweep()
    withdrawn = world.svc.allocation(ir)
    assert withdrawn.phase is Phase.REJECTED
    assert "withdrawn: no operator decided before its end" in withdrawn.history[-1]
    assert world.chat.to(USER)[-1].text.endswith("undecided; it is withdrawn.")


def test_the_gauges_carry_the_change_while_it_is_in_effect(world: World) -> None:
    tags = ("team:vision", "environment:hpc", "gpu_model:h100")
    ir = world.ask_change(f"quota request team=vision +8 H100 env=hpc until {later(world, 2)} reason=deadline")
    world.svc.publish_gauges()
    assert world.metrics.value("gpufarm.quota.override_gpus", *tags) == 0  # asked, not approved: nothing changes
    world.svc.approve(ir, OPS)
    world.svc.publish_gauges()
    assert world.metrics.value("gpufarm.quota.override_gpus", *tags) == 8
    assert world.metrics.value("gpufarm.quota.entitled", *tags) == 8
    world.clock.advance(days=3)
    world.svc.sweep()
    world.svc.publish_gauges()
    assert world.metrics.value("gpufarm.quota.override_gpus", *tags) == 0
    assert world.metrics.value("gpufarm.quota.entitled", *tags) == 0


def test_the_digest_lists_the_changes_in_effect(world: World) -> None:
    from gpufarm.core.digest import run

    ir = world.ask_change(f"quota request team=vision +8 H100 env=hpc until {later(world, 2)} reason=deadline")
    world.svc.approve(ir, OPS)
    result = run.run(world.svc.context, force=True)
    posted = str(world.chat.to(OPS_CHANNEL)[-1].blocks)
    assert result.posted and result.sections["Quota changes and lending"] == 1
    assert "Quota changes and lending" in posted and f"IR-{ir}: vision +8 H100 in hpc until" in posted
    assert f"approved by <@{OPS}>" in posted


def test_the_report_counts_the_change_in_the_entitlement_never_as_a_lease(world: World) -> None:
    from gpufarm.core.config.farm_view import FarmView
    from gpufarm.reporting.make import make_report

    ir = world.ask_change(f"quota request team=vision +8 H100 env=hpc until {later(world, 2)} reason=deadline")
    world.svc.approve(ir, OPS)
    now = world.clock.now()
    report = make_report(world.incidents, FarmView.of(world.svc.context.farm), now, month=now.strftime("%Y-%m"))
    rows = {r.key: r for r in report.rows}
    assert (rows["vision"].entitled, rows["vision"].leases) == (8, 0)
    assert any(n.startswith(f"quota change in effect: IR-{ir}: vision +8 H100 in hpc") for n in report.notes)
    assert any(n.endswith(f"approved by {OPS}") for n in report.notes)


def test_the_worker_asks_once_per_slack_command(world: World) -> None:
    from gpufarm.core.chat.command_text import Command
    from gpufarm.handlers.slack_events import Job
    from gpufarm.handlers.slack_worker import dispatch

    parsed = parse_command(f"quota request team=vision +8 H100 env=hpc until {later(world, 3)} reason=deadline")
    cmd = Command(parsed.verb, args=parsed.args, request_id="slack-quota-00000001")
    job = Job(kind="command", user=USER, command=cmd.to_payload())
    first, again = dispatch(world.svc, job), dispatch(world.svc, job)  # Slack's retry of the same command
    assert first is not None and again is not None and "is with the GPU operators" in first.text
    assert len(world.incidents.records) == 1 and len(world.chat.to(OPS_CHANNEL)) == 1
    with pytest.raises(ValidationFailed):
        dispatch(world.svc, Job(kind="command", user=USER, command=Command(parsed.verb, args=parsed.args).to_payload()))


def test_concurrent_deliveries_of_one_command_leave_one_change_and_one_card(world: World) -> None:
    from gpufarm.core.chat.command_text import Command
    from gpufarm.handlers.slack_events import Job
    from gpufarm.handlers.slack_worker import dispatch

    # Both worker invocations miss each other's incident in the request id check (they ran at the same time).
    world.incidents.find_by_request_id = lambda request_id: None  # type: ignore[method-assign]
    parsed = parse_command(f"quota request team=vision +8 H100 env=hpc until {later(world, 3)} reason=deadline")
    cmd = Command(parsed.verb, args=parsed.args, request_id="slack-quota-00000002")
    job = Job(kind="command", user=USER, command=cmd.to_payload())
    first, second = dispatch(world.svc, job), dispatch(world.svc, job)
    assert first is not None and second is not None and "IR-1" in first.text and "IR-1" in second.text
    twin = world.svc.allocation(2)
    assert (twin.state, twin.phase) == (State.RESOLVED, Phase.REJECTED) and "duplicate of IR-1" in twin.title
    assert world.svc.allocation(1).phase is Phase.REQUESTED
    assert len(world.chat.to(OPS_CHANNEL)) == 1


def test_a_change_is_never_released_or_extended_as_a_lease(world: World) -> None:
    ir = world.ask_change(f"quota request team=vision +8 H100 env=hpc until {later(world, 2)} reason=deadline")
    world.svc.approve(ir, OPS)
    for act in (lambda: world.svc.release(ir, USER), lambda: world.svc.force_reclaim(ir, OPS, "x")):
        with pytest.raises(Conflict, match="is a quota change, not a lease"):
            act()
    with pytest.raises(Conflict, match="is a quota change"):
        world.svc.extend(ir, OPS, 3)
    assert world.svc.allocation(ir).phase is Phase.ALLOCATED
