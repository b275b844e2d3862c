"""The pool's calendar as a pure interval computation: use over time, admission, the nearest free window, the days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufarm.core.calendar.admission import Booking, decide, span
from gpufarm.core.calendar.booking import FOREVER, Calendar, Hold, Limits, use
from gpufarm.core.calendar.view import days, render
from gpufarm.core.chat.command_text import Verb, parse_command
from gpufarm.core.chat.reserve_text import parse_length
from gpufarm.core.config.reservations import ReservationPolicy, ReservationSettings
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, can_transition
from gpufarm.core.kernel.reasons import ReasonCode

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
POLICY = ReservationPolicy(horizon_days=90, max_days=14, no_show_minutes=30)


def _at(days: float) -> datetime:
    return NOW + timedelta(days=days)


def _booking(gpus: int, start: float, length: float, team: str = "nlp") -> Booking:
    return Booking(team, "onprem-hpc", "H100", gpus, _at(start), _at(start + length))


def test_use_sums_holds_over_time_and_one_team_apart() -> None:
    holds = [Hold(_at(0), _at(2), 8, "nlp"), Hold(_at(1), _at(3), 4, "vision", reserved=True)]
    pool = use(holds)
    assert [pool.at(_at(d)) for d in (0, 1.5, 2.5, 3)] == [8, 12, 4, 0]
    assert use(holds, team="vision").at(_at(1.5)) == 4
    assert use(holds, reserved_only=True).peak(_at(0), _at(1)) == 0
    assert pool.peak(_at(0), _at(3)) == 12


def test_a_window_fits_only_when_pool_and_quota_hold_throughout() -> None:
    holds = [Hold(NOW, _at(5), 12, "vision"), Hold(_at(10), _at(12), 8, "nlp", reserved=True)]
    cal = Calendar(holds, Limits(capacity=16, quota=12), "nlp")
    assert decide(_booking(4, 1, 3), cal, POLICY, NOW) is None
    busy = decide(_booking(8, 1, 3), cal, POLICY, NOW)
    assert busy is not None and busy.code is ReasonCode.RESERVATION_NO_CAPACITY
    assert "only 4 of the pool's 16 are free" in busy.sentence
    # The lease ends on day 5: the nearest window for 8 GPUs starts then.
    assert "nearest free window is from 2026-12-06 09:00 for 3d" in busy.sentence
    # The team's own reservation leaves it 4 of its 12 on days 10-12.
    quota = decide(_booking(6, 9, 2), cal, POLICY, NOW)
    assert quota is not None and quota.code is ReasonCode.RESERVATION_OVER_QUOTA
    assert "team nlp has only 4 of its 12 quota left" in quota.sentence


def test_the_nearest_window_may_lie_before_the_asked_start() -> None:
    holds = [Hold(_at(20), _at(30), 16, "vision", reserved=True)]
    cal = Calendar(holds, Limits(capacity=16, quota=16), "nlp")
    refusal = decide(_booking(8, 19, 3), cal, POLICY, NOW)
    assert refusal is not None and "from 2026-12-18 09:00 for 3d" in refusal.sentence


@pytest.mark.parametrize(
    ("booking", "code", "words"),
    [
        (_booking(2, -1, 1), ReasonCode.RESERVATION_IN_PAST, "starts in the past"),
        (_booking(2, 1, 20), ReasonCode.RESERVATION_TOO_LONG, "longer than the 14 days"),
        (_booking(2, 85, 10), ReasonCode.RESERVATION_BEYOND_HORIZON, "booking horizon of 90 days"),
    ],
)
def test_bad_windows_are_refused_with_what_would_fit(booking: Booking, code: ReasonCode, words: str) -> None:
    cal = Calendar([], Limits(capacity=16, quota=16), "nlp")
    reason = decide(booking, cal, POLICY, NOW)
    assert reason is not None and reason.code is code
    assert words in reason.sentence and "nearest free window is from" in reason.sentence
    assert reason.line().endswith(f"[{code.value}]")


def test_no_window_at_all_is_said_plainly() -> None:
    cal = Calendar([Hold(NOW, FOREVER, 16, "vision")], Limits(capacity=16, quota=16), "nlp")
    reason = decide(_booking(1, 1, 1), cal, POLICY, NOW)
    assert reason is not None and "no window of 1d for 1 GPUs fits within the horizon" in reason.sentence


def test_a_busy_pool_refuses_and_names_the_window_once_enough_leases_end() -> None:
    holds = [Hold(NOW, _at(1 + i % 60), 1, f"t{i % 7}") for i in range(3000)]
    holds += [Hold(_at(i % 80), _at(i % 80 + 2), 1, f"t{i % 7}", reserved=True) for i in range(1000)]
    cal = Calendar(holds, Limits(capacity=4000, quota=4000), "t1")
    reason = decide(_booking(2000, 10, 3, team="t1"), cal, POLICY, NOW)
    assert reason is not None and reason.code is ReasonCode.RESERVATION_NO_CAPACITY
    found = reason.sentence.rsplit("from ", 1)[1].split(" for")[0]
    start = datetime.strptime(found, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    assert cal.room(start, start + timedelta(days=3)) >= 2000 > cal.room(_at(10), _at(13))


def test_days_show_capacity_leases_reserved_and_free_at_each_days_busiest_moment() -> None:
    holds = [Hold(NOW, _at(1), 4, "nlp"), Hold(_at(2), _at(3), 8, "nlp", reserved=True)]
    rows = days(holds, 16, NOW, count=4)
    assert [(r.held, r.reserved, r.free) for r in rows] == [(4, 0, 12), (4, 0, 12), (0, 8, 8), (0, 8, 8)]
    assert [(r.held, r.reserved, r.free) for r in days(holds, 16, NOW, count=5)][4] == (0, 0, 16)
    assert "onprem-hpc H100" in render("onprem-hpc", "H100", rows)


def test_reserve_and_calendar_commands_parse() -> None:
    cmd = parse_command("reserve 8 H100 env=onprem-hpc project=llm-ko from 2026-12-10 09:00 for 3d")
    assert cmd.verb is Verb.RESERVE
    assert cmd.args == {
        "gpu_count": "8",
        "gpu_model": "H100",
        "environment": "onprem-hpc",
        "project": "llm-ko",
        "reserved_from": "2026-12-10T09:00",
        "reserved_for": "3d",
    }
    assert parse_command("reserve 2 H100 for 36h from 2026-12-10").args["reserved_from"] == "2026-12-10T00:00"
    cal = parse_command("calendar onprem-hpc h100")
    assert (cal.verb, cal.environment, cal.gpu_model) == (Verb.CALENDAR, "onprem-hpc", "h100")
    assert type(cmd).from_payload(cal.to_payload()) == cal


@pytest.mark.parametrize(
    "text",
    [
        "reserve 8 H100 env=onprem-hpc",
        "reserve 8 H100 from tomorrow for 3d",
        "reserve 8 H100 from 2026-13-40 09:00 for 3d",
        "reserve 8 H100 from 2026-12-10 09:00 for 3w",
        "reserve 8 H100 from 2026-12-10 09:00 for",
        "reserve 8 H100 from 9999-12-31 23:59 for 365d",
        "calendar a b c",
    ],
)
def test_bad_reserve_text_is_refused(text: str) -> None:
    with pytest.raises(ValidationFailed):
        parse_command(text)


def test_lengths_and_spans() -> None:
    assert parse_length("3d") == timedelta(days=3)
    assert parse_length("36h") == timedelta(hours=36)
    assert span(timedelta(hours=72)) == "3d" and span(timedelta(hours=30)) == "30h"


def test_reserved_phase_transitions() -> None:
    assert can_transition(Phase.REQUESTED, Phase.RESERVED)
    assert can_transition(Phase.RESERVED, Phase.ALLOCATED)
    assert can_transition(Phase.RESERVED, Phase.RECLAIMING)
    assert not can_transition(Phase.RESERVED, Phase.APPROVED)


def test_reservation_policy_per_pool() -> None:
    settings = ReservationSettings(environments={"onprem-hpc": {"horizon_days": 30}})
    assert settings.policy("onprem-hpc") == ReservationPolicy(30, 14, 30)
    assert settings.policy("cloud") == ReservationPolicy(90, 14, 30)
    assert settings.problems({"cloud"}) == ["reservations.environments: 'onprem-hpc' is not an environment"]
