"""Money in reports: cost beside every hours column in the table, CSV, JSON and HTML; idle-held apart from idle;
unpriced shown as such (never 0) and totals marked incomplete; per pool the unallocated capacity and its cost."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from fakes import FARM_YAML, FakeClock, FakeIncidents

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.kernel.ports import MetricPoint, TimeseriesResult
from gpufarm.reporting import money
from gpufarm.reporting.capacity import CAPACITY_QUERY
from gpufarm.reporting.make import make_report
from gpufarm.reporting.model import Report
from gpufarm.reporting.render_csv import render_csv
from gpufarm.reporting.render_html import render_html
from gpufarm.reporting.render_json import report_json
from gpufarm.reporting.render_table import render_table

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
RATES = "rates:\n  currency: EUR\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.50}}\n"
FARM = FarmView.of(parse_farm(FARM_YAML + RATES))


def lease(incidents: FakeIncidents, *, team: str, env: str = "hpc", model: str = "H100", **hours: float) -> None:
    """An ended lease of 8 GPUs held Dec 1-2 with these accrued hours (held, busy, idle, idle_held, unmeasured)."""
    held = hours["held"]
    fields: dict[str, object] = {
        f.STATE: "resolved",
        f.PHASE: "reclaimed",
        f.TEAM: team,
        f.PROJECT: "llm",
        f.ENVIRONMENT: env,
        f.GPU_MODEL: model,
        f.GPU_COUNT: "8",
        f.HOSTS: ["node-1"],
        f.HOST_GPUS: ["node-1=8"],
        f.ALLOCATED_AT: isoformat(datetime(2026, 12, 1, tzinfo=UTC)),
        f.GPU_HOURS_UNTIL: isoformat(datetime(2026, 12, 2, tzinfo=UTC)),
        f.GPU_HOURS_HELD: f"{held:.3f}",
        f.GPU_HOURS_BUSY: f"{hours.get('busy', 0):.3f}",
        f.GPU_HOURS_IDLE: f"{hours.get('idle', 0):.3f}",
        f.GPU_HOURS_IDLE_HELD: f"{hours.get('idle_held', 0):.3f}",
        f.GPU_HOURS_UNMEASURED: f"{hours.get('unmeasured', 0):.3f}",
        f.GPU_HOURS_BY_MONTH: [f"2026-12={held:.3f}"],
        f.GPU_HOURS_MONTHS: ["2026-12"],
        f.RECLAIM_REASON: "released",
    }
    incidents.create(f"GPU request: {team}/llm", fields)


class Capacity:
    """The inventory gauge read back: 16 H100 in hpc over the period, or failing."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[str] = []

    def timeseries(self, query: str, start: datetime, end: datetime, *, max_points: int = 300) -> list[Any]:
        self.asked.append(query)
        if self.fail:
            raise UpstreamError("metrics are down")
        points = (MetricPoint(int(start.timestamp()), 16.0), MetricPoint(int(end.timestamp()), 16.0))
        return [TimeseriesResult(("environment:hpc", "gpu_model:h100"), points)]


@pytest.fixture
def report() -> Report:
    incidents = FakeIncidents(FakeClock(NOW))
    # nlp: 192 GPU-h on hpc (priced at 2.50): busy 100, idle 60 of which 20 idle-held, unmeasured 32.
    lease(incidents, team="nlp", held=192, busy=100, idle=60, idle_held=20, unmeasured=32)
    # vision: 96 GPU-h priced, and 48 on the cloud pool, which has no rate (unpriced).
    lease(incidents, team="vision", held=96, busy=96)
    lease(incidents, team="vision", env="cloud", held=48, idle=48)
    return make_report(incidents, FARM, NOW, month="2026-12", metrics=Capacity())


def test_rows_split_idle_from_idle_held_and_price_each_kind(report: Report) -> None:
    nlp = next(r for r in report.rows if r.key == "nlp")
    assert (nlp.held, nlp.busy, nlp.idle, nlp.idle_held, nlp.unmeasured) == (192, 100, 40, 20, 32)
    assert nlp.cost == {
        "held": Decimal("480.00"),
        "busy": Decimal("250.00"),
        "idle": Decimal("100.00"),
        "idle_held": Decimal("50.00"),
        "unmeasured": Decimal("80.00"),
    }
    assert nlp.utilisation == pytest.approx(100 * 100 / 160)
    # Every kind adds up to held, and the rows to the total, to the cent.
    for row in [*report.rows, report.total]:
        assert sum(row.cost[k] for k in ("busy", "idle", "idle_held", "unmeasured")) == row.cost["held"]
    for kind in money.SHOWN:
        assert sum(r.cost.get(kind, money.ZERO) for r in report.rows) == report.total.cost[kind]
    assert report.currency == "EUR"


def test_a_row_with_an_unpriced_lease_is_incomplete_and_one_of_only_unpriced_says_unpriced(report: Report) -> None:
    vision = next(r for r in report.rows if r.key == "vision")
    assert (vision.priced_leases, vision.unpriced_leases) == (1, 1) and money.incomplete(vision)
    assert money.money_text(vision, "held") == "240.00*"
    incidents = FakeIncidents(FakeClock(NOW))
    lease(incidents, team="vision", env="cloud", held=48, idle=48)
    only = make_report(incidents, FARM, NOW, month="2026-12")
    row = next(r for r in only.rows if r.key == "vision")
    assert money.amount(row, "held") is None and money.money_text(row, "idle") == "unpriced"
    assert any("unpriced (never 0)" in n for n in only.notes)


def test_the_table_shows_cost_beside_each_hours_column_and_the_pools(report: Report) -> None:
    text = render_table(report)
    head = next(line for line in text.splitlines() if line.startswith("group"))
    assert head.split()[:12] == [
        "group",
        "leases",
        "held",
        "h",
        "EUR",
        "busy",
        "h",
        "EUR",
        "idle",
        "h",
        "EUR",
        "idle-held",
    ]
    assert "480.00" in text and "240.00*" in text and "720.00*" in text  # the total leaves out the unpriced lease
    assert "  hpc H100: 16.0 GPUs, 3,648.0 h capacity, 288.0 held, 3,360.0 unallocated (8,400.00)" in text
    assert "  cloud H100: 48.0 h held, capacity not read" in text  # the gauge has no series of it


def test_the_csv_has_a_documented_money_column_beside_each_hours_column(report: Report) -> None:
    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    names = list(rows[0])
    for kind in ("held", "busy", "idle", "idle_held", "unmeasured"):
        assert names.index(f"cost_{kind}") == names.index(f"gpu_hours_{kind}") + 1
    nlp, vision, total = (next(r for r in rows if r["team"] == k) for k in ("nlp", "vision", "total"))
    assert (nlp["currency"], nlp["cost_held"], nlp["cost_idle_held"], nlp["unpriced_leases"]) == (
        "EUR",
        "480.00",
        "50.00",
        "0",
    )
    assert (vision["cost_held"], vision["unpriced_leases"]) == ("240.00", "1")
    assert total["cost_held"] == "720.00" and total["gpu_hours_idle_held"] == "20.0"
    from pathlib import Path

    documented = (Path(__file__).resolve().parents[2] / "docs/operate.md").read_text()
    assert all(f"`{name}`" in documented for name in ("cost_held", "cost_idle_held", "unpriced_leases", "currency"))


def test_the_json_gives_money_with_null_and_a_flag_when_unpriced(report: Report) -> None:
    doc = json.loads(json.dumps(report_json(report)))
    assert doc["currency"] == "EUR"
    nlp = next(r for r in doc["rows"] if r["group"] == "nlp")
    assert nlp["gpu_hours"]["idle_held"] == 20 and nlp["cost"]["idle_held"] == 50.0
    assert nlp["cost"] | {} == {
        "held": 480.0,
        "busy": 250.0,
        "idle": 100.0,
        "idle_held": 50.0,
        "unmeasured": 80.0,
        "unpriced": False,
        "incomplete": False,
        "unpriced_leases": 0,
    }
    assert doc["total"]["cost"]["incomplete"] is True
    cloud = next(p for p in doc["pools"] if p["environment"] == "cloud" and p["gpu_model"] == "H100")
    assert cloud["unallocated_cost"] is None and cloud["unpriced"] is True
    hpc = next(p for p in doc["pools"] if p["environment"] == "hpc")
    assert hpc["gpu_hours"]["unallocated"] == 3360 and hpc["unallocated_cost"] == 8400.0


def test_the_html_shows_money_columns_and_the_unallocated_capacity(report: Report) -> None:
    page = render_html(report)
    assert "<th>held EUR</th>" in page and "<th>idle-held GPU-h</th>" in page
    assert "Unallocated capacity" in page and "8,400.00" in page and "unpriced" in page


def test_capacity_is_read_once_from_the_inventory_gauge_and_a_failure_is_a_note() -> None:
    incidents = FakeIncidents(FakeClock(NOW))
    lease(incidents, team="nlp", held=192, busy=192)
    reader = Capacity()
    make_report(incidents, FARM, NOW, month="2026-12", metrics=reader)
    assert reader.asked == [CAPACITY_QUERY]
    failed = make_report(incidents, FARM, NOW, month="2026-12", metrics=Capacity(fail=True))
    assert all(p.unallocated is None for p in failed.pools)
    assert any("could not be read" in n for n in failed.notes)
    # A team's report has no pools: spare capacity is the farm's.
    assert make_report(incidents, FARM, NOW, month="2026-12", team="nlp", metrics=reader).pools == []
