"""An idle warning is delivered before it is recorded (gpufarm.core.idle.delivery): with Slack failing, nothing is
recorded and the step fails so the alert is retried, and no grace starts, so no reclaim; once Slack takes it the
warning is recorded and the grace runs from then. A refusal no retry can change is recorded undelivered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.idle.delivery import deliver_warning, may_pass_later
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.service import GpuFarm

USER = "U0000000002"


class Refusal(UpstreamError):
    """A Slack failure with its HTTP status, as the adapter raises it."""

    def __init__(self, status: int | None) -> None:
        super().__init__(f"slack failed ({status})")
        self.status = status


class FlakyChat(FakeChat):
    """DMs fail with `failure` while it is set."""

    def __init__(self) -> None:
        super().__init__(operators=frozenset({"U0000000009"}))
        self.failure: UpstreamError | None = None

    def tell_user(self, user: str, text: str, blocks: Sequence[Any] | None = None) -> str:
        if self.failure is not None:
            raise self.failure
        return super().tell_user(user, text, blocks)


def _farm() -> tuple[GpuFarm, FlakyChat, FakeClock, FakeIncidents]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc", "a")
    chat = FlakyChat()
    farm = parse_farm(FARM_YAML)
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, metrics=FakeMetrics())
    values = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
    request = build_request(values, farm, requester=USER, channel="C0000000002", request_id="req-00000001")
    svc.submit_request(request)
    svc.process(incidents.by_ir(1).id)
    return svc, chat, clock, incidents


def _warned(alloc: Allocation) -> int:
    return sum(1 for line in alloc.history if (e := history.parse(line)) is not None and e.step == "warned")


def test_a_warning_slack_did_not_take_is_not_recorded_and_starts_no_grace() -> None:
    svc, chat, clock, incidents = _farm()
    chat.failure = Refusal(503)
    with pytest.raises(UpstreamError):
        svc.idle_triggered(1)
    alloc = Allocation.from_record(incidents.by_ir(1))
    assert alloc.phase is Phase.ALLOCATED and alloc.idle_warned_at is None and _warned(alloc) == 0
    clock.advance(minutes=120)  # far past the grace: still nothing to reclaim, the sync finds nothing due
    assert svc.expire(1).action == "nothing to do (allocated)"
    chat.failure = None
    assert svc.idle_triggered(1).action == "warned"  # the re-notification delivers it
    alloc = Allocation.from_record(incidents.by_ir(1))
    assert alloc.phase is Phase.IDLE_WARNED and alloc.idle_warned_at == clock.now() and _warned(alloc) == 1
    assert [s.kind for s in chat.to(USER) if "is idle" in s.text] == ["dm"]
    clock.advance(minutes=59)
    assert svc.idle_triggered(1).action == "nothing to do (idle-warned)"
    clock.advance(minutes=1)
    assert svc.idle_triggered(1).action == "resolved (idle)"
    assert Allocation.from_record(incidents.by_ir(1)).state is State.RESOLVED


def test_a_refusal_no_retry_can_change_records_the_warning_undelivered() -> None:
    svc, chat, _, incidents = _farm()
    chat.failure = Refusal(200)  # Slack's ok:false answers (user_not_found, account_inactive) come with 200
    assert svc.idle_triggered(1).action == "warned"
    assert Allocation.from_record(incidents.by_ir(1)).phase is Phase.IDLE_WARNED


@pytest.mark.parametrize(("status", "transient"), [(None, True), (429, True), (500, True), (503, True), (404, False)])
def test_what_may_pass_later(status: int | None, transient: bool) -> None:
    assert may_pass_later(Refusal(status)) is transient
    chat = FlakyChat()
    chat.failure = Refusal(status)
    if transient:
        with pytest.raises(UpstreamError):
            deliver_warning(chat, USER, Message("idle"))
    else:
        assert deliver_warning(chat, USER, Message("idle")) is False
    assert deliver_warning(FakeChat(), None, Message("idle")) is False
