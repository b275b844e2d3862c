"""A reason for every wait and end: the earliest start (gpufarm.core.leases.earliest), `/gpu why`
(gpufarm.core.leases.why), the reasons kept on the incident (gpufarm.core.kernel.reason_trail) and the withdrawal
of requests no operator can approve (gpufarm.core.leases.unapprovable)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, ask_hpc

from gpufarm.core.chat.command_text import Verb, parse_command
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import reason_trail
from gpufarm.core.kernel.errors import NotAllowed
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.reasons import Reason, ReasonCode
from gpufarm.core.leases import why
from gpufarm.core.leases.earliest import Hold, Release, earliest_start
from gpufarm.core.service import GpuFarm
from gpufarm.reporting.make import make_report
from gpufarm.reporting.render_table import render_table

pytestmark = pytest.mark.unit

USER = "U0000000001"
OTHER = "U0000000002"
OPS = "U0000000OPS"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


# ---- the earliest start, pure -------------------------------------------------------------------------------------


def test_the_earliest_start_is_when_ends_free_enough_for_the_whole_duration() -> None:
    releases = [Release(T0 + 2 * DAY, 8), Release(T0 + DAY, 4), Release(T0 + 5 * DAY, 8)]
    assert earliest_start(T0, 8, 8, DAY, releases) == T0  # free now
    assert earliest_start(T0, 0, 4, DAY, releases) == T0 + DAY
    assert earliest_start(T0, 0, 12, DAY, releases) == T0 + 2 * DAY
    assert earliest_start(T0, 0, 21, DAY, releases) is None  # more than every end gives back
    # A lease already past its end (the sync has not reclaimed it yet) counts as coming back now.
    assert earliest_start(T0, 0, 8, DAY, [Release(T0 - DAY, 8)]) == T0


def test_future_holds_take_their_gpus_over_their_window() -> None:
    releases = [Release(T0 + DAY, 8)]
    # 8 GPUs free tomorrow, but a reservation holds them from day 2 to day 4: a 3-day lease fits only after it.
    holds = [Hold(T0 + 2 * DAY, T0 + 4 * DAY, 8)]
    assert earliest_start(T0, 0, 8, 3 * DAY, releases, holds) == T0 + 4 * DAY
    # A lease short enough to end before the hold starts fits tomorrow.
    assert earliest_start(T0, 0, 8, DAY, releases, holds) == T0 + DAY
    # A hold in the past changes nothing.
    assert earliest_start(T0, 0, 8, 3 * DAY, releases, [Hold(T0 - 4 * DAY, T0 - DAY, 8)]) == T0 + DAY


def test_the_pools_booked_reservations_are_its_future_holds() -> None:
    from gpufarm.core.kernel.lifecycle import Phase, State
    from gpufarm.core.kernel.model import Allocation
    from gpufarm.core.leases.why import future_holds

    def incident(ir: int, phase: Phase, **more: object) -> Allocation:
        fields = {"environment": "hpc", "gpu_model": "H100", "gpu_count": 8, "team": "nlp", "phase": phase}
        return Allocation.model_construct(ir=ir, state=State.ACTIVE, **{**fields, **more})

    booked = incident(1, Phase.RESERVED, reserved_from=T0 + 2 * DAY, reserved_until=T0 + 4 * DAY)
    leases = [
        booked,
        incident(2, Phase.ALLOCATED, expires_at=T0 + DAY),  # a lease: its end is a release, not a hold
        incident(3, Phase.RESERVED, reserved_from=T0 + DAY, reserved_until=T0 + 2 * DAY, gpu_model="A100"),
        incident(4, Phase.RESERVED, reserved_from=T0 + DAY, reserved_until=T0 + 2 * DAY, environment="cloud"),
    ]
    assert future_holds(leases, "hpc", "h100", T0) == [Hold(T0 + 2 * DAY, T0 + 4 * DAY, 8)]


# ---- reasons on the incident ------------------------------------------------------------------------------------


def test_a_reason_line_keeps_its_code_when_shortened_and_counts_back() -> None:
    long = Reason(ReasonCode.QUEUED_CAPACITY, "x" * 500)
    line = reason_trail.detail(long)
    assert len(line) == reason_trail.MAX_DETAIL_CHARS and line.endswith("… [queued-capacity]")
    assert reason_trail.code_of(f"2026-12-01T12:00:00Z gpufarm waiting: {line}") is ReasonCode.QUEUED_CAPACITY
    assert reason_trail.code_of("2026-12-01T12:00:00Z gpufarm waiting: [not-a-code]") is None
    assert reason_trail.codes(["a [ended-expired]", "b", "c [reclaimed-idle]"]) == [
        ReasonCode.ENDED_EXPIRED,
        ReasonCode.RECLAIMED_IDLE,
    ]


@pytest.fixture
def svc() -> Iterator[tuple[GpuFarm, FakeIncidents, FakeClock]]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    hosts.seed("hpc-0", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    farm = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FARM_YAML))
    yield farm, incidents, clock


def test_gpu_why_is_a_command_about_one_lease() -> None:
    command = parse_command("why IR-12")
    assert command.verb is Verb.WHY and command.ir == 12
    with pytest.raises(Exception, match="say which allocation"):
        parse_command("why")


def test_why_explains_a_wait_with_its_place_what_is_ahead_and_the_earliest_start(
    svc: tuple[GpuFarm, FakeIncidents, FakeClock],
) -> None:
    farm, incidents, _ = svc
    farm.context.farm = parse_farm(FARM_YAML.replace("gpus: 8, hard_limit: 16", "gpus: 16, hard_limit: 16"))
    holding = ask_hpc(farm, incidents, USER, 8, 3)
    ends = farm.allocation(holding).expires_at
    waiting = ask_hpc(farm, incidents, USER, 8, 7)
    assert farm.allocation(waiting).phase is Phase.WAITING
    text = why.why(farm.context, waiting, USER).text
    assert f"IR-{waiting} (8x H100 in hpc)" in text
    assert "Waiting for hosts: 1st of 1 waiting for H100: first come, first served." in text
    assert "Nothing is ahead of it" in text
    assert "Pool: 8 H100, 8 held by 1 leases, 0 free; it and those ahead need 8." in text
    assert ends is not None and f"Earliest start: no earlier than {ends:%Y-%m-%dT%H:%M:%SZ}" in text
    assert "Withdrawn at " in text
    assert "[queued-capacity]" in text
    # Another team's member does not see it.
    farm.context.farm = parse_farm(
        FARM_YAML.replace("  nlp:\n", f"  nlp:\n    members: {{users: [{USER}]}}\n", 1).replace(
            "  vision:\n", f"  vision:\n    members: {{users: [{OTHER}]}}\n", 1
        )
    )
    with pytest.raises(NotAllowed):
        why.why(farm.context, waiting, OTHER)


def test_an_end_carries_its_reason_with_the_numbers_in_the_field_the_history_and_status(
    svc: tuple[GpuFarm, FakeIncidents, FakeClock],
) -> None:
    farm, incidents, clock = svc
    ir = ask_hpc(farm, incidents, USER, 8, 2)
    clock.advance(days=2, minutes=1)
    farm.expire(ir)
    ended = farm.allocation(ir)
    assert ended.reclaim_reason is ReclaimReason.EXPIRED and ended.reason == "ended-expired"
    latest = reason_trail.latest(ended)
    assert latest is not None and latest.code is ReasonCode.ENDED_EXPIRED
    assert latest.sentence.startswith("reason: expired; its 2 days on 8x H100 ran out at ")
    assert "Why: reason: expired; its 2 days on 8x H100 ran out at " in farm.status(ir, USER).text
    assert "Ended (reclaiming)." in why.why(farm.context, ir, USER).text


def test_a_request_no_operator_can_approve_is_withdrawn_after_the_policy_time(
    svc: tuple[GpuFarm, FakeIncidents, FakeClock],
) -> None:
    farm, incidents, clock = svc
    first = ask_hpc(farm, incidents, USER, 8, 7)  # nlp's quota (8)
    second = ask_hpc(farm, incidents, USER, 8, 7)  # beyond quota, within the hard limit (16): asked of operators
    assert farm.allocation(second).phase is Phase.REQUESTED and farm.allocation(second).reason == "awaiting-operator"
    # Nlp's limit is 16: a third request for 8 is refused by policy up front, so lower the limit under the second.
    farm.context.farm = parse_farm(FARM_YAML.replace("gpus: 8, hard_limit: 16", "gpus: 8, hard_limit: 8"))
    text = why.why(farm.context, second, USER).text
    assert "No operator can approve it now: team nlp would hold 16 H100 in hpc, over its hard limit of 8" in text
    assert farm.sweep().to_end == []  # not before the policy time (24 h)
    clock.advance(hours=24, minutes=1)
    assert farm.sweep().to_end == [second]
    gone = farm.allocation(second)
    assert gone.reclaim_reason is ReclaimReason.UNAPPROVABLE and gone.reason == "withdrawn-unapprovable"
    withdrawn = [line for line in gone.history if " sync withdrawn: " in line]
    assert withdrawn[-1].endswith(
        "no operator could approve it within the team's hard limit for 24 h: team nlp would hold 16 H100 in hpc, "
        "over its hard limit of 8 (it holds 8 now) [withdrawn-unapprovable]"
    )
    assert farm.allocation(first).phase is Phase.ALLOCATED


def test_a_request_an_operator_could_still_approve_keeps_waiting(svc: tuple[GpuFarm, FakeIncidents, FakeClock]) -> None:
    farm, incidents, clock = svc
    ask_hpc(farm, incidents, USER, 8, 7)
    second = ask_hpc(farm, incidents, USER, 8, 7)
    clock.advance(hours=48)
    assert farm.sweep().to_end == []
    assert farm.allocation(second).phase is Phase.REQUESTED


def test_reports_count_every_reason_given_in_the_period_ends_without_gpu_hours_included(
    svc: tuple[GpuFarm, FakeIncidents, FakeClock],
) -> None:
    farm, incidents, clock = svc
    first = ask_hpc(farm, incidents, USER, 8, 7)  # allocated: no reason
    second = ask_hpc(farm, incidents, USER, 8, 7)  # beyond quota: asked of the operators
    farm.reject(second, OPS, "no room this week")
    clock.advance(days=8)
    farm.sweep()  # the first expired: an end with its GPU-hours
    clock.advance(minutes=1)  # a period ends before its `now`
    report = make_report(incidents, FarmView.of(farm.context.farm), clock.now(), since="30d")
    assert report.reasons == {"awaiting-operator": 1, "rejected-operator": 1, "ended-expired": 1}
    assert "reasons: awaiting-operator 1, ended-expired 1, rejected-operator 1" in render_table(report)
    assert farm.allocation(second).hours_held == 0  # found by the month of its end, not by GPU-hours
    assert farm.allocation(first).reason == "ended-expired"


def test_the_end_notice_says_the_reason_with_its_numbers(svc: tuple[GpuFarm, FakeIncidents, FakeClock]) -> None:
    farm, incidents, clock = svc
    ir = ask_hpc(farm, incidents, USER, 8, 2)
    clock.advance(days=2, minutes=1)
    farm.sweep()
    told = [s.text for s in farm.context.chat.to(USER, "dm")]  # type: ignore[attr-defined]
    assert any(
        f"IR-{ir}" in t and "its time ran out: its 2 days on 8x H100 ran out at " in t and "[ended-expired]" in t
        for t in told
    ), told
