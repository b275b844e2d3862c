"""The squatter monitor's notifications through the idle webhook (gpufarm.handlers.squatter_alert): routed by the
monitor's kind tag, validated as the idle alerts are, one command per notification in the hurt lease's pool group
(a device no lease holds: the unassigned group, keyed by the notification); a malformed or hostile scope, a stale
notification and a transition that means nothing change nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fakes import (
    FARM_YAML,
    FakeChat,
    FakeClock,
    FakeHosts,
    FakeIncidents,
    FakeMetrics,
    FakeMonitorStates,
    FakeQueue,
    ask_hpc,
)

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.hosts import SQUATTER_MONITOR_TAG
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import ScalarResult
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import idle_alert, runtime

EVENTS = Path(__file__).resolve().parents[2] / "events"
SECRET = "test-webhook-secret-0000"
HOLDER = "U0000000002"
OPS_CHANNEL = "C0000000001"
DEVICE = "gpu-00000000-0000-4000-8000-000000000001"
MONITOR = 4242
GROUP = f"gpu_ir:ir-1,gpu_uuid:{DEVICE},host:hpc-1"
TAGS = f"gpufarm:managed,gpufarm_monitor_key:squatter,{SQUATTER_MONITOR_TAG}"


class Squatters:
    """The metrics query the step reads the device's squatters through: one process."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        self.asked.append(query)
        tags = ("pid:4242", "user:mallory", "claimed_ir:ir-9", "kube_namespace:N/A", "pod_name:N/A")
        return [ScalarResult(tags, 1.0)]


class Parts:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.incidents = FakeIncidents(self.clock)
        self.hosts = FakeHosts()
        self.hosts.seed("hpc-1", "H100", 8, "hpc")
        self.chat = FakeChat(operators=frozenset({"U0000000009"}))
        self.queue = FakeQueue()
        self.monitors = FakeMonitorStates()
        self.farm = parse_farm(FARM_YAML)
        self.squatters = Squatters()

    def alloc(self) -> Allocation:
        return Allocation.from_record(self.incidents.get_by_ir(1))


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Parts]:
    for name in ("GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_OPERATORS_USERGROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    p = Parts()
    svc = GpuFarm(incidents=p.incidents, hosts=p.hosts, chat=p.chat, clock=p.clock, farm=p.farm, metrics=FakeMetrics())
    assert ask_hpc(svc, p.incidents, HOLDER, 8, 7) == 1
    runtime.reset()
    runtime.override(
        clock=p.clock,
        incidents=p.incidents,
        hosts=p.hosts,
        metrics=FakeMetrics(),
        chat=p.chat,
        farm=p.farm,
        queue=None,
        monitor_states=p.monitors,
        metrics_query=p.squatters,
    )
    yield p
    runtime.reset()


def _notification(transition: str = "Triggered", scope: str = GROUP, date: str = "1700003600000", **more: str) -> Any:
    sent: dict[str, Any] = json.loads((EVENTS / "idle_alert_triggered.json").read_text())
    body = {"alert_id": str(MONITOR), "alert_transition": transition, "alert_scope": scope, "date": date, "tags": TAGS}
    sent["body"] = json.dumps({**body, **more})
    return sent


def _answer(sent: Any) -> tuple[int, dict[str, Any]]:
    out = idle_alert.handle(sent)
    return out["statusCode"], json.loads(out["body"])


def _squatter_posts(parts: Parts) -> list[tuple[str, str]]:
    return [(s.kind, s.target) for s in parts.chat.sent if "squatter" in s.text or "runs on" in s.text]


def test_a_squatter_notification_tells_once_and_is_no_idle_alert(parts: Parts) -> None:
    status, body = _answer(_notification(message="value=2 process(es)"))
    assert status == 200 and body["outcome"].endswith("told") and body["lease"] == "IR-1", body
    assert _squatter_posts(parts) == [("post", OPS_CHANNEL), ("dm", HOLDER)]
    (asked,) = parts.squatters.asked
    assert asked.startswith(f"max:gpufarm.process.squatter{{host:hpc-1,gpu_uuid:{DEVICE}}} by {{pid,user,")
    told = str(parts.chat.sent[-1].blocks)
    assert "pid 4242 (user `mallory`, claims `ir-9`)" in told and "N/A" not in told
    assert parts.alloc().phase is Phase.ALLOCATED  # not taken for an idle alert
    # The same notification again, and a re-notification: nothing more is posted.
    assert _answer(_notification(message="value=2 process(es)"))[1]["outcome"].startswith("already applied")
    assert "nothing to do" in _answer(_notification("Renotify", date="1700003900000"))[1]["outcome"]
    assert len(_squatter_posts(parts)) == 2
    assert "ended" in _answer(_notification("Recovered", date="1700004000000"))[1]["outcome"]
    assert parts.alloc().squatters == ()


def test_with_a_queue_one_notification_is_one_command_in_its_pool_s_group(parts: Parts) -> None:
    runtime.override(queue=parts.queue)
    for _ in range(2):
        status, body = _answer(_notification())
        assert status == 202 and body["queued"] == "squatter"
    ((group, message),) = parts.queue.sent
    assert group == "hpc" and message["command"]["squatter"] == {"host": "hpc-1", "device": DEVICE}
    # A device no lease holds: the operators' alone, in the unassigned group, keyed by the notification.
    unheld = f"gpu_ir:none,gpu_uuid:{DEVICE},host:hpc-9"
    for _ in range(2):
        assert _answer(_notification(scope=unheld))[1] == {
            "lease": "no lease",
            "host": "hpc-9",
            "device": DEVICE,
            "queued": "squatter",
        }
    assert [g for g, _ in parts.queue.sent] == ["hpc", "unassigned"]
    # Its re-notifications and recovery tell no one: there is no episode to end.
    for transition in ("Renotify", "Recovered"):
        assert "no lease holds" in _answer(_notification(transition, scope=unheld, date="1700009999000"))[1]["ignored"]
    assert len(parts.queue.sent) == 2


@pytest.mark.parametrize(
    "scope",
    [
        "host:hpc-1",  # no device, no lease
        f"gpu_ir:ir-1,gpu_uuid:{DEVICE},host:hpc-1,host:hpc-2",  # two hosts
        f"gpu_ir:ir-1,gpu_ir:ir-2,gpu_uuid:{DEVICE},host:hpc-1",  # two leases
        "gpu_ir:ir-1,gpu_uuid:gpu-not-a-uuid,host:hpc-1",
        f"gpu_ir:ir-x,gpu_uuid:{DEVICE},host:hpc-1",
        f"gpu_ir:ir-1,gpu_uuid:{DEVICE},host:<!channel>",
        "x" * 2001,
    ],
)
def test_a_malformed_or_hostile_scope_changes_nothing(parts: Parts, scope: str) -> None:
    status, body = _answer(_notification(scope=scope))
    assert status in (200, 400) and ("ignored" in body or "error" in body), body
    assert _squatter_posts(parts) == [] and parts.alloc().squatters == ()


def test_a_stale_or_meaningless_notification_changes_nothing(parts: Parts) -> None:
    parts.monitors.set(MONITOR, GROUP, "OK")
    status, body = _answer(_notification())
    assert status == 200 and "stale Triggered" in body["ignored"]
    assert _answer(_notification("No Data"))[1]["ignored"].startswith("transition")
    assert _squatter_posts(parts) == []
