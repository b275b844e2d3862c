"""The sweep (gpufarm.core.sync.sweep): every incident waiting on a side effect is queued to its pool's writer with
the webhook's dedup id, a sweep with nothing to do writes nothing, and a doctor's probe is never swept."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeQueue

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import incident_step
from gpufarm.core.leases import probe
from gpufarm.core.service import GpuFarm
from gpufarm.core.sync.sweep import ENDED_QUERY

USER = "U0000000001"


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    hosts: FakeHosts
    clock: FakeClock
    queue: FakeQueue | None

    def lease(self, phase: Phase, n: int, *, days: int = 7) -> Allocation:
        values = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
        values["duration_days"] = str(days)
        req = build_request(values, self.svc.context.farm, requester=USER, channel=None, request_id=f"r-sweep-{n:04d}")
        fields = req.to_fields(phase, self.clock.now())
        fields[f.STATE] = State.ACTIVE.value if phase in (Phase.REQUESTED, Phase.APPROVED) else State.STABLE.value
        return Allocation.from_record(self.incidents.create(req.title(), fields))

    def writes(self) -> int:
        return len(self.incidents.updates) + self.hosts.writes


def _world(queue: FakeQueue | None) -> World:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    svc = GpuFarm(
        incidents=incidents,
        hosts=hosts,
        chat=FakeChat(operators=frozenset({"U0000000OPS"})),
        clock=clock,
        farm=parse_farm(FARM_YAML),
        queue=queue,
    )
    return World(svc, incidents, hosts, clock, queue)


@pytest.fixture
def queued() -> Iterator[World]:
    yield _world(FakeQueue())


@pytest.fixture
def direct() -> Iterator[World]:
    yield _world(None)


def test_an_approved_request_no_webhook_reached_is_queued_as_the_webhook_would(queued: World) -> None:
    approved = queued.lease(Phase.APPROVED, 1)
    queued.lease(Phase.REQUESTED, 2)  # the operators decide: nothing waits on a side effect
    report = queued.svc.sweep()
    assert report.to_allocate == [approved.ir] and report.to_free == [] and report.to_end == []
    assert queued.queue is not None
    [(group, body)] = queued.queue.sent
    expected_body, expected_group, dedup = incident_step(approved)
    assert group == expected_group == "hpc"
    assert body["incident_id"] == approved.incident_id and body["reason"] == f"sweep {expected_body['reason']}"
    # The webhook's message for the same change has the same dedup id: SQS keeps one of the two.
    queued.queue.send(expected_body, group=expected_group, dedup_id=dedup)
    assert len(queued.queue.sent) == 1


def test_an_ended_lease_not_yet_freed_is_queued_and_a_finished_one_is_not(direct: World) -> None:
    held = direct.lease(Phase.APPROVED, 1)
    direct.svc.sweep()  # no queue: the step runs at once
    held = Allocation.from_record(direct.incidents.by_ir(held.ir))
    assert held.phase is Phase.ALLOCATED and held.hosts
    direct.svc.release(held.ir, USER)
    assert Allocation.from_record(direct.incidents.by_ir(held.ir)).phase is Phase.RECLAIMING
    report = direct.svc.sweep()
    assert report.to_free == [held.ir]
    freed = Allocation.from_record(direct.incidents.by_ir(held.ir))
    assert freed.phase is Phase.RECLAIMED and not freed.hosts
    assert not any(t.startswith("ir:") for h in ("hpc-0", "hpc-1") for t in direct.hosts.tags[h].get("user", []))
    assert direct.svc.sweep().to_free == []


def test_a_lease_past_its_end_is_ended_by_the_sweep(direct: World) -> None:
    lease = direct.lease(Phase.APPROVED, 1, days=1)
    direct.svc.sweep()
    direct.clock.advance(days=1, minutes=1)
    report = direct.svc.sweep()
    # Without a queue the end is written at once, so the same sweep's read of ended leases frees it too.
    assert report.to_end == [lease.ir] and report.to_free == [lease.ir]
    ended = Allocation.from_record(direct.incidents.by_ir(lease.ir))
    assert ended.state is State.RESOLVED and ended.phase is Phase.RECLAIMED


def test_a_sweep_with_nothing_waiting_writes_nothing_and_reads_twice(direct: World) -> None:
    direct.lease(Phase.APPROVED, 1)
    direct.svc.sweep()
    before_writes, before_reads = direct.writes(), len(direct.incidents.searches)
    report = direct.svc.sweep()
    assert report.live == 1 and report.to_allocate == report.to_free == report.to_end == []
    assert direct.writes() == before_writes
    assert direct.incidents.searches[before_reads:][1:] == [ENDED_QUERY]
    assert len(direct.incidents.searches) - before_reads == 2


def test_a_doctor_probe_is_never_swept(queued: World) -> None:
    fields = probe.probe_fields("sweepcheck1", "hpc", "nlp")
    queued.incidents.create("gpufarm doctor probe", {**fields, f.PHASE: Phase.RECLAIMING.value})
    queued.incidents.create("gpufarm doctor probe", {**fields, f.STATE: State.ACTIVE.value, f.PHASE: "approved"})
    report = queued.svc.sweep()
    assert report.to_allocate == report.to_free == [] and report.live == 0
    assert queued.queue is not None and queued.queue.sent == []
