"""Reservations through the lifecycle: booked in phase reserved, refused with the nearest window, the reserved
capacity kept from new leases and extensions, allocated at the start by the sweep, a no-show released."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from fakes import FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.calendar.asking import build_reservation
from gpufarm.core.calendar.view import calendar_answer
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import Conflict, UpstreamError, ValidationFailed
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, IncidentRecord, isoformat
from gpufarm.core.kernel.search import IncidentQuery, live_query
from gpufarm.core.service import GpuFarm
from gpufarm.reporting.build import build_report
from gpufarm.reporting.query import GroupBy, ReportQuery, since_period
from gpufarm.reporting.read import Leases
from gpufarm.reporting.render_csv import render_csv
from gpufarm.reporting.render_json import report_json
from gpufarm.setup.dashboards_farm.ledger import quota_ledger

USER = "U0000000001"
FARM = """
operators_usergroup: S0000000001
operators_channel: C0000000001
gpu_models:
  H100: {}
environments:
  hpc: {kind: dedicated, gpu_models: [H100]}
teams:
  nlp:
    max_days: 30
    quotas: {hpc: {H100: {gpus: 16}}}
  vision:
    max_days: 30
    quotas: {hpc: {H100: {gpus: 16}}}
reservations: {horizon_days: 60, max_days: 10, no_show_minutes: 30}
defaults: {duration_days: 7, extend_days: 7}
"""


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    hosts: FakeHosts
    clock: FakeClock
    chat: FakeChat
    metrics: FakeMetrics
    serial: int = 0

    def _id(self) -> str:
        self.serial += 1
        return f"r-book-{self.serial:04d}"

    def reserve(self, count: int, start_days: float, length: str, team: str = "nlp") -> str:
        start = self.clock.now() + timedelta(days=start_days)
        values = {
            "gpu_count": str(count),
            "gpu_model": "H100",
            "environment": "hpc",
            "team": team,
            "project": "llm-ko",
            "reserved_from": start.strftime("%Y-%m-%dT%H:%M"),
            "reserved_for": length,
        }
        request = build_reservation(values, self.svc.context.farm, requester=USER, channel=None, request_id=self._id())
        return self.svc.submit_request(request).text

    def lease(self, count: int, days: int, team: str = "nlp") -> Allocation:
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
        values["duration_days"] = str(days)
        request = build_request(values, self.svc.context.farm, requester=USER, channel=None, request_id=self._id())
        self.svc.submit_request(request)
        ir = self.newest()
        self.svc.process(self.incidents.by_ir(ir).id)
        return self.svc.allocation(ir)

    def newest(self) -> int:
        return max(r.public_id for r in self.incidents.records.values())


@pytest.fixture
def world() -> World:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({"U0000000OPS"}))
    metrics = FakeMetrics()
    svc = GpuFarm(
        incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FARM), queue=None, metrics=metrics
    )
    return World(svc, incidents, hosts, clock, chat, metrics)


def test_a_booking_that_fits_is_reserved_with_its_window(world: World) -> None:
    answer = world.reserve(8, 3, "2d")
    alloc = world.svc.allocation(world.newest())
    assert "reserved: 8 H100 in hpc from" in answer
    assert (alloc.phase, alloc.state) == (Phase.RESERVED, State.ACTIVE)
    assert alloc.reserved_from == world.clock.now() + timedelta(days=3)
    assert alloc.reserved_until == alloc.expires_at == world.clock.now() + timedelta(days=5)
    assert "reserved" in alloc.history[-1] and alloc.hosts == ()
    assert alloc.title.startswith("GPU reservation: nlp/llm-ko 8xH100")


def test_an_overlapping_booking_beyond_the_pool_is_refused_with_the_nearest_window(world: World) -> None:
    world.reserve(12, 3, "2d")
    answer = world.reserve(8, 4, "2d", team="vision")
    # Weighed once, in the pool's writer: the incident is closed with the reason.
    assert "refused" in answer and "[reservation-no-capacity]" in answer and "Nothing was reserved" in answer
    assert "only 4 of the pool's 16 are free" in answer
    assert "nearest free window is from " + (world.clock.now() + timedelta(days=5)).strftime("%Y-%m-%d %H:%M") in answer
    refused = world.svc.allocation(world.newest())
    assert (refused.phase, refused.state) == (Phase.REJECTED, State.RESOLVED)
    assert refused.history[-1].endswith("[reservation-no-capacity]")


def test_a_pool_read_that_fails_part_way_admits_nothing_and_the_redelivery_decides(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.reserve(4, 3, "2d", team="vision")
    world.reserve(4, 3, "2d", team="vision")
    whole = world.incidents.search

    def failing(query: IncidentQuery) -> Iterator[IncidentRecord]:
        found = whole(query)
        if dict(query.fields).get(f.ENVIRONMENT) == ("hpc",) and f.TEAM not in dict(query.fields):
            yield next(found)  # the pool's first page came, the next one failed
            raise UpstreamError("Datadog is unavailable (503)")
        yield from found

    monkeypatch.setattr(world.incidents, "search", failing)
    with pytest.raises(UpstreamError):
        world.reserve(8, 3, "2d")
    undecided = world.svc.allocation(world.newest())
    assert (undecided.phase, undecided.state) == (Phase.REQUESTED, State.ACTIVE)
    # The queue redelivers the booking: decided on the pool read whole.
    monkeypatch.setattr(world.incidents, "search", whole)
    assert "reserved: 8 H100 in hpc" in world.svc.decide_request(undecided.ir).text
    assert world.svc.allocation(undecided.ir).phase is Phase.RESERVED


def test_a_booking_and_the_home_after_it_read_the_pool_once(world: World) -> None:
    world.lease(8, 3, team="vision")
    world.incidents.searches.clear()
    # The queue consumer's unit of work: the create, its twin check and the decision, then the requester's Home.
    answer = world.svc.refreshing_homes(lambda: world.reserve(8, 3, "2d"))
    assert "reserved: 8 H100 in hpc" in answer
    # The twin check reads the pool afresh and the decision weighs it; the Home's quota rows come from that read
    # (the teams' quotas are all in hpc), its list of the user's leases through the requester facet.
    assert world.incidents.searches == [live_query("hpc"), live_query(requester=USER)]
    assert "reserved" in json.dumps(world.chat.homes[USER])


def test_the_decision_that_counts_refuses_what_was_booked_since_the_precheck(world: World) -> None:
    start = world.clock.now() + timedelta(days=2)
    values = {
        "gpu_count": "10",
        "gpu_model": "H100",
        "environment": "hpc",
        "team": "nlp",
        "project": "p",
        "reserved_from": start.strftime("%Y-%m-%dT%H:%M"),
        "reserved_for": "1d",
    }
    farm = world.svc.context.farm
    first = build_reservation(values, farm, requester=USER, channel=None, request_id="r-race-0001")
    second = build_reservation(
        {**values, "team": "vision"}, farm, requester=USER, channel=None, request_id="r-race-0002"
    )
    # Both passed their up-front checks; the pool's writer decides them one after the other.
    a, _ = world.svc.create_request(first)
    b, _ = world.svc.create_request(second)
    world.svc.decide_request(a.ir)
    world.svc.decide_request(b.ir)
    phases = [world.svc.allocation(a.ir).phase, world.svc.allocation(b.ir).phase]
    assert phases == [Phase.RESERVED, Phase.REJECTED]
    assert "[reservation-no-capacity]" in world.svc.allocation(b.ir).history[-1]


@pytest.mark.parametrize(
    ("start", "length", "code"),
    [(-1, "1d", "reservation-in-past"), (1, "11d", "reservation-too-long"), (55, "8d", "reservation-beyond-horizon")],
)
def test_bad_windows_are_refused(world: World, start: float, length: str, code: str) -> None:
    answer = world.reserve(2, start, length)
    assert f"[{code}]" in answer and "nearest free window is from" in answer
    assert "Request refused" in answer and world.incidents.records == {}  # up front: nothing created


def test_a_new_lease_does_not_take_reserved_capacity(world: World) -> None:
    world.reserve(16, 3, "2d", team="vision")
    short = world.lease(8, 2)  # ends before the reservation starts: it may take the GPUs
    assert short.phase is Phase.ALLOCATED
    lease = world.lease(8, 7)
    assert lease.phase is Phase.WAITING and lease.hosts == ()
    assert "[reserved-capacity]" in lease.history[-1] and "16 H100 in hpc are reserved from" in lease.history[-1]


def test_a_live_lease_cannot_be_extended_into_reserved_capacity(world: World) -> None:
    lease = world.lease(8, 2)
    world.reserve(16, 3, "2d", team="vision")
    with pytest.raises(Conflict, match=r"cannot be extended: 16 H100 in hpc are reserved from .*\[reserved-capacity\]"):
        world.svc.extend(lease.ir, USER, 2)
    world.svc.extend(lease.ir, USER, 1)  # still ends before the reservation
    assert world.svc.allocation(lease.ir).expires_at == world.clock.now() + timedelta(days=3)


def test_at_its_start_the_sweep_allocates_it_until_its_window_ends(world: World) -> None:
    world.reserve(8, 1, "2d")
    ir = world.newest()
    world.svc.sweep()
    assert world.svc.allocation(ir).phase is Phase.RESERVED
    world.clock.advance(days=1, minutes=1)
    report = world.svc.sweep()
    alloc = world.svc.allocation(ir)
    assert ir in report.to_allocate and alloc.phase is Phase.ALLOCATED and len(alloc.hosts) == 1
    assert alloc.expires_at == alloc.reserved_until
    assert any(alloc.ir_label in sent.text for sent in world.chat.to(USER))  # the holder is told


def test_an_unused_reservation_is_released_as_a_no_show(world: World) -> None:
    world.reserve(8, 1, "2d")
    ir = world.newest()
    world.clock.advance(days=1)
    world.svc.sweep()
    alloc = world.svc.allocation(ir)
    # The ledger accrued its first 40 minutes: idle, never busy.
    until = world.clock.now() + timedelta(minutes=40)
    world.incidents.update(
        alloc.incident_id,
        {
            f.GPU_HOURS_HELD: "5.333",
            f.GPU_HOURS_IDLE: "5.333",
            f.GPU_HOURS_BUSY: "0",
            f.GPU_HOURS_UNTIL: isoformat(until),
        },
    )
    world.clock.advance(minutes=20)
    world.svc.sweep()
    assert world.svc.allocation(ir).phase is Phase.ALLOCATED  # within its no-show window
    world.clock.advance(minutes=21)
    world.svc.sweep()
    ended = world.svc.allocation(ir)
    assert ended.reclaim_reason is ReclaimReason.NO_SHOW and ended.phase is Phase.RECLAIMED
    assert any("[no-show]" in line and "30-minute no-show window" in line for line in ended.history)


def test_a_reservation_nothing_measured_is_not_a_no_show(world: World) -> None:
    world.reserve(8, 1, "2d")
    ir = world.newest()
    world.clock.advance(days=1)
    world.svc.sweep()
    alloc = world.svc.allocation(ir)
    until = isoformat(world.clock.now() + timedelta(hours=2))
    world.incidents.update(alloc.incident_id, {f.GPU_HOURS_UNMEASURED: "16", f.GPU_HOURS_UNTIL: until})
    world.clock.advance(hours=2)
    world.svc.sweep()
    assert world.svc.allocation(ir).phase is Phase.ALLOCATED


def test_a_booked_reservation_released_is_cancelled(world: World) -> None:
    world.reserve(8, 3, "1d")
    ir = world.newest()
    world.svc.release(ir, USER)
    alloc = world.svc.allocation(ir)
    assert alloc.reclaim_reason is ReclaimReason.CANCELLED and alloc.state is State.RESOLVED
    # Its capacity is free again for another booking.
    assert "reserved:" in world.reserve(16, 3, "1d", team="vision")


def test_the_calendar_shows_leases_and_reservations_per_day(world: World) -> None:
    world.lease(4, 2)
    world.reserve(8, 3, "1d")
    text = calendar_answer(world.svc.context, "hpc", None).text
    lines = text.splitlines()
    assert "hpc H100: day (UTC)   capacity  leases  reserved  free" in lines
    assert lines[2].split()[-4:] == ["16", "4", "0", "12"]
    assert lines[5].split()[-4:] == ["16", "0", "8", "8"]
    with pytest.raises(ValidationFailed):
        calendar_answer(world.svc.context, "nowhere", None)


def test_the_reserved_column_counts_booked_hours_until_the_start_or_a_release(world: World) -> None:
    world.reserve(8, 2, "2d")
    first = world.newest()
    world.reserve(4, 6, "1d", team="vision")
    world.svc.publish_gauges()
    tags = ("team:nlp", "project:llm-ko", "environment:hpc", "gpu_model:h100")
    assert world.metrics.value("gpufarm.ledger.gpu_hours.reserved", *tags) == 8 * 48
    assert world.metrics.value("gpufarm.calendar.gpus.reserved", "environment:hpc", "day:03") == 8
    assert world.metrics.value("gpufarm.calendar.gpus.reserved", "environment:hpc", "day:06") == 4
    assert world.metrics.value("gpufarm.calendar.gpus.reserved", "environment:hpc", "day:00") == 0
    world.svc.release(first, USER)
    world.metrics.series.clear()
    world.svc.publish_gauges()
    assert world.metrics.value("gpufarm.ledger.gpu_hours.reserved", *tags) is None
    assert world.metrics.value("gpufarm.calendar.gpus.reserved", "environment:hpc", "day:03") == 0


def test_the_quota_ledger_dashboard_shows_the_reserved_column_and_the_calendar() -> None:
    body = json.dumps(quota_ledger(parse_farm(FARM)))
    assert "sum:gpufarm.ledger.gpu_hours.reserved{$team,$environment,$gpu_model} by {team,project,environment" in body
    assert "max:gpufarm.calendar.gpus.reserved{$environment,$gpu_model} by {environment,gpu_model,day}" in body


def test_reports_count_reserved_hours_until_the_window_ends_or_the_reservation_is_released(world: World) -> None:
    world.reserve(8, 1, "2d")
    honoured = world.newest()
    world.reserve(4, 1, "1d", team="vision")
    world.svc.release(world.newest(), USER)  # cancelled before its start: nothing reserved
    world.clock.advance(days=1)
    world.svc.sweep()
    world.clock.advance(days=2)
    world.svc.sync()
    leases = Leases(tuple(LeaseFacts.of(world.svc.allocation(ir)) for ir in range(1, world.newest() + 1)))
    query = ReportQuery(since_period("7d", world.clock.now()), GroupBy.TEAM)
    report = build_report(query, leases, FarmView.of(world.svc.context.farm), world.clock.now())
    rows = {row.key: row for row in report.rows}
    assert rows["nlp"].reserved == pytest.approx(8 * 48) and rows["vision"].reserved == 0
    assert report.total.reserved == pytest.approx(8 * 48)
    assert world.svc.allocation(honoured).reclaim_reason is ReclaimReason.EXPIRED
    header = render_csv(report).splitlines()[0]
    assert "gpu_hours_reserved" in header.split(",")
    assert report_json(report)["rows"][0]["gpu_hours"]["reserved"] == pytest.approx(384.0)


def test_the_app_home_lists_a_booked_reservation_with_its_window(world: World) -> None:
    world.reserve(8, 3, "2d")
    home = world.svc.home(USER)
    [waiting] = home.waiting
    assert waiting.alloc.phase is Phase.RESERVED and waiting.reason.startswith("reserved 2026-03-05 09:00 to")


def test_a_reservation_whose_hosts_never_came_ends_with_its_window(world: World) -> None:
    world.reserve(16, 1, "1d")
    ir = world.newest()
    world.hosts.tags.pop("hpc-1")  # a host it counted on is gone when the window starts
    world.clock.advance(days=1, minutes=1)
    world.svc.sweep()
    assert world.svc.allocation(ir).phase is Phase.WAITING
    world.clock.advance(days=1)
    world.svc.sweep()
    ended = world.svc.allocation(ir)
    assert ended.state is State.RESOLVED and ended.reclaim_reason is ReclaimReason.EXPIRED


def test_a_reservation_takes_its_length_from_for_not_days(world: World) -> None:
    farm = world.svc.context.farm
    values = {"gpu_count": "2", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
    window = {"reserved_from": "2026-03-05T09:00", "reserved_for": "2d"}
    with pytest.raises(ValidationFailed, match="its `for`, not days="):
        build_reservation(
            {**values, **window, "duration_days": "3"}, farm, requester=USER, channel=None, request_id="r-days-0001"
        )
    request = build_reservation({**values, **window}, farm, requester=USER, channel=None, request_id="r-days-0002")
    assert request.duration_days == 2 and request.is_reservation
