"""The App Home: the view a user's Home shows (pure), its publication when the tab opens (the worker's `home` job),
and its refresh after each change to the user's leases: once per requester per unit of pool work, never failing
that work. Over in-memory ports (no sockets)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeMonitorStates, FakeQueue

from gpufarm.core.chat.home import MAX_VIEW_BLOCKS, HomeData, Waiting, home_view
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.hosts import GpuUnit
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.kernel.units import encode_devices
from gpufarm.core.leases import home
from gpufarm.handlers import idle_alert, incident_webhook, runtime, slack_worker
from gpufarm_sandbox.emulator.slack_blockkit import block_text

EVENTS = Path(__file__).resolve().parents[2] / "events"
OPS = "U0000000OPS"
ALICE = "U0000000001"
VICTOR = "U0000000007"
RESPONSE_URL = "https://hooks.slack.com/commands/T0000000001/1111111111111/FAKEfakeFAKEfakeFAKEfake"
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


class Parts:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.incidents = FakeIncidents(self.clock)
        self.hosts = FakeHosts()
        for i in (1, 2):
            self.hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
        self.chat = FakeChat(operators=frozenset({OPS}))
        self.queue = FakeQueue()

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.get_by_ir(ir))

    def homes(self, user: str) -> int:
        return sum(1 for s in self.chat.sent if s.kind == "home" and s.target == user)


class NoUsage:
    """The utilisation query of the operators' card: nothing measured (no Datadog here)."""

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[Any]:
        return []


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Parts]:
    for name in ("GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_OPERATORS_USERGROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", "test-webhook-secret-0000")
    p = Parts()
    runtime.reset()
    runtime.override(
        clock=p.clock,
        incidents=p.incidents,
        hosts=p.hosts,
        metrics=FakeMetrics(),
        chat=p.chat,
        farm=parse_farm(FARM_YAML),
        queue=p.queue,
        monitor_states=FakeMonitorStates(),
        metrics_query=NoUsage(),
    )
    yield p
    runtime.reset()


def _sqs(body: dict[str, Any]) -> dict[str, Any]:
    sample: dict[str, Any] = json.loads((EVENTS / "sqs_allocation_message.json").read_text())
    sample["Records"][0]["body"] = json.dumps(body)
    return sample


def consume(parts: Parts) -> int:
    """Be the queue consumer for everything queued so far, in order; how many messages it ran."""
    ran = 0
    while parts.queue.sent:
        sent, parts.queue.sent = parts.queue.sent, []
        for _, body in sent:
            assert incident_webhook.handle(_sqs(body)) == {"batchItemFailures": []}
            ran += 1
    return ran


def request(parts: Parts, user: str = ALICE, count: int = 8, team: str = "nlp", rid: str = "slack-cmd-1") -> int:
    req = {
        "team": team,
        "project": "llm-ko",
        "gpu_model": "H100",
        "gpu_count": count,
        "environment": "hpc",
        "duration_days": 7,
        "purpose": "",
        "requester": user,
        "channel": "C0000000002",
        "request_id": rid,
    }
    job = {"kind": "request", "user": user, "channel": "C0000000002", "response_url": RESPONSE_URL, "request": req}
    slack_worker.handle(job)
    consume(parts)
    return max(a.ir for a in (Allocation.from_record(r) for r in parts.incidents.records.values()))


def allocate(parts: Parts, ir: int) -> None:
    incident_webhook.handle(_sqs({"incident_id": parts.alloc(ir).incident_id}))


def texts(view: dict[str, Any]) -> str:
    return block_text([view])


def buttons(view: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (e["action_id"], e["value"])
        for b in view["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["type"] == "button"
    ]


# -- opening the tab ------------------------------------------------------------------------------------------------


def test_opening_the_home_publishes_the_users_leases_with_their_buttons(parts: Parts) -> None:
    ir = request(parts)
    allocate(parts, ir)
    parts.chat.homes.clear()
    assert slack_worker.handle({"kind": "home", "user": ALICE}) == {"ok": True, "kind": "home"}
    view = parts.chat.homes[ALICE]
    assert view["type"] == "home" and len(view["blocks"]) <= MAX_VIEW_BLOCKS
    shown = texts(view)
    assert f"IR-{ir}" in shown and "`hpc-1` (8 GPUs)" in shown and "not measured yet" in shown
    assert "`nlp` H100 in `hpc`: 8 / 8 GPUs (hard limit 16)" in shown
    # The buttons are the ones its messages carry: the same action ids and the IR as their value.
    assert buttons(view) == [("gpu_extend", f"IR-{ir}"), ("gpu_release", f"IR-{ir}")]
    assert "Queue (all teams)" not in shown  # a researcher sees no other team's queue


def test_a_home_that_cannot_be_read_is_logged_and_nothing_else_happens(parts: Parts, monkeypatch: Any) -> None:
    def fail(*_: Any, **__: Any) -> None:
        raise UpstreamError("slack views.publish failed: ratelimited")

    monkeypatch.setattr(parts.chat, "publish_home", fail)
    answer = slack_worker.handle({"kind": "home", "user": ALICE})
    assert answer["ok"] is False and answer["kind"] == "home"
    assert [s for s in parts.chat.sent if s.kind != "home"] == []  # no DM, no error message posted


# -- refreshed after each change ------------------------------------------------------------------------------------


def test_each_change_publishes_the_requesters_home_once(parts: Parts) -> None:
    ir = request(parts)  # one create: its decision wrote the incident
    assert parts.homes(ALICE) == 1
    allocate(parts, ir)  # one allocation: phase, hosts, history written in more than one PATCH
    assert parts.homes(ALICE) == 2
    assert "`hpc-1` (8 GPUs)" in texts(parts.chat.homes[ALICE])
    idle_alert.handle(json.loads((EVENTS / "idle_alert_triggered.json").read_text()))
    assert consume(parts) == 1 and parts.homes(ALICE) == 3
    view = parts.chat.homes[ALICE]
    assert ("gpu_keep", f"IR-{ir}") in buttons(view) and "warned as idle" in texts(view)
    # Work that writes no lease publishes nothing.
    before = len(parts.chat.sent)
    incident_webhook.handle(_sqs({"incident_id": parts.alloc(ir).incident_id}))
    assert [s for s in parts.chat.sent[before:] if s.kind == "home"] == []


def test_an_ended_lease_leaves_the_home_at_once(parts: Parts) -> None:
    ir = request(parts)
    allocate(parts, ir)
    slack_worker.handle(
        {
            "kind": "command",
            "user": ALICE,
            "channel": "C0000000002",
            "response_url": RESPONSE_URL,
            "command": {"verb": "release", "ir": ir, "confirmed": True},
        }
    )
    consume(parts)
    assert parts.alloc(ir).state is State.RESOLVED
    assert f"IR-{ir}" not in texts(parts.chat.homes[ALICE]) and "You hold no GPUs now." in texts(
        parts.chat.homes[ALICE]
    )


def test_the_syncs_hourly_accruals_refresh_no_home() -> None:
    # They write every lease once an hour and change nothing its holder acts on; everything else refreshes.
    assert home.refreshes(IncidentCommand(op=Op.ACCRUE, ir=1)) is False
    assert home.refreshes(IncidentCommand(op=Op.KEEP, ir=1, actor=ALICE)) is True
    assert home.refreshes(None) is True  # a lifecycle step (allocation, reclaim) or a pool's repair


def test_a_failed_publish_never_fails_the_change(parts: Parts, monkeypatch: Any) -> None:
    def fail(*_: Any, **__: Any) -> None:
        raise UpstreamError("slack views.publish failed: ratelimited")

    monkeypatch.setattr(parts.chat, "publish_home", fail)
    ir = request(parts)
    allocate(parts, ir)
    assert parts.alloc(ir).phase is Phase.ALLOCATED and parts.alloc(ir).hosts == ("hpc-1",)


def test_operators_see_the_queue_and_the_leases_warned_as_idle(parts: Parts) -> None:
    ir = request(parts)
    allocate(parts, ir)
    idle_alert.handle(json.loads((EVENTS / "idle_alert_triggered.json").read_text()))
    consume(parts)
    asked = request(parts, user=VICTOR, count=8, team="vision", rid="slack-cmd-2")  # beyond quota: the operators
    assert parts.alloc(asked).phase is Phase.REQUESTED
    slack_worker.handle({"kind": "home", "user": OPS})
    shown = texts(parts.chat.homes[OPS])
    assert "Queue (all teams)* (1)" in shown and f"*IR-{asked}*" in shown
    assert "waiting for a GPU operator's decision" in shown
    assert "Warned as idle* (1)" in shown and f"*IR-{ir}*" in shown
    # The requester sees their own waiting request and why it waits.
    mine = texts(parts.chat.homes[VICTOR])
    assert "Waiting requests* (1)" in mine and "waiting for a GPU operator's decision" in mine


def approve(parts: Parts, ir: int) -> None:
    slack_worker.handle(
        {"kind": "command", "user": OPS, "channel": "C0000000001", "command": {"verb": "approve", "ir": ir}}
    )
    consume(parts)
    allocate(parts, ir)


def test_a_request_waiting_for_hosts_says_its_place_in_the_queue(parts: Parts) -> None:
    allocate(parts, request(parts))  # alice holds hpc-1
    approve(parts, request(parts, user=VICTOR, team="vision", rid="slack-cmd-2"))  # victor holds hpc-2
    waiting = request(parts, rid="slack-cmd-3")  # beyond alice's quota: approved by an operator, no host left
    approve(parts, waiting)
    assert parts.alloc(waiting).phase is Phase.WAITING
    slack_worker.handle({"kind": "home", "user": ALICE})
    shown = texts(parts.chat.homes[ALICE])
    assert f"*IR-{waiting}*" in shown and "waiting for hosts: 1st of 1 waiting for H100" in shown


# -- the view (pure) ------------------------------------------------------------------------------------------------


def lease(ir: int, **fields: Any) -> Allocation:
    base: dict[str, Any] = {
        "incident_id": f"id-{ir}",
        "ir": ir,
        "title": "t",
        "state": State.STABLE,
        "phase": Phase.ALLOCATED,
        "team": "nlp",
        "project": "llm-ko",
        "gpu_model": "H100",
        "gpu_count": 8,
        "environment": "hpc",
        "requester": ALICE,
        "hosts": ("hpc-1",),
        "host_gpus": {"hpc-1": 8},
        "expires_at": NOW + timedelta(days=3),
    }
    return Allocation(**{**base, **fields})


def test_slices_hours_and_busy_share_are_shown_and_text_from_fields_is_inert() -> None:
    slices = [GpuUnit(0, gi, f"mig-0000000{gi}-0000-4000-8000-000000000000", "1g.10gb") for gi in (1, 2)]
    shared = lease(
        7,
        team="nlp<!here>",
        gpu_model="A100",
        gpu_count=2,
        environment="slices",
        hosts=("k8s-a100-01",),
        host_gpus={"k8s-a100-01": 2},
        devices=tuple(encode_devices({"k8s-a100-01": slices})),
        hours_held=10.0,
        hours_busy=6.0,
        hours_idle=2.0,
        hours_unmeasured=2.0,
    )
    shown = texts(home_view(HomeData(user=ALICE, now=NOW, leases=[shared])))
    assert "`k8s-a100-01`: 2 \N{MULTIPLICATION SIGN} A100 1g.10gb slices (0.1, 0.2)" in shown
    assert "*IR-7* 2 \N{MULTIPLICATION SIGN} A100 1g.10gb slices in `slices`" in shown
    assert "75% of 8.0 measured h, 2.0 h unmeasured" in shown and "10.0" in shown
    assert "<!here>" not in shown and "nlp&lt;!here&gt;/llm-ko" in shown


def test_a_home_never_holds_more_blocks_than_slack_takes() -> None:
    many = [lease(i) for i in range(1, 60)]
    waiting = [Waiting(lease(i, phase=Phase.WAITING, hosts=()), "waiting for hosts") for i in range(100, 160)]
    view = home_view(
        HomeData(user=OPS, now=NOW, leases=many, waiting=waiting, operator=True, queue=waiting, idle_warned=many)
    )
    assert len(view["blocks"]) <= MAX_VIEW_BLOCKS
    shown = texts(view)
    assert "… and 47 more: `/gpu list mine`" in shown and "… and 45 more: `/gpu list all`" in shown


def test_a_home_with_nothing_says_so() -> None:
    shown = texts(home_view(HomeData(user=ALICE, now=NOW)))
    assert "You hold no GPUs now." in shown and "Nothing waiting." in shown
    assert "No team of yours has a quota or a budget." in shown
