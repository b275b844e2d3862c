"""The operators' approval card carries the context a decision needs (gpufarm.core.chat.cards)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat import cards
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.links import Links
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import ScalarResult
from gpufarm.core.leases import operators
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

USER = "U0000000001"
OPS = "U0000000OPS"
OPS_CHANNEL = "C0000000001"
_ids = itertools.count(1)


@dataclass
class FakeUsage:
    """MetricsQuery answering one value per ir, or failing."""

    values: dict[str, float] = field(default_factory=dict)
    fail: bool = False
    queries: list[tuple[str, datetime, datetime]] = field(default_factory=list)

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        self.queries.append((query, start, end))
        if self.fail:
            raise UpstreamError("query metrics failed: 503")
        return [ScalarResult((f"gpu_ir:{ir}",), v) for ir, v in self.values.items()]


@dataclass
class World:
    svc: GpuFarm
    chat: FakeChat
    usage: FakeUsage

    def request(self, count: int, user: str = USER) -> int:
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
        request = build_request(
            values, self.svc.context.farm, requester=user, channel=None, request_id=f"c-{next(_ids):06d}"
        )
        self.svc.submit_request(request)
        record = self.svc.context.incidents.find_by_request_id(request.request_id)
        assert record is not None
        alloc = self.svc.allocation(record.public_id)
        if alloc.phase.value == "approved":
            self.svc.allocate(alloc)
        return record.public_id

    def card(self) -> Message:
        return self.chat.to(OPS_CHANNEL, "post")[-1]


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock()
    hosts = FakeHosts()
    for i in range(4):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    usage = FakeUsage()
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=hosts,
        chat=chat,
        clock=clock,
        farm=parse_farm(FARM_YAML),
        links=Links("https://dd.example"),
        usage=usage,
    )
    yield World(svc, chat, usage)


def _text(message: Message) -> str:
    return "\n".join(b["text"]["text"] for b in message.blocks if b["type"] in ("section", "context") and "text" in b)


def test_the_approval_card_shows_capacity_holdings_utilisation_other_leases_and_the_link(world: World) -> None:
    held = world.request(8)  # within quota: approved by policy and allocated
    world.usage.values = {f"ir-{held}": 12.4}
    asked = world.request(4)  # beyond quota: the operators' card
    text = _text(world.card())
    assert f"<https://dd.example/incidents/{asked}|IR-{asked}>" in text
    assert "Pool `hpc` now: 24 of 32 H100 free" in text
    assert f"Team nlp holds 8 H100 (IR-{held}) in `hpc`, quota 8, hard limit 16" in text
    assert f"last 7 days: mean 12 % over 7 days (IR-{held} 12 %)" in text
    assert f"<@{USER}>'s other live leases: IR-{held} (8x H100 allocated)" in text
    [(query, start, end)] = world.usage.queries
    assert query == f"avg:gpufarm.gpu.utilization{{gpu_ir IN (ir-{held})}} by {{gpu_ir}}"
    assert (end - start).days == 7


def test_a_failed_metrics_query_still_posts_the_card(world: World) -> None:
    world.request(8)
    world.usage.fail = True
    world.request(4)
    text = _text(world.card())
    assert "utilisation unavailable" in text and "needs approval" in text


def test_a_team_holding_nothing_is_said_so(world: World) -> None:
    world.svc.context.farm = parse_farm(FARM_YAML.replace("gpus: 8, hard_limit: 16", "gpus: 0, hard_limit: 16"))
    world.request(4)
    text = _text(world.card())
    assert "Team nlp holds 0 H100 in `hpc`, quota 0, hard limit 16" in text
    assert "no leases holding GPUs" in text and f"<@{USER}> holds no other live lease" in text
    assert world.usage.queries == []


def test_the_utilisation_query_is_bounded() -> None:
    leases: Sequence[Allocation] = [
        Allocation(incident_id=str(n), ir=n, title="t", state="stable", phase="allocated", hosts=("h",))
        for n in range(1, 31)
    ]
    usage = FakeUsage(values={f"ir-{n}": 50.0 for n in range(1, 21)})
    text = operators.utilisation(usage, leases, datetime(2026, 12, 1, tzinfo=UTC))
    assert usage.queries[0][0].count("ir-") == cards.MAX_LEASES
    assert text.startswith("mean 50 % over 7 days") and text.endswith(", 10 more)")


def test_after_the_decision_the_card_says_who_and_why(world: World) -> None:
    world.request(8)
    asked = world.request(4)
    world.svc.reject(asked, OPS, "the team is over its budget this month")
    updates = [s for s in world.chat.sent if s.kind == "update"]
    assert updates
    text = _text(updates[-1])
    assert f"Rejected by <@{OPS}>: the team is over its budget this month" in text
    assert f"|IR-{asked}>" in text
    assert not any(b["type"] == "actions" for b in updates[-1].blocks)
