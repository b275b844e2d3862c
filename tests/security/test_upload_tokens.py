"""Per-lease upload tokens (docs/security.md, "Threat model", "Upload tokens").

A token is minted only by gpufarm, under its `upload_token_secret`, for one lease, one user and an expiry at most
24 hours away and never past the lease's end: `/gpu profile-token IR-n` gives it to the lease's requester or a
member of its team, ephemerally, and refuses anyone else with "IR-n belongs to another team". A forged, expired,
malformed or oversize token is refused by `verify`; a valid one is refused by `check_for_lease` for another lease,
an ended lease or a user who has left the team. The Slack side is driven through the worker's handler over the
in-memory fakes, so what reaches Slack is what a user would see.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeMonitorStates
from hypothesis import given
from hypothesis import strategies as st
from local_farm import EXAMPLE_FARM, driven, without_inventory

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import Conflict, NotAllowed
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.upload_token import MAX_TOKEN_CHARS, Claims, InvalidUploadToken, mint, verify
from gpufarm.core.leases.upload_tokens import MAX_LIFETIME, check_for_lease, expiry
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import runtime as rt
from gpufarm.handlers import slack_worker
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE as LOCAL_ALICE
from gpufarm_sandbox.example_farm import BOB as LOCAL_BOB
from gpufarm_sandbox.localhost import start_local
from gpufarm_sandbox.localhost.env import LOCAL_UPLOAD_TOKEN_SECRET

# The requester and a mate of team nlp, a researcher of team vision, a user in no team, an operator.
ALICE, MATE, BOB, NOBODY, OPS = "U0000000001", "U0000000002", "U0000000003", "U0000000007", "U0000000OPS"
NLP_GROUP, VISION_GROUP = "S0000000011", "S0000000012"
KEY = b"upload-token-test-key-0123456789"
OTHER_KEY = b"another-deployment-key-987654321"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
CHANNEL = "C0000000002"
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
_ids = itertools.count(1)

MEMBERS_YAML = FARM_YAML.replace(
    "  nlp:\n    max_days: 30\n", f"  nlp:\n    members: {{usergroup: {NLP_GROUP}}}\n    max_days: 30\n"
).replace("  vision:\n    max_days: 14\n", f"  vision:\n    members: {{usergroup: {VISION_GROUP}}}\n    max_days: 14\n")


# -- the token itself -----------------------------------------------------------------------------------------------


def _token_in(text: str) -> str:
    found = re.search(r"gfu1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+", text)
    assert found is not None, text
    return found[0]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(payload_text: str, key: bytes = KEY) -> str:
    """A token signed with the right key around any payload: what only a holder of the key could make."""
    payload = _b64(payload_text.encode())
    signature = hmac.new(key, f"gfu1.{payload}".encode(), hashlib.sha256).digest()
    return f"gfu1.{payload}.{_b64(signature)}"


@given(
    ir=st.integers(min_value=1, max_value=10**9 - 1),
    user=st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    seconds=st.integers(min_value=1, max_value=400 * 86400),
)
def test_a_minted_token_verifies_to_what_it_was_minted_for(ir: int, user: str, seconds: int) -> None:
    expires = NOW + timedelta(seconds=seconds)
    token = mint(ir, user, expires, KEY)
    assert len(token) <= MAX_TOKEN_CHARS
    assert verify(token, KEY, NOW) == Claims(ir=ir, user=user, expires=expires)


def test_a_forged_token_is_refused() -> None:
    token = mint(1, ALICE, NOW + timedelta(hours=1), KEY)
    version, payload, signature = token.split(".")
    # Signed with another key; its payload changed to another lease or user under the old signature; a signature
    # lifted onto another payload; one character of the signature changed.
    other_payload = mint(2, BOB, NOW + timedelta(hours=1), KEY).split(".")[1]
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    forged = [
        mint(1, ALICE, NOW + timedelta(hours=1), OTHER_KEY),
        f"{version}.{_b64(f'2:{ALICE}:{int((NOW + timedelta(hours=1)).timestamp())}'.encode())}.{signature}",
        f"{version}.{other_payload}.{signature}",
        f"{version}.{payload}.{flipped}",
    ]
    for token in forged:
        with pytest.raises(InvalidUploadToken, match="not gpufarm's"):
            verify(token, KEY, NOW)


def test_an_expired_token_is_refused_from_its_expiry_on() -> None:
    expires = NOW + timedelta(hours=1)
    token = mint(1, ALICE, expires, KEY)
    assert verify(token, KEY, expires - timedelta(seconds=1)).ir == 1
    for now in (expires, expires + timedelta(days=400)):
        with pytest.raises(InvalidUploadToken, match="expired"):
            verify(token, KEY, now)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "gfu1",
        "gfu1..",
        "gfu1.abc",
        "gfu2.YWJj.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "gfu1.YWJj.AAAA",
        "gfu1.YW+j.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "gfu1.YWJj.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.extra",
        " gfu1.YWJj.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "gfu1.YWJjé.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "Bearer gfu1.YWJj.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ],
)
def test_a_malformed_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidUploadToken, match="malformed"):
        verify(token, KEY, NOW)


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "1:U1",
        "0:U0000000001:1796000000",
        "1:U0000000001:0",
        "1:U:1:2",
        "-1:U1:1796000000",
        "1:U 1:1796000000",
        "1000000000:U1:1796000000",
        "1:U1:99999999999999",
        "\x00",
        "1:" + "U" * 65 + ":1796000000",
    ],
)
def test_a_signed_payload_gpufarm_never_mints_is_refused_as_malformed(payload: str) -> None:
    # Only a holder of the key could make these; they are still refused cleanly, never a crash.
    token = _signed(payload)
    if len(token) > MAX_TOKEN_CHARS:
        pytest.skip("refused unread as oversize; covered below")
    with pytest.raises(InvalidUploadToken, match="malformed"):
        verify(token, KEY, NOW)


def test_an_oversize_token_is_refused_unread_and_at_once() -> None:
    valid = mint(1, ALICE, NOW + timedelta(hours=1), KEY)
    padded = valid + "A" * (MAX_TOKEN_CHARS + 1 - len(valid))
    huge = "gfu1." + "A" * 10_000_000 + "." + "A" * 43
    started = time.perf_counter()
    for token in (padded, huge):
        with pytest.raises(InvalidUploadToken, match="malformed"):
            verify(token, KEY, NOW)
    assert time.perf_counter() - started < 0.5


def test_the_refusal_never_repeats_the_token() -> None:
    token = mint(1, ALICE, NOW, KEY)
    with pytest.raises(InvalidUploadToken) as refused:
        verify(token, KEY, NOW)
    assert token.split(".")[1] not in str(refused.value) and token.split(".")[2] not in str(refused.value)


def test_gpufarm_never_mints_with_a_weak_key_or_for_a_non_user() -> None:
    for ir, user, expires, key, why in [
        (1, ALICE, NOW, b"short", "at least 16 bytes"),
        (0, ALICE, NOW, KEY, "out of range"),
        (1, "U1:2", NOW, KEY, "not a Slack user id"),
        (1, ALICE, NOW.replace(tzinfo=None), KEY, "timezone-aware"),
    ]:
        with pytest.raises(ValueError, match=why):
            mint(ir, user, expires, key)


# -- the farm: leases, the worker, Slack ------------------------------------------------------------------------


@dataclass(frozen=True)
class Said:
    """One answer through a response_url, with whether it was posted in the channel."""

    url: str
    text: str
    blocks: str
    in_channel: bool


class TeamChat(FakeChat):
    """FakeChat with one user group per team, which records whether an answer went to the channel."""

    def __init__(self) -> None:
        super().__init__(operators=frozenset({OPS}))
        self.groups = {NLP_GROUP: frozenset({ALICE, MATE}), VISION_GROUP: frozenset({BOB})}
        self.said: list[Said] = []

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        if usergroup in self.groups:
            return self.groups[usergroup]
        return super().usergroup_members(usergroup)

    def respond(
        self,
        response_url: str,
        text: str,
        blocks: Sequence[Mapping[str, Any]] | None = None,
        *,
        replace_original: bool = False,
        in_channel: bool = False,
    ) -> None:
        self.said.append(Said(response_url, text, str(blocks or ""), in_channel))
        super().respond(response_url, text, blocks, replace_original=replace_original, in_channel=in_channel)


@dataclass
class Farm:
    chat: TeamChat
    clock: FakeClock
    incidents: FakeIncidents

    @property
    def svc(self) -> GpuFarm:
        return rt.current().service()

    def lease(self, user: str, team: str, days: int = 7) -> int:
        """A request submitted and allocated: its IR."""
        values = {
            "gpu_count": "8",
            "gpu_model": "H100",
            "environment": "hpc",
            "team": team,
            "project": "p",
            "duration_days": str(days),
        }
        request = build_request(
            values, self.svc.context.farm, requester=user, channel=None, request_id=f"tok-{next(_ids):06d}"
        )
        self.svc.submit_request(request)
        ir = max(r.public_id for r in self.incidents.records.values())
        self.svc.process(self.incidents.by_ir(ir).id)
        return ir

    def alloc(self, ir: int) -> Allocation:
        return self.svc.allocation(ir)

    def ask(self, user: str, text: str) -> dict[str, Any]:
        """`/gpu <text>` as `user`, handed to the worker as the ingress does; the worker's summary."""
        verb, _, rest = text.partition(" ")
        command: dict[str, Any] = {"verb": verb}
        if rest:
            command["ir"] = int(rest.removeprefix("IR-"))
        job = {"kind": "command", "user": user, "channel": CHANNEL, "response_url": URL, "command": command}
        result: dict[str, Any] = slack_worker.handle(job)
        return result

    def token_for(self, user: str, ir: int) -> str:
        """The token the answer to `/gpu profile-token IR-n` carries, in its blocks and nowhere else."""
        summary = self.ask(user, f"profile-token IR-{ir}")
        assert summary["ok"] is True
        answer = self.chat.said[-1]
        token = _token_in(answer.blocks)
        # Not in the fallback text (notifications) nor in the worker's summary (which logs may keep).
        assert token not in answer.text and token not in str(summary)
        return token


def _wire(clock: FakeClock, incidents: FakeIncidents, hosts: FakeHosts, chat: TeamChat) -> None:
    """The worker's runtime over the fakes (no queue: the use cases run inline)."""
    rt.reset()
    rt.override(
        clock=clock,
        incidents=incidents,
        hosts=hosts,
        chat=chat,
        metrics=FakeMetrics(),
        monitor_states=FakeMonitorStates(),
        farm=parse_farm(MEMBERS_YAML),
    )


@pytest.fixture
def farm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Farm]:
    for name in ("GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_OPERATORS_USERGROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFARM_UPLOAD_TOKEN_SECRET", KEY.decode())
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(4):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = TeamChat()
    _wire(clock, incidents, hosts, chat)
    world = Farm(chat, clock, incidents)
    # IR-1: nlp's lease (ALICE's), IR-2: vision's (BOB's).
    assert world.lease(ALICE, "nlp") == 1
    assert world.lease(BOB, "vision") == 2
    yield world
    rt.reset()


@pytest.mark.parametrize("user", [ALICE, MATE], ids=["requester", "team member"])
def test_the_lease_s_people_get_a_token_for_it_alone_until_at_most_a_day_ahead(farm: Farm, user: str) -> None:
    token = farm.token_for(user, 1)
    claims = verify(token, KEY, farm.clock.now())
    assert claims.ir == 1 and claims.user == user
    alloc = farm.alloc(1)
    assert alloc.expires_at is not None
    assert claims.expires == min(alloc.expires_at, farm.clock.now() + MAX_LIFETIME).replace(microsecond=0)
    check_for_lease(claims, alloc, farm.svc.context.membership())


def test_the_token_is_told_to_the_asker_alone_never_posted_to_a_channel(farm: Farm) -> None:
    posts_before = len(farm.chat.sent)
    token = farm.token_for(MATE, 1)
    answer = farm.chat.said[-1]
    assert answer.url == URL and answer.in_channel is False
    # Nothing but that ephemeral answer was sent, and no other message anywhere carries the token.
    new = farm.chat.sent[posts_before:]
    assert [s.kind for s in new] == ["respond"]
    assert not any(token in s.text or token in str(s.blocks) for s in farm.chat.sent[:posts_before])


def test_the_allocation_dm_gives_the_hint_not_a_token(farm: Farm) -> None:
    dms = [s for s in farm.chat.to(ALICE) if "is allocated" in str(s.blocks)]
    assert dms and "/gpu profile-token IR-1" in str(dms[0].blocks)
    assert not any("gfu1." in s.text or "gfu1." in str(s.blocks) for s in farm.chat.sent)


@pytest.mark.parametrize("user", [BOB, NOBODY], ids=["researcher of another team", "user in no team"])
def test_others_are_told_only_whose_lease_it_is(farm: Farm, user: str) -> None:
    result = farm.ask(user, "profile-token IR-1")
    assert result["ok"] is False
    said = farm.chat.said[-1]
    assert "IR-1 belongs to another team" in said.text and not said.in_channel
    assert not any("gfu1." in s.text or "gfu1." in str(s.blocks) for s in farm.chat.sent)


def test_an_operator_sees_the_lease_but_gets_no_token_for_it(farm: Farm) -> None:
    # Operators read every lease; uploading runs is for the lease's own people (profile_runs.check_uploader).
    assert farm.ask(OPS, "profile-token IR-1")["ok"] is False
    assert "members of team nlp can upload runs" in farm.chat.said[-1].text
    assert "gfu1." not in farm.chat.said[-1].text + farm.chat.said[-1].blocks


def test_an_ended_lease_gets_no_token(farm: Farm) -> None:
    farm.svc.release(1, ALICE)
    farm.svc.process(farm.incidents.by_ir(1).id)
    assert farm.ask(ALICE, "profile-token IR-1")["ok"] is False
    assert "IR-1 has ended" in farm.chat.said[-1].text


def test_a_token_ends_with_its_lease_when_the_lease_ends_first(farm: Farm) -> None:
    alloc = farm.alloc(1)
    assert alloc.expires_at is not None
    farm.clock.advance(seconds=(alloc.expires_at - farm.clock.now() - timedelta(hours=2)).total_seconds())
    claims = verify(farm.token_for(ALICE, 1), KEY, farm.clock.now())
    assert claims.expires == alloc.expires_at.replace(microsecond=0)
    assert expiry(alloc, farm.clock.now()) == alloc.expires_at


def test_a_token_replayed_for_another_lease_is_refused(farm: Farm) -> None:
    claims = verify(farm.token_for(ALICE, 1), KEY, farm.clock.now())
    with pytest.raises(InvalidUploadToken, match="not for IR-2"):
        check_for_lease(claims, farm.alloc(2), farm.svc.context.membership())


def test_a_token_dies_when_its_lease_ends(farm: Farm) -> None:
    token = farm.token_for(MATE, 1)
    farm.svc.release(1, ALICE)
    farm.svc.process(farm.incidents.by_ir(1).id)
    # The signature and the expiry still hold; the lease does not.
    claims = verify(token, KEY, farm.clock.now())
    with pytest.raises(Conflict, match="IR-1 has ended"):
        check_for_lease(claims, farm.alloc(1), farm.svc.context.membership())


def test_a_token_dies_when_its_user_leaves_the_team(farm: Farm) -> None:
    claims = verify(farm.token_for(MATE, 1), KEY, farm.clock.now())
    farm.chat.groups[NLP_GROUP] = frozenset({ALICE})
    with pytest.raises(NotAllowed, match="members of team nlp can upload runs"):
        check_for_lease(claims, farm.alloc(1), farm.svc.context.membership())


def test_a_token_for_someone_never_on_the_lease_is_refused(farm: Farm) -> None:
    # Signed by gpufarm's key (a mistake, or an operator's tooling): the lease's rule still refuses it.
    claims = verify(mint(1, BOB, farm.clock.now() + timedelta(hours=1), KEY), KEY, farm.clock.now())
    with pytest.raises(NotAllowed, match="can upload runs"):
        check_for_lease(claims, farm.alloc(1), farm.svc.context.membership())


def test_without_the_key_no_token_is_given_and_the_key_is_named_not_shown(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFARM_UPLOAD_TOKEN_SECRET")
    _wire(farm.clock, farm.incidents, FakeHosts(), farm.chat)
    assert farm.ask(ALICE, "profile-token IR-1")["ok"] is False
    said = farm.chat.said[-1]
    assert "gfu1." not in said.text + said.blocks and not said.in_channel


# -- end to end on the local host ----------------------------------------------------------------------------------


@pytest.fixture
def local_farm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFarm]:
    """The local host with the example farm's teams, as `gpufarm local` runs it (the key is its own)."""
    path = tmp_path / "farm.yaml"
    path.write_text(without_inventory(EXAMPLE_FARM.read_text()))
    with start_local(port=0) as local, driven(local, path) as farm:
        yield farm


def test_on_the_local_host_the_token_comes_ephemeral_to_the_asker_alone(local_farm: LocalFarm) -> None:
    farm = local_farm
    farm.slash(LOCAL_ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=2")
    assert farm.settle()
    allocated = farm.answer(LOCAL_ALICE, "IR-")
    ir = ir_in(allocated["text"]) if allocated is not None else None
    assert ir is not None
    farm.slash(LOCAL_ALICE, f"profile-token IR-{ir}")
    assert farm.settle()
    answer = farm.answer(LOCAL_ALICE, "Upload token")
    assert answer is not None and answer["kind"] == "response" and answer["response_type"] == "ephemeral"
    token = _token_in(str(answer["blocks"]))
    assert token not in answer["text"]
    claims = verify(token, LOCAL_UPLOAD_TOKEN_SECRET.encode(), datetime.now(UTC))
    assert (claims.ir, claims.user) == (ir, LOCAL_ALICE.id)
    farm.slash(LOCAL_BOB, f"profile-token IR-{ir}")
    assert farm.settle()
    told = farm.answer(LOCAL_BOB, "belongs to another team")
    assert told is not None and "gfu1." not in f"{told['text']}{told['blocks']}"
    # No message anywhere but Alice's own ephemeral answer carries the token.
    carrying = [m for m in farm.messages() if token in str(m["text"]) or token in str(m["blocks"])]
    assert [(m["kind"], m["target"], m["response_type"]) for m in carrying] == [
        ("response", LOCAL_ALICE.id, "ephemeral")
    ]
