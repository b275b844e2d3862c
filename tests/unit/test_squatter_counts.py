"""Squatting is counted from the hurt leases' own history and fields: the digest's day (episodes, stops,
device-hours, top hosts; gpufarm.core.squatters.counts) and the report's rows per team (episodes begun and squatters
stopped inside the period, in every format; gpufarm.reporting.squatting)."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

from fakes import FARM_YAML

from gpufarm.core.chat.escape import inert
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.digest.build import squatter_lines
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.squatters.counts import lease_tally, tally
from gpufarm.reporting.build import build_report
from gpufarm.reporting.query import GroupBy, Period, ReportQuery
from gpufarm.reporting.read import Leases
from gpufarm.reporting.render_csv import render_csv
from gpufarm.reporting.render_json import render_json

DAY = datetime(2026, 12, 1, tzinfo=UTC)
DEV1 = "gpu-00000000-0000-4000-8000-000000000001"
DEV2 = "gpu-00000000-0000-4000-8000-000000000002"


def _line(at: datetime, step: Step, *details: str) -> str:
    return history.entry(at, history.MONITOR, step, *details).line()


def _lease(ir: int, team: str, lines: list[str], open_now: tuple[str, ...] = ()) -> Allocation:
    return Allocation(
        incident_id=f"id-{ir}",
        ir=ir,
        title="t",
        state=State.STABLE,
        phase=Phase.ALLOCATED,
        team=team,
        project="p",
        environment="hpc",
        history=tuple(lines),
        squatters=open_now,
    )


def _leases() -> list[Allocation]:
    at = DAY + timedelta(hours=10)
    ended = _lease(
        1,
        "nlp",
        [
            _line(DAY - timedelta(hours=1), Step.SQUATTED, f"on hpc-1/{DEV1}", "pid 7"),  # began the day before
            _line(DAY + timedelta(hours=1), Step.SQUATTER_CLEARED, f"on hpc-1/{DEV1} after 120 min"),
            _line(at, Step.SQUATTED, f"on hpc-1/{DEV2}", "pid 8 (user bob)"),
            _line(at + timedelta(minutes=10), Step.SQUATTER_STOPPED, f"on hpc-1/{DEV2}", "after 10 min grace"),
            _line(at + timedelta(minutes=30), Step.SQUATTER_CLEARED, f"on hpc-1/{DEV2} after 30 min (stopped)"),
        ],
    )
    still = _lease(
        2,
        "vision",
        [_line(DAY + timedelta(hours=22), Step.SQUATTED, f"on hpc-2/{DEV1}")],
        (f"hpc-2/{DEV1}={isoformat(DAY + timedelta(hours=22))}",),
    )
    return [ended, still, _lease(3, "nlp", [])]


def test_the_day_counts_episodes_begun_stops_and_the_device_hours_inside_it() -> None:
    leases = _leases()
    day = tally(leases, DAY, DAY + timedelta(days=1))
    # Lease 1: the hour of yesterday's episode inside today, and 30 min of today's (stopped); lease 2's open one
    # runs from 22:00 to the day's end.
    assert (day.episodes, day.stops) == (2, 1)
    assert round(day.device_hours, 2) == 3.5
    assert day.top_hosts(3) == [("hpc-2", 2.0), ("hpc-1", 1.5)]
    assert lease_tally(leases[2], DAY, DAY + timedelta(days=1)).episodes == 0
    lines = squatter_lines(day)
    assert lines == ["2 episode(s), 1 stopped, 3.5 device-hours squatted", "most on hpc-2 2.0 h, hpc-1 1.5 h"]
    assert squatter_lines(tally([leases[2]], DAY, DAY + timedelta(days=1))) == []


def test_a_host_name_in_the_digest_is_inert() -> None:
    hostile = _lease(4, "nlp", [], (f"<!channel>/{DEV1}={isoformat(DAY)}",))
    (_, top) = squatter_lines(tally([hostile], DAY, DAY + timedelta(hours=1)))
    assert inert("<!channel>") in top and "<!channel>" not in top


def test_the_report_counts_squatting_per_team_in_every_format() -> None:
    period = Period(DAY, DAY + timedelta(days=1), "2026-12-01")
    report = build_report(
        ReportQuery(period, GroupBy.TEAM), Leases(tuple(_leases())), FarmView.of(parse_farm(FARM_YAML)), DAY
    )
    rows = {r.key: r for r in report.rows}
    assert (rows["nlp"].squatter_episodes, rows["nlp"].squatter_stops) == (1, 1)
    assert (rows["vision"].squatter_episodes, rows["vision"].squatter_stops) == (1, 0)
    assert (report.total.squatter_episodes, report.total.squatter_stops) == (2, 1)
    table = list(csv.DictReader(io.StringIO(render_csv(report))))
    nlp = next(r for r in table if r["team"] == "nlp")
    assert (nlp["squatter_episodes"], nlp["squatters_stopped"]) == ("1", "1")
    data = json.loads(render_json(report))
    assert next(r for r in data["rows"] if r["group"] == "nlp")["squatters"] == {"episodes": 1, "stopped": 1}
