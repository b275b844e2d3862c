"""Reports (issue 13 point 3): GPU-hours held vs busy vs idle vs unmeasured per group from the incidents, the
history's counts and waits, quota and budgets, the four formats, and bad input refused before anything is read."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fakes import FARM_YAML, FakeClock, FakeIncidents

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.ports import MetricPoint, TimeseriesResult
from gpufarm.core.money.lease_cost import lease_hours
from gpufarm.reporting.build import build_report
from gpufarm.reporting.make import make_report
from gpufarm.reporting.query import GroupBy, Period, ReportQuery, month_period, parse_query, since_period
from gpufarm.reporting.read import read_leases
from gpufarm.reporting.render_csv import render_csv
from gpufarm.reporting.render_json import report_json
from gpufarm.reporting.render_table import render_table

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
FARM = parse_farm(
    FARM_YAML.replace("defaults:", "budgets:\n  - {team: nlp, period: month, gpu_hours: 1000}\ndefaults:")
)
VIEW = FarmView.of(FARM)


def _t(day: int, hour: int = 0, month: int = 12) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


def lease(
    incidents: FakeIncidents,
    *,
    team: str = "nlp",
    project: str = "llm",
    env: str = "hpc",
    gpus: int = 8,
    allocated: datetime,
    until: datetime | None = None,
    held: float = 0.0,
    busy: float = 0.0,
    idle: float = 0.0,
    unmeasured: float = 0.0,
    months: tuple[str, ...] = (),
    ended: str | None = None,
    history: tuple[str, ...] = (),
) -> int:
    fields: dict[str, object] = {
        f.STATE: "resolved" if ended else "stable",
        f.PHASE: "reclaimed" if ended else "allocated",
        f.TEAM: team,
        f.PROJECT: project,
        f.ENVIRONMENT: env,
        f.GPU_MODEL: "H100",
        f.GPU_COUNT: str(gpus),
        f.HOSTS: ["node-1"],
        f.HOST_GPUS: [f"node-1={gpus}"],
        f.ALLOCATED_AT: isoformat(allocated),
        f.GPU_HOURS_HELD: f"{held:.3f}",
        f.GPU_HOURS_BUSY: f"{busy:.3f}",
        f.GPU_HOURS_IDLE: f"{idle:.3f}",
        f.GPU_HOURS_UNMEASURED: f"{unmeasured:.3f}",
        f.GPU_HOURS_BY_MONTH: list(months),
        f.GPU_HOURS_MONTHS: [m.partition("=")[0] for m in months],
        f.HISTORY: list(history),
    }
    if until is not None:
        fields[f.GPU_HOURS_UNTIL] = isoformat(until)
    if ended:
        fields[f.RECLAIM_REASON] = ended
    record = incidents.create(f"GPU request: {team}/{project}", fields)
    return record.public_id


@pytest.fixture
def incidents() -> FakeIncidents:
    return FakeIncidents(FakeClock(NOW))


# -- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"since": "0d"}, "since", "longer than zero"),
        ({"since": "10y"}, "since", "at most 366 days"),
        ({"since": "400d"}, "since", "at most 366 days"),
        ({"since": "30"}, "since", "30d"),
        ({"since": "-3d"}, "since", "30d"),
        ({"since": "9" * 40}, "since", "30d"),
        ({"month": "2026-13"}, "month", "no month 13"),
        ({"month": "2026-00"}, "month", "no month 00"),
        ({"month": "26-11"}, "month", "YYYY-MM"),
        ({"month": "2027-01"}, "month", "not started"),
        ({"month": "2020-01"}, "month", "at most 366 days"),
        ({"since": "30d", "month": "2026-11"}, "since", "not both"),
        ({"by": "planet"}, "by", "choose one of team, project, ir, environment"),
        ({"team": "nope"}, "team", "unknown team 'nope'; teams: nlp, vision"),
        ({"team": "NLP;drop"}, "team", "lowercase"),
        ({"project": "ghost"}, "project", "unknown project 'ghost'"),
    ],
)
def test_bad_input_is_refused_with_the_option_named(kwargs: dict[str, str], field: str, words: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_query(VIEW, NOW, **kwargs)
    assert caught.value.field == field
    assert words in caught.value.message


def test_an_unknown_project_is_refused_before_anything_is_built(incidents: FakeIncidents) -> None:
    lease(incidents, project="llm", allocated=_t(9), held=8.0, months=("2026-12=8.000",), until=_t(9, 1))
    with pytest.raises(ValidationFailed, match="unknown project 'ghost'; projects: llm"):
        make_report(incidents, VIEW, NOW, project="ghost")
    # The same project the leases name is known.
    assert make_report(incidents, VIEW, NOW, project="llm").total.leases == 1


def test_periods_are_half_open_and_a_current_month_ends_now() -> None:
    since = since_period("30d", NOW)
    assert (since.start, since.end, since.hours) == (NOW - timedelta(days=30), NOW, 720)
    assert since_period("12h", NOW).hours == 12 and since_period("2w", NOW).hours == 336
    assert since_period("1y", NOW).hours == 365 * 24
    assert since.months == ("2026-11", "2026-12")
    november = month_period("2026-11", NOW)
    assert (november.start, november.end, november.label) == (_t(1, month=11), _t(1), "2026-11")
    assert month_period("2026-12", NOW).end == NOW
    assert month_period("2025-12", NOW).end == datetime(2026, 1, 1, tzinfo=UTC)


# -- GPU-hours inside a period ---------------------------------------------------------------------------------


def _alloc(**kw: Any) -> Allocation:
    incidents = FakeIncidents(FakeClock(NOW))
    lease(incidents, **kw)
    return Allocation.from_record(next(iter(incidents.records.values())))


def _bounds(period: Period) -> tuple[datetime, datetime]:
    return period.start, period.end


def test_whole_months_count_as_accrued_and_a_cut_month_by_its_share() -> None:
    # Held 8 GPUs from Nov 21 00:00 to Dec 1 00:00 (240 h x 8 = 1920), ended; busy 1440, idle 320, unmeasured 160.
    ended = _alloc(
        allocated=_t(21, month=11),
        until=_t(1),
        held=1920,
        busy=1440,
        idle=320,
        unmeasured=160,
        months=("2026-11=1920.000",),
        ended="released",
    )
    november = month_period("2026-11", NOW)
    hours = lease_hours(ended, november.start, november.end, NOW)
    assert (hours.held, hours.busy, hours.idle, hours.unmeasured) == (1920, 1440, 320, 160)
    # The last 5 days of November: half the lease's holding in that month.
    tail = Period(_t(26, month=11), _t(10), "tail")
    half = lease_hours(ended, tail.start, tail.end, NOW)
    assert half.held == pytest.approx(960) and half.busy == pytest.approx(720) and half.unmeasured == pytest.approx(80)
    assert lease_hours(ended, *_bounds(month_period("2026-12", NOW)), NOW).held == 0


def test_a_live_lease_adds_its_unaccrued_stretch_as_unmeasured_never_idle() -> None:
    live = _alloc(allocated=_t(10, 8), until=_t(10, 10), held=16, busy=8, idle=8, months=("2026-12=16.000",))
    hours = lease_hours(live, *_bounds(since_period("1d", NOW)), NOW)
    # 2 h accrued (16 GPU-h: 8 busy, 8 idle) and 2 h since the last accrual (16 GPU-h, unmeasured).
    assert (hours.held, hours.busy, hours.idle, hours.unmeasured) == (32, 8, 8, 16)


# -- rows --------------------------------------------------------------------------------------------------------


def _history(*lines: tuple[datetime, str, str]) -> tuple[str, ...]:
    return tuple(f"{isoformat(at)} {actor} {step}" for at, actor, step in lines)


def _farm_of_three(incidents: FakeIncidents) -> None:
    lease(
        incidents,
        allocated=_t(2),
        until=_t(3),
        held=192,
        busy=150,
        idle=42,
        months=("2026-12=192.000",),
        ended="idle",
        history=_history(
            (_t(1, 22), "U0000000001", "requested"),
            (_t(2), "gpufarm", "allocated: hosts: node-1"),
            (_t(2, 10), "monitor", "warned: kind idle"),
            (_t(2, 11), "U0000000001", "kept: 1 of 2"),
            (_t(3), "monitor", "reclaimed: reason: idle"),
        ),
    )
    lease(
        incidents,
        project="asr",
        allocated=_t(9),
        until=_t(10, 10),
        held=192,
        busy=0,
        idle=0,
        unmeasured=192,
        months=("2026-12=192.000",),
        history=_history((_t(8, 20), "U0000000002", "requested"), (_t(9), "gpufarm", "allocated: hosts: node-2")),
    )
    lease(
        incidents,
        team="vision",
        project="seg",
        env="cloud",
        gpus=4,
        allocated=_t(5),
        until=_t(6),
        held=96,
        busy=24,
        idle=72,
        months=("2026-12=96.000",),
        ended="released",
        history=_history(
            (_t(4, 23), "U0000000003", "requested"),
            (_t(5), "gpufarm", "allocated"),
            (_t(5, 3), "U0000000OPS", "exempted: until x"),
        ),
    )


def test_rows_per_team_carry_hours_counts_waits_quota_and_budget(incidents: FakeIncidents) -> None:
    _farm_of_three(incidents)
    report = make_report(incidents, VIEW, NOW, month="2026-12")
    rows = {r.key: r for r in report.rows}
    nlp, vision = rows["nlp"], rows["vision"]
    assert (nlp.leases, nlp.held, nlp.busy, nlp.idle) == (2, 384 + 16, 150, 42)
    # The live lease's 2 h since its last accrual (16 GPU-h) is unmeasured, with its 192 unmeasured accrued hours.
    assert nlp.unmeasured == 192 + 16 and nlp.unmeasured_leases == 1
    assert nlp.utilisation == pytest.approx(100 * 150 / 192)
    assert (nlp.idle_warnings, nlp.keeps, nlp.exemptions) == (1, 1, 0)
    assert dict(nlp.reclaims) == {"idle": 1}
    assert nlp.wait_avg == pytest.approx(3) and nlp.wait_max == 4
    assert (nlp.entitled, nlp.held_now) == (20, 8)
    assert [(b.label, b.period, b.gpu_hours) for b in nlp.budgets] == [("nlp", "2026-12", 1000)]
    assert nlp.budgets[0].burned == pytest.approx(384 + 16, abs=0.01)
    assert (vision.exemptions, dict(vision.reclaims), vision.utilisation) == (1, {"released": 1}, 25)
    assert report.total.held == nlp.held + vision.held and report.total.leases == 3
    assert [x.ir for x in report.unmeasured] == [2]
    assert [x.ir for x in report.top_idle] == [3, 1]
    assert report.notes[0].startswith("208.0 GPU-hours of 1 lease(s) are unmeasured (not idle): no node agent")


def test_grouping_by_project_ir_and_environment_and_filters(incidents: FakeIncidents) -> None:
    _farm_of_three(incidents)
    by_project = make_report(incidents, VIEW, NOW, by="project")
    assert sorted(r.key for r in by_project.rows) == ["asr", "llm", "seg"]
    by_ir = make_report(incidents, VIEW, NOW, by="ir")
    assert sorted(r.key for r in by_ir.rows) == ["IR-1", "IR-2", "IR-3"]
    by_env = make_report(incidents, VIEW, NOW, by="environment")
    assert {r.key: r.leases for r in by_env.rows} == {"hpc": 2, "cloud": 1}
    vision = make_report(incidents, VIEW, NOW, team="vision")
    assert [r.key for r in vision.rows] == ["vision"] and vision.total.leases == 1
    assert make_report(incidents, VIEW, NOW, project="asr").total.held == 192 + 16


def test_a_team_without_leases_still_has_its_row(incidents: FakeIncidents) -> None:
    report = make_report(incidents, VIEW, NOW)
    assert [(r.key, r.leases, r.entitled) for r in report.rows] == [("nlp", 0, 20), ("vision", 0, 0)]


def test_reads_are_three_facet_narrowed_searches(incidents: FakeIncidents) -> None:
    _farm_of_three(incidents)
    read_leases(incidents, ("2026-11", "2026-12"), team="nlp")
    # Live leases, ended ones that accrued in the months, and ends without GPU-hours by the month of their reason.
    assert [q.text() for q in incidents.searches] == [
        'state:(active OR stable) AND team:("nlp")',
        'state:(resolved) AND team:("nlp") AND gpu_hours_months:("2026-11" OR "2026-12")',
        'state:(resolved) AND gpufarm_reason_month:("2026-11" OR "2026-12") AND team:("nlp")',
    ]
    assert len(read_leases(incidents, ("2026-12",), limit=2).leases) == 2
    assert read_leases(incidents, ("2026-12",), limit=2).cut


def test_an_older_month_does_not_read_later_leases(incidents: FakeIncidents) -> None:
    _farm_of_three(incidents)
    report = make_report(incidents, VIEW, NOW, month="2026-11")
    assert report.total.held == 0 and report.total.leases == 0


# -- formats -------------------------------------------------------------------------------------------------------


def test_csv_json_and_table_say_the_same(incidents: FakeIncidents) -> None:
    _farm_of_three(incidents)
    report = make_report(incidents, VIEW, NOW, month="2026-12")
    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    assert [r["team"] for r in rows] == ["nlp", "vision", "total"]
    assert rows[0]["gpu_hours_held"] == "400.0" and rows[0]["gpu_hours_unmeasured"] == "208.0"
    assert rows[0]["reclaimed_idle"] == "1" and rows[1]["reclaimed_released"] == "1"
    assert rows[0]["quota_entitled_gpus"] == "20" and rows[0]["budgets"] == "nlp 2026-12: 400/1,000 (40%)"
    document = report_json(report)
    assert json.loads(json.dumps(document)) == document
    assert document["rows"][0]["gpu_hours"]["unmeasured"] == 208.0
    assert document["unmeasured_leases"][0]["ir"] == "IR-2"
    table = render_table(report)
    assert "gpufarm report: 2026-12 by team" in table and "IR-2 nlp/asr (hpc): 208.0 of 208.0 h" in table
    assert "reclaims: idle 1" in table and "budget: nlp 2026-12: 400/1,000 (40%)" in table


def test_csv_cells_never_start_a_formula() -> None:
    query = ReportQuery(since_period("1d", NOW), GroupBy.TEAM)
    from gpufarm.reporting.read import Leases

    report = build_report(query, Leases(()), FarmView.of(parse_farm(FARM_YAML)), NOW)
    report.rows[0].key = "=HYPERLINK(1)"
    assert "'=HYPERLINK(1)" in render_csv(report)


class _History:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[str] = []

    def timeseries(self, query: str, start: datetime, end: datetime, *, max_points: int = 300) -> list[Any]:
        from gpufarm.core.kernel.errors import UpstreamError

        self.asked.append(query)
        if self.fail:
            raise UpstreamError("metrics are down")
        return [TimeseriesResult(("team:nlp",), (MetricPoint(int(start.timestamp()), 8.0),))]


def test_usage_over_time_is_read_for_charts_and_a_failure_is_a_note(incidents: FakeIncidents) -> None:
    history = _History()
    report = make_report(incidents, VIEW, NOW, team="nlp", metrics=history, with_usage=True)
    assert history.asked == [
        "sum:gpufarm.ledger.gpus.allocated{team:nlp} by {team}",
        "sum:gpufarm.ledger.gpus.used{team:nlp} by {team}",
    ]
    assert [(u.team, u.metric) for u in report.usage] == [
        ("nlp", "gpufarm.ledger.gpus.allocated"),
        ("nlp", "gpufarm.ledger.gpus.used"),
    ]
    failed = make_report(incidents, VIEW, NOW, metrics=_History(fail=True), with_usage=True)
    assert failed.usage == [] and any("could not be read" in n for n in failed.notes)


def test_html_is_self_contained_with_three_charts(incidents: FakeIncidents) -> None:
    from gpufarm.reporting.render_html import CHART_TITLES, render_html

    _farm_of_three(incidents)
    report = make_report(incidents, VIEW, NOW, metrics=_History(), with_usage=True)
    page = render_html(report)
    assert page.startswith("<!doctype html>") and "https://" not in page.split("<script>")[0]
    assert "cdn" not in page.lower().split("<script>", 1)[0]
    assert page.count('class="chart"') == 3 and all(t in page for t in CHART_TITLES)
    assert "Plotly" in page and len(page) > 4_000_000  # plotly.js is inside
    assert "<script src=" not in page


def test_the_gateways_timeseries_answer_is_decoded_without_empty_buckets() -> None:
    from gpufarm.adapters.datadog import timeseries_results

    answer = {
        "series": [{"group_tags": ["team:nlp"], "query_index": 0}, {"group_tags": ["team:vision"]}, "garbage"],
        "times": [1_700_000_000_000, 1_700_000_300_000],
        "values": [[8.0, None], [float("nan"), 2]],
    }
    assert timeseries_results(answer) == [
        TimeseriesResult(("team:nlp",), (MetricPoint(1_700_000_000, 8.0),)),
        TimeseriesResult(("team:vision",), (MetricPoint(1_700_000_300, 2.0),)),
    ]
    assert timeseries_results({}) == []
