"""Team membership (issue 11 point 1): only a team's members request for, extend or release its GPUs; operators act
for any team; membership Slack cannot confirm is never guessed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeQueue

from gpufarm.core.commands import executor
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.governance.membership import Membership, MembershipMisconfigured, MembershipUnavailable
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import GpuRequest
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.service import GpuFarm

ALICE, BOB, GUEST, OPS = "U0000000001", "U0000000003", "U0000000006", "U0000000OPS"
NLP_GROUP, VISION_GROUP = "S0000000011", "S0000000012"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
_ids = itertools.count(1)

MEMBERS_YAML = FARM_YAML.replace(
    "  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{usergroup: {NLP_GROUP}}}\n    max_days: 30\n"
).replace(
    "  vision:\n    max_days: 14\n",
    f"  vision:\n    members: {{usergroup: {VISION_GROUP}, users: [{GUEST}]}}\n    max_days: 14\n",
)


class TeamChat(FakeChat):
    """FakeChat with one user group per team besides the operators'; counts every usergroups.users.list."""

    def __init__(self) -> None:
        super().__init__(operators=frozenset({OPS}))
        self.groups = {NLP_GROUP: frozenset({ALICE}), VISION_GROUP: frozenset({BOB, ALICE})}
        self.calls: list[str] = []
        self.down = False

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        self.calls.append(usergroup)
        if self.down:
            raise UpstreamError("slack usergroups.users.list failed: connection_error: TimeoutError")
        if usergroup in self.groups:
            return self.groups[usergroup]
        return super().usergroup_members(usergroup)


@dataclass
class World:
    svc: GpuFarm
    chat: TeamChat
    queue: FakeQueue
    incidents: FakeIncidents

    def request(self, user: str = ALICE, team: str = "nlp", count: int = 8) -> GpuRequest:
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
        return build_request(
            values, self.svc.context.farm, requester=user, channel=None, request_id=f"m-{next(_ids):06d}"
        )


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = TeamChat()
    queue = FakeQueue()
    farm = parse_farm(MEMBERS_YAML)
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, queue=queue)
    yield World(svc, chat, queue, incidents)


def test_a_request_for_a_foreign_team_is_refused_and_queues_nothing(world: World) -> None:
    with pytest.raises(
        NotAllowed,
        match=r"only members of team nlp or GPU operators can request GPUs for team nlp \(your teams: vision\)",
    ):
        executor.request(world.svc.context, world.request(user=BOB, team="nlp"), response_url=URL, origin="x")
    assert world.queue.sent == []
    # A member's request for their team is queued; an operator may request for any team.
    assert executor.request(world.svc.context, world.request(user=ALICE), response_url=URL, origin="a") is None
    assert (
        executor.request(world.svc.context, world.request(user=OPS, team="vision"), response_url=URL, origin="o")
        is None
    )
    assert [b["command"]["op"] for _, b in world.queue.sent] == ["create", "create"]


def test_listed_users_and_group_members_both_count(world: World) -> None:
    members = world.svc.context.membership()
    assert members.members("vision") == frozenset({BOB, ALICE, GUEST})
    assert members.teams_of(ALICE) == ["nlp", "vision"]
    assert members.teams_of(GUEST) == ["vision"]
    assert members.teams_of(OPS) == []


def test_a_request_without_a_team_picks_the_only_one_or_lists_them(world: World) -> None:
    members = world.svc.context.membership()
    assert members.team_for_request(BOB, None) == "vision"
    assert members.team_for_request(BOB, "nlp") == "nlp"  # named: checked later, not guessed
    with pytest.raises(ValidationFailed, match="several teams; say which one with team=: nlp, vision"):
        members.team_for_request(ALICE, None)
    with pytest.raises(ValidationFailed, match="in no team"):
        members.team_for_request(OPS, None)


def test_slack_failing_refuses_with_a_retry_hint_and_never_approves(world: World) -> None:
    world.chat.down = True
    with pytest.raises(MembershipUnavailable, match="nothing was changed") as caught:
        executor.request(world.svc.context, world.request(), response_url=URL, origin="down")
    assert isinstance(caught.value, UpstreamError)  # the worker answers "try again in a minute"
    assert world.queue.sent == [] and world.incidents.creates == 0


def test_a_user_group_slack_does_not_know_is_a_configuration_error_naming_the_team(world: World) -> None:
    del world.chat.groups[VISION_GROUP]
    with pytest.raises(MembershipMisconfigured, match=r"teams\.vision\.members\.usergroup names Slack user group"):
        world.svc.context.membership().members("vision")
    assert isinstance(MembershipMisconfigured("x"), FarmConfigError)


def test_each_group_is_read_once_per_invocation(world: World) -> None:
    with world.svc.context.reading():
        members = world.svc.context.membership()
        for _ in range(3):
            members.teams_of(ALICE)
            members.is_operator(OPS)
    assert sorted(world.chat.calls) == sorted([NLP_GROUP, VISION_GROUP, "S0000000001"])
    with world.svc.context.reading():
        world.svc.context.membership().is_member(ALICE, "nlp")
    assert world.chat.calls.count(NLP_GROUP) == 2  # a new invocation asks again (the adapter caches a minute)


def test_extend_and_release_are_for_members_of_the_leases_team(world: World) -> None:
    executor.request(world.svc.context, world.request(user=ALICE), response_url=URL, origin="a")
    _drain(world)
    lease = world.svc.allocation(1)
    assert lease.phase is Phase.ALLOCATED
    world.chat.groups[NLP_GROUP] = frozenset()  # Alice left the team
    with pytest.raises(NotAllowed, match="only members of team nlp or GPU operators can extend IR-1"):
        world.svc.extend(1, ALICE, 1)
    with pytest.raises(NotAllowed, match="can release IR-1"):
        world.svc.release(1, ALICE)
    with pytest.raises(NotAllowed, match="only the requester"):
        world.svc.release(1, BOB)
    assert "being released" in world.svc.release(1, OPS).text


def test_a_farm_names_members_for_every_team_or_for_none() -> None:
    half = FARM_YAML.replace("  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{usergroup: {NLP_GROUP}}}\n")
    with pytest.raises(FarmConfigError, match=r"teams\.vision\.members: every team names its members"):
        parse_farm(half)
    empty = FARM_YAML.replace("  nlp:\n    max_days: 30\n", "  nlp:\n    members: {}\n")
    with pytest.raises(FarmConfigError, match="name a usergroup"):
        parse_farm(empty)
    bad = FARM_YAML.replace("  nlp:\n    max_days: 30\n", "  nlp:\n    members: {usergroup: nlp-team}\n")
    with pytest.raises(FarmConfigError, match=r"teams\.nlp\.members\.usergroup"):
        parse_farm(bad)
    # No team names members: nobody's membership is checked (every team is open), as before membership existed.
    open_farm = Membership(parse_farm(FARM_YAML), TeamChat(), None)
    assert open_farm.members("nlp") is None and open_farm.teams_of(BOB) == ["nlp", "vision"]


def _drain(world: World) -> None:
    while world.queue.sent:
        _, body = world.queue.sent.pop(0)
        executor.execute(world.svc.context, IncidentCommand.model_validate(body["command"]))
        for a in world.svc.context.live():
            if a.phase is Phase.APPROVED:
                world.svc.allocate(a)


def test_an_inline_request_without_a_team_becomes_a_request_for_the_only_team(world: World) -> None:
    from gpufarm.core.chat.command_text import Command, Verb
    from gpufarm.handlers.slack_events import Job
    from gpufarm.handlers.slack_worker import dispatch

    args = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "project": "p"}
    handed = Command(Verb.REQUEST, args=args, request_id="slack-cmd-0123456789")
    job = Job(kind="command", user=BOB, response_url=URL, command=handed.to_payload())
    world.chat.calls.clear()
    assert dispatch(world.svc, job) is None
    assert world.chat.calls.count(VISION_GROUP) == 1  # picked and checked with one read of the group
    (_, body), *_ = world.queue.sent
    assert body["command"]["request"]["team"] == "vision"
    assert body["command"]["request"]["request_id"] == "slack-cmd-0123456789"
    asked = Job(kind="command", user=ALICE, response_url=URL, command=handed.to_payload())
    with pytest.raises(ValidationFailed, match="nlp, vision"):
        dispatch(world.svc, asked)
    assert len(world.queue.sent) == 1
    assert Op.CREATE.value == body["command"]["op"]


def test_slack_check_resolves_every_group_and_names_the_one_slack_does_not_know() -> None:
    from gpufarm.setup.slack_check import report

    chat, lines = TeamChat(), []
    farm = parse_farm(MEMBERS_YAML)
    assert report(farm, chat, lines.append) == 0
    assert lines == [
        "operators_usergroup S0000000001: 1 member(s)",
        "team nlp: 1 member(s)",
        "team vision: 3 member(s)",
    ]
    del chat.groups[VISION_GROUP]
    lines.clear()
    assert report(farm, chat, lines.append) == 1
    assert "teams.vision.members.usergroup names Slack user group S0000000012, which does not exist" in lines[-1]
    chat.down = True
    assert report(farm, chat, lines.append) == 2


def test_an_unknown_team_group_met_by_a_queued_command_is_logged_for_the_operators(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    executor.request(world.svc.context, world.request(user=ALICE), response_url=URL, origin="a")
    _drain(world)
    del world.chat.groups[NLP_GROUP]
    world.chat.groups[VISION_GROUP] = frozenset()
    summary = executor.execute(world.svc.context, IncidentCommand(op=Op.EXTEND, ir=1, actor=ALICE, days=1, origin="e"))
    assert summary.startswith("refused: something went wrong inside gpufarm")
    assert "teams.nlp.members.usergroup names Slack user group S0000000011, which does not exist" in caplog.text
    # Operators act for any team: a team group Slack cannot resolve does not stop them.
    assert "extended by 1 days" in world.svc.extend(1, OPS, 1).text
