"""Leases are visible to their team (docs/security.md, "Threat model", "Lease visibility").

`/gpu status`, `/gpu list` (mine, team, all) and the release confirmation show a lease, its purpose, history and
profiler runs' signed page links only to its requester, its team's members and the GPU operators; anyone else is
told "IR-n belongs to another team", and `/gpu list` counts other teams' leases without showing them. The farm YAML's
`visibility: org` opens every lease to everyone. Driven through the Slack worker's dispatch, as a hand-off from the
ingress arrives, over the in-memory fakes; and end to end on the local host, a signed `/gpu` command through the
ingress and the worker to the answer Slack shows, with the example farm's teams.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents
from local_farm import EXAMPLE_FARM, driven, without_inventory

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.command_text import parse_command
from gpufarm.core.chat.escape import inert
from gpufarm.core.config.farm import FarmConfigError, Visibility, parse_farm
from gpufarm.core.governance.membership import MembershipUnavailable
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError
from gpufarm.core.kernel.serial import ProfileScope
from gpufarm.core.leases import profile_runs
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import runtime as rt
from gpufarm.handlers.slack_events import Job
from gpufarm.handlers.slack_worker import dispatch
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE as LOCAL_ALICE
from gpufarm_sandbox.example_farm import BOB as LOCAL_BOB
from gpufarm_sandbox.example_farm import DANA as LOCAL_OPERATOR
from gpufarm_sandbox.example_farm import Person
from gpufarm_sandbox.localhost import LocalEnv, start_local

pytestmark = pytest.mark.security

# The requester and a mate of team nlp, a researcher of team vision, a user in no team, an operator.
ALICE, MATE, BOB, NOBODY, OPS = "U0000000001", "U0000000002", "U0000000003", "U0000000007", "U0000000OPS"
NLP_GROUP, VISION_GROUP = "S0000000011", "S0000000012"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
PURPOSE = "fine-tune the private llm-ko checkpoint"
LINK = "https://pages.example/profiles/ir-1/run-1-20261207t120000z?expires=1796000000&sig=0123abcd"
# The link as Slack text carries it (its `&` escaped, gpufarm.core.chat.escape).
SHOWN_LINK = inert(LINK)
_ids = itertools.count(1)

MEMBERS_YAML = FARM_YAML.replace(
    "  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{usergroup: {NLP_GROUP}}}\n    max_days: 30\n"
).replace("  vision:\n    max_days: 14\n", f"  vision:\n    members: {{usergroup: {VISION_GROUP}}}\n    max_days: 14\n")


class TeamChat(FakeChat):
    """FakeChat with one user group per team besides the operators'; Slack can be made to fail."""

    def __init__(self) -> None:
        super().__init__(operators=frozenset({OPS}))
        self.groups = {NLP_GROUP: frozenset({ALICE, MATE}), VISION_GROUP: frozenset({BOB})}
        self.down = False

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        if self.down:
            raise UpstreamError("slack usergroups.users.list failed: connection_error: TimeoutError")
        if usergroup in self.groups:
            return self.groups[usergroup]
        return super().usergroup_members(usergroup)


@dataclass
class World:
    svc: GpuFarm
    chat: TeamChat
    incidents: FakeIncidents

    def ask(self, user: str, team: str, count: int = 8, purpose: str = "") -> int:
        """A request submitted and processed as the allocation queue would: its IR."""
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
        if purpose:
            values["purpose"] = purpose
        request = build_request(
            values, self.svc.context.farm, requester=user, channel=None, request_id=f"v-{next(_ids):06d}"
        )
        self.svc.submit_request(request)
        ir = max(r.public_id for r in self.incidents.records.values())
        self.svc.process(self.incidents.by_ir(ir).id)
        return ir

    def slash(self, user: str, text: str) -> Message | None:
        """`/gpu <text>` as `user`, as the worker runs the ingress's hand-off."""
        job = Job(kind="command", user=user, response_url=URL, command=parse_command(text).to_payload())
        return dispatch(self.svc, job)

    def answer(self, user: str, text: str) -> str:
        """The text of the answer, blocks included (where the links are)."""
        message = self.slash(user, text)
        assert message is not None
        return "\n".join([message.text, *(str(b) for b in message.blocks)])

    def refusal(self, user: str, text: str) -> str:
        """The one line the user is told when the worker refuses (what rt.describe makes of the error)."""
        with pytest.raises(NotAllowed) as refused:
            self.slash(user, text)
        return rt.describe(refused.value)


def _world(yaml_text: str) -> World:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(4):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=TeamChat(), clock=clock, farm=parse_farm(yaml_text))
    assert isinstance(svc.context.chat, TeamChat)
    world = World(svc, svc.context.chat, incidents)
    # IR-1: nlp's lease, with a purpose and a profiler run's signed page link in its history; IR-2: vision's.
    first = world.ask(ALICE, "nlp", purpose=PURPOSE)
    scope = ProfileScope(run="run-1", summary="5 steps, 301.2 ms/step", link=LINK)
    profile_runs.record(incidents, clock, svc.allocation(first), ALICE, scope)
    world.ask(BOB, "vision")
    return world


@pytest.fixture
def world() -> Iterator[World]:
    yield _world(MEMBERS_YAML)


@pytest.mark.parametrize("user", [ALICE, MATE, OPS], ids=["requester", "team member", "operator"])
def test_status_shows_the_lease_with_its_purpose_history_and_links_to_those_on_it(world: World, user: str) -> None:
    text = world.answer(user, "status IR-1")
    assert PURPOSE in text and "profiled: run run-1" in text and SHOWN_LINK in text
    assert "/incidents/1|Incident IR-1>" in text


@pytest.mark.parametrize("user", [BOB, NOBODY], ids=["researcher of another team", "user in no team"])
def test_status_of_another_teams_lease_says_only_whose_it_is(world: World, user: str) -> None:
    told = world.refusal(user, "status IR-1")
    assert told == "IR-1 belongs to another team"
    # Nothing the refusal could carry reached the chat either.
    assert not any(PURPOSE in s.text or "sig=" in s.text for s in world.chat.sent if s.target != ALICE)


@pytest.mark.parametrize("user", [BOB, NOBODY], ids=["researcher of another team", "user in no team"])
def test_the_release_confirmation_is_not_a_way_to_see_another_teams_lease(world: World, user: str) -> None:
    assert world.refusal(user, "release IR-1") == "IR-1 belongs to another team"
    # The requester still gets the button Slack confirms.
    assert "IR-1" in world.answer(ALICE, "release IR-1")


def test_list_all_shows_each_user_what_they_may_see_and_counts_the_rest(world: World) -> None:
    nobody = world.answer(NOBODY, "list all")
    assert "IR-1" not in nobody and "IR-2" not in nobody and PURPOSE not in nobody
    assert "All live allocations: none. (2 more of other teams, shown to their members and the GPU operators)" in nobody
    bob = world.answer(BOB, "list all")
    assert "IR-2" in bob and "IR-1" not in bob and "(1 more of other teams" in bob
    mate = world.answer(MATE, "list all")
    assert "IR-1" in mate and "IR-2" not in mate and "(1 more of other teams" in mate
    ops = world.answer(OPS, "list all")
    assert "IR-1" in ops and "IR-2" in ops and "more of other teams" not in ops


def test_list_team_is_for_its_members_and_the_operators(world: World) -> None:
    for user in (BOB, NOBODY):
        assert world.refusal(user, "list team nlp") == (
            "team nlp's leases are shown to its members and the GPU operators"
        )
    for user in (MATE, OPS):
        text = world.answer(user, "list team nlp")
        assert "IR-1" in text and "IR-2" not in text and "more of other teams" not in text
    # Without a team: the teams of the user's own leases.
    assert "IR-1" in world.answer(ALICE, "list team")


def test_list_mine_is_the_users_own_leases_only(world: World) -> None:
    assert "Your live allocations: none." in world.answer(NOBODY, "list")
    mine = world.answer(ALICE, "list mine")
    assert "IR-1" in mine and "IR-2" not in mine


def test_a_requester_who_left_the_team_still_sees_their_own_lease_and_only_it(world: World) -> None:
    mates = world.ask(MATE, "nlp")
    world.chat.groups[NLP_GROUP] = frozenset({MATE})
    text = world.answer(ALICE, "status IR-1")
    assert PURPOSE in text and SHOWN_LINK in text
    assert world.refusal(ALICE, f"status IR-{mates}") == f"IR-{mates} belongs to another team"
    listed = world.answer(ALICE, "list team")
    assert "IR-1" in listed and f"IR-{mates}" not in listed and "(1 more of other teams" in listed


def test_membership_slack_cannot_read_is_a_retry_never_the_lease(world: World) -> None:
    world.chat.down = True
    for text in ("status IR-1", "list all", "list team nlp"):
        with pytest.raises(MembershipUnavailable) as caught:
            world.slash(NOBODY, text)
        assert PURPOSE not in str(caught.value) and "try again" in rt.describe(caught.value)


def test_visibility_org_opens_every_lease_to_everyone() -> None:
    opened = _world(MEMBERS_YAML + "visibility: org\n")
    assert opened.svc.context.farm.visibility is Visibility.ORG
    text = opened.answer(NOBODY, "status IR-1")
    assert PURPOSE in text and SHOWN_LINK in text
    listed = opened.answer(BOB, "list all")
    assert "IR-1" in listed and "IR-2" in listed and "more of other teams" not in listed
    assert "IR-1" in opened.answer(NOBODY, "list team nlp")
    # Changes stay with the team: an outsider still cannot release.
    with pytest.raises(NotAllowed, match="only the requester of IR-1 or a GPU operator"):
        opened.svc.release(1, NOBODY)


def test_a_farm_that_checks_no_membership_shows_every_lease_as_before() -> None:
    opened = _world(FARM_YAML)
    assert opened.svc.context.farm.visibility is Visibility.TEAM
    assert PURPOSE in opened.answer(NOBODY, "status IR-1")
    assert "more of other teams" not in opened.answer(NOBODY, "list all")


def test_visibility_is_team_by_default_and_refuses_any_other_word() -> None:
    assert parse_farm(MEMBERS_YAML).visibility is Visibility.TEAM
    with pytest.raises(FarmConfigError, match="visibility"):
        parse_farm(MEMBERS_YAML + "visibility: everyone\n")


# -- end to end on the local host ----------------------------------------------------------------------------------

# A workspace member in none of the example farm's teams (U0000000009 is the sandbox's bot).
EVE = Person("U0000000007", "eve", "Eve Han (no team)")
LOCAL_PURPOSE = "private-eval-of-the-ko-checkpoint"


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEnv]:
    """The local host on a free port, once for this module's end-to-end tests."""
    with start_local(port=0) as env:
        yield env


def _farm(local: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "") -> Iterator[LocalFarm]:
    path = tmp_path / "farm.yaml"
    path.write_text(without_inventory(EXAMPLE_FARM.read_text()) + extra)
    with driven(local, path) as farm:
        # Eve is a member of the workspace, as Slack knows her, and of no team's user group.
        farm.post("/_sandbox/slack/users", {"users": [{"id": EVE.id, "name": EVE.name, "real_name": EVE.real_name}]})
        yield farm


@pytest.fixture
def team_farm(local: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFarm]:
    """The example farm as it ships (`visibility` left at its default)."""
    yield from _farm(local, tmp_path, monkeypatch)


@pytest.fixture
def org_farm(local: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFarm]:
    """The example farm opened to the workspace."""
    yield from _farm(local, tmp_path, monkeypatch, "visibility: org\n")


def _alices_lease(farm: LocalFarm) -> int:
    farm.slash(LOCAL_ALICE, f"request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=2 purpose={LOCAL_PURPOSE}")
    assert farm.settle()
    answer = farm.answer(LOCAL_ALICE, "IR-")
    ir = ir_in(answer["text"]) if answer is not None else None
    assert ir is not None
    return ir


def _asks(farm: LocalFarm, person: Person, text: str, expect: str) -> str:
    """`person` types `/gpu <text>`: the text of their latest answer containing `expect`, blocks included."""
    farm.slash(person, text)
    assert farm.settle()
    answer = farm.answer(person, expect)
    assert answer is not None, (text, expect)
    return f"{answer['text']}\n{answer.get('blocks')}"


@pytest.mark.parametrize("outsider", [LOCAL_BOB, EVE], ids=["researcher of another team", "user in no team"])
def test_on_the_local_host_another_teams_lease_is_not_shown(team_farm: LocalFarm, outsider: Person) -> None:
    ir = _alices_lease(team_farm)
    for insider in (LOCAL_ALICE, LOCAL_OPERATOR):
        assert LOCAL_PURPOSE in _asks(team_farm, insider, f"status IR-{ir}", "Phase:")
    told = _asks(team_farm, outsider, f"status IR-{ir}", "belongs to another team")
    assert f"IR-{ir} belongs to another team" in told and LOCAL_PURPOSE not in told
    listed = _asks(team_farm, outsider, "list all", "All live allocations")
    assert f"IR-{ir}" not in listed and LOCAL_PURPOSE not in listed and "more of other teams" in listed
    assert LOCAL_PURPOSE not in str(team_farm.messages(user=outsider.id))


def test_on_the_local_host_visibility_org_shows_it_to_everyone(org_farm: LocalFarm) -> None:
    ir = _alices_lease(org_farm)
    assert LOCAL_PURPOSE in _asks(org_farm, EVE, f"status IR-{ir}", "Phase:")
    assert f"IR-{ir}" in _asks(org_farm, EVE, "list all", "All live allocations")
