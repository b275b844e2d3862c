"""Idle reclaim under faults, driven only by node-agent metrics through the monitors the local setup made.

With 20 % of gpufarm's Datadog and Slack calls answered 429/500/503 (half of the 5xx after the call was served),
two idle leases and a busy one: each idle lease is warned (the DM delivered and the step recorded in its history)
and then reclaimed exactly once after its grace period, and the busy lease is never warned and keeps its host.
With Slack down the warning cannot be delivered: nothing is recorded and nothing is reclaimed, however long the
lease stays idle; once Slack is back the monitor's re-notification delivers the warning, and only a grace period
after that is the lease reclaimed.

Faults hit gpufarm's calls (the Datadog API and Slack); the metric intake is left alone, since pushing metrics is
the node agent's part (its own retries are tested with the agent). The harness reads the sandbox with the faults
paused, so what it checks is what gpufarm did.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from attack import Target

from gpufarm.core.kernel import history
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.handlers import runtime
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB, CAROL, Person

pytestmark = pytest.mark.hardening

# gpufarm's calls: the Datadog API but the metric intake, and Slack (Web API and response URLs).
FAULT_PATHS = r"^/(api/(?!v2/series)|slack/)"
FAULTY = {"rate": 0.2, "statuses": [429, 500, 503], "paths": FAULT_PATHS, "after": 0.5}
SLACK_DOWN = {"rate": 1.0, "statuses": [503], "paths": r"^/slack/"}
STEP_S = 20 * 60  # one step of the sandbox clock: metrics for it, one evaluation, the scheduled sync
WARNING = "is idle and will be reclaimed"


@pytest.fixture
def farm(target: Target) -> Iterator[LocalFarm]:
    """A fresh farm on the module's local host (workspace, hosts, the local Datadog setup with its monitors)."""
    fresh = LocalFarm.ready(target.local, drain_s=30)
    try:
        yield fresh
    finally:
        fresh.post("/_sandbox/faults", {})
        fresh.settle(timeout=30)
        fresh.close()
        runtime.reset()


class Day:
    """Leases, node-agent metrics on the sandbox clock, faults on and off, and the checks' reads."""

    def __init__(self, farm: LocalFarm) -> None:
        self.farm = farm
        self.hosts: dict[str, tuple[int, bool]] = {}  # host -> the lease on it, and whether its GPUs work
        self.pushed_to = 0
        self.faults: dict[str, Any] = {}
        self.injected = 0

    def lease(self, who: Person, text: str) -> int:
        self.farm.slash(who, text)
        assert self.farm.settle(timeout=60)
        ir = ir_in(self.farm.messages(user=who.id, kind="response", contains="IR-")[-1]["text"])
        assert ir is not None
        alloc = self.farm.allocation(ir)
        assert alloc.phase is Phase.ALLOCATED, alloc.phase
        return ir

    def fault(self, spec: dict[str, Any]) -> None:
        """Start a fault plan (or none); what the previous plan injected is counted."""
        if self.faults:
            self.injected += int(self.farm.get("/_sandbox/faults").get("injected", 0) or 0)
        self.faults = spec
        assert self.farm.post("/_sandbox/faults", {})[0] == 200
        if spec:
            assert self.farm.post("/_sandbox/faults", spec)[0] == 200

    def read(self, ir: int) -> Allocation:
        """The incident as it is, read with the faults paused."""
        was = self.faults
        self.fault({})
        try:
            return self.farm.allocation(ir)
        finally:
            self.fault(was)

    def messages(self, user: Person, contains: str) -> list[dict[str, Any]]:
        was = self.faults
        self.fault({})
        try:
            return self.farm.messages(user=user.id, kind="dm", contains=contains)
        finally:
            self.fault(was)

    def step(self, seconds: int = STEP_S, *, history_s: int = 0) -> None:
        """The agents' points up to the next step (one a minute), the clock moved, the sync run, all settled."""
        now = self._now()
        start = now - history_s if history_s else self.pushed_to + 60
        stamps = range(int(start), int(now + seconds) + 1, 60)
        series = [
            s
            for host, (ir, busy) in self.hosts.items()
            for i in range(8)
            for s in _node_series(host, ir, i, busy, stamps)
        ]
        self.farm.gateway.submit(series)
        self.pushed_to = stamps[-1]
        self.farm.post("/_sandbox/clock", {"advance": seconds})
        assert self.farm.settle(timeout=120)
        self.farm.host.submit("QuotaSyncFunction", {"job": "quota_sync"})
        assert self.farm.settle(timeout=120)

    def _now(self) -> float:
        state: Any = self.farm.get("/_sandbox/clock")
        return float(state["now"])


def _node_series(host: str, ir: int, index: int, busy: bool, stamps: range) -> list[MetricSeries]:
    """What gpufarm-node sends for one whole GPU of a lease's host (spec/metrics.yaml)."""
    uuid = f"gpu-{zlib.crc32(host.encode()):08x}-0000-4000-8000-{index:012x}"
    tags = (f"gpu_uuid:{uuid}", f"gpu_index:{index}", "gpu_slicing_mode:none", f"gpu_ir:ir-{ir}")

    def gauge(metric: str, value: float, *extra: str) -> MetricSeries:
        return MetricSeries(metric, tuple(MetricPoint(t, value) for t in stamps), (*tags, *extra), host=host)

    states = {"busy": busy, "idle": not busy, "idle_held": False}
    return [
        gauge("gpufarm.gpu.utilization", 88.0 if busy else 0.0),
        gauge("gpufarm.gpu.processes", 1.0 if busy else 0.0),
        *(gauge("gpufarm.gpu.idle_state", 1.0 if on else 0.0, f"state:{s}") for s, on in states.items()),
    ]


def _steps(alloc: Allocation, step: history.Step) -> list[history.Entry]:
    entries = [history.parse(line) for line in alloc.history]
    return [e for e in entries if e is not None and e.step == step.value]


def _delivered_at(messages: list[dict[str, Any]]) -> datetime:
    return datetime.fromtimestamp(min(float(m["ts"]) for m in messages), UTC)


@pytest.mark.timeout(300)
def test_with_a_fifth_of_calls_failing_every_idle_lease_is_reclaimed_once_after_its_warning(farm: LocalFarm) -> None:
    day = Day(farm)
    idle = {ALICE: day.lease(ALICE, "request 8 H100 project=idle-a team=nlp env=onprem-hpc")}
    idle[CAROL] = day.lease(CAROL, "request 8 A100 project=idle-c team=speech env=cloud-aws")
    busy = day.lease(BOB, "request 8 H100 project=busy-b team=vision env=onprem-hpc")
    hosts = {ir: tuple(farm.allocation(ir).hosts) for ir in [*idle.values(), busy]}
    for ir, held in hosts.items():
        day.hosts.update(dict.fromkeys(held, (ir, ir == busy)))

    day.fault({**FAULTY, "seed": 10})
    day.step(60, history_s=50 * 60)  # 50 minutes of history: the idle groups alert at the next evaluation
    for _ in range(7):  # 140 minutes: the grace (60) after the warning, with room for retried deliveries
        if all(day.read(ir).state is State.RESOLVED for ir in idle.values()):
            break
        day.step()
    day.fault({})
    assert farm.settle(timeout=120)
    assert day.injected > 0

    for who, ir in idle.items():
        alloc = farm.allocation(ir)
        assert alloc.state is State.RESOLVED and alloc.reclaim_reason is ReclaimReason.IDLE, (ir, alloc.phase)
        [reclaimed] = _steps(alloc, history.Step.RECLAIMED)
        warned = _steps(alloc, history.Step.WARNED)
        assert warned and warned[0].at < reclaimed.at, alloc.history
        # The warning reached the requester before the reclaim, a grace period (60 min) before it at least.
        delivered = day.messages(who, f"IR-{ir} {WARNING}")
        assert delivered, f"IR-{ir} was reclaimed without a delivered warning"
        assert (reclaimed.at - _delivered_at(delivered)).total_seconds() >= 60 * 60 - 60
        for host in hosts[ir]:
            assert not farm.ir_tags(host), (host, farm.ir_tags(host))
    kept = farm.allocation(busy)
    assert kept.phase is Phase.ALLOCATED and not _steps(kept, history.Step.WARNED)
    assert not farm.messages(user=BOB.id, kind="dm", contains=WARNING)
    assert farm.ir_tags(hosts[busy][0]) == [f"ir:ir-{busy}"]


@pytest.mark.timeout(300)
def test_with_slack_down_the_warning_waits_and_so_does_the_reclaim(
    farm: LocalFarm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is tested is the queue's redeliveries and the monitor's re-notifications, not the adapter's own retries
    # (seconds of backoff per call): the functions make one attempt per call here.
    monkeypatch.setenv("GPUFARM_MAX_RETRIES", "0")
    runtime.reset()
    day = Day(farm)
    ir = day.lease(ALICE, "request 8 H100 project=quiet team=nlp env=onprem-hpc")
    day.hosts.update(dict.fromkeys(farm.allocation(ir).hosts, (ir, False)))

    day.fault(SLACK_DOWN)
    day.step(60, history_s=50 * 60)  # the idle group alerts; the warning cannot be delivered
    for _ in range(4):  # 80 minutes idle with Slack down: past the grace and one re-notification
        alloc = day.read(ir)
        assert alloc.state is not State.RESOLVED, "reclaimed while its warning could not be delivered"
        assert not _steps(alloc, history.Step.WARNED), "a warning nobody received was recorded"
        day.step()
    day.fault({})
    for _ in range(3):  # Slack is back: the next re-notification delivers the warning
        if day.read(ir).phase is Phase.IDLE_WARNED:
            break
        day.step()
    alloc = farm.allocation(ir)
    assert alloc.phase is Phase.IDLE_WARNED and len(_steps(alloc, history.Step.WARNED)) == 1, alloc.history
    [warning] = farm.messages(user=ALICE.id, kind="dm", contains=f"IR-{ir} {WARNING}")
    for _ in range(4):  # the grace runs from the delivered warning
        if farm.allocation(ir).state is State.RESOLVED:
            break
        day.step()
    alloc = farm.allocation(ir)
    assert alloc.state is State.RESOLVED and alloc.reclaim_reason is ReclaimReason.IDLE
    [reclaimed] = _steps(alloc, history.Step.RECLAIMED)
    assert (reclaimed.at - _delivered_at([warning])).total_seconds() >= 60 * 60 - 60
