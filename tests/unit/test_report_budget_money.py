"""Budgets in money in reports: spent / amount with the currency beside the GPU-hour budgets, in the table, the CSV,
the JSON and the HTML; a budget some of whose leases no rate prices reads incomplete, never under budget."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from fakes import FARM_YAML, FakeClock, FakeIncidents

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.model import isoformat
from gpufarm.reporting.make import make_report
from gpufarm.reporting.model import BudgetUse, Report
from gpufarm.reporting.render_csv import render_csv
from gpufarm.reporting.render_html import render_html
from gpufarm.reporting.render_json import report_json
from gpufarm.reporting.render_table import render_table

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
FARM_TEXT = (
    FARM_YAML
    + "rates:\n  currency: EUR\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.50}}\n"
    + "budgets:\n"
    + "  - {team: nlp, period: month, amount: 2000}\n"
    + "  - {team: vision, period: month, amount: 100}\n"
    + "  - {team: nlp, project: llm, period: month, gpu_hours: 500}\n"
)
FARM = FarmView.of(parse_farm(FARM_TEXT))
NLP = "nlp 2026-12: EUR 480.00/2,000.00 (24%)"
VISION = "vision 2026-12: EUR 240.00 priced/100.00, incomplete (no rate prices cloud)"


def _lease(incidents: FakeIncidents, team: str, env: str, held: float) -> None:
    """An ended lease of project llm, 8 H100 held Dec 1-2 for these GPU-hours."""
    incidents.create(
        f"GPU request: {team}/llm",
        {
            f.STATE: "resolved",
            f.PHASE: "reclaimed",
            f.TEAM: team,
            f.PROJECT: "llm",
            f.ENVIRONMENT: env,
            f.GPU_MODEL: "H100",
            f.GPU_COUNT: "8",
            f.HOSTS: ["node-1"],
            f.HOST_GPUS: ["node-1=8"],
            f.ALLOCATED_AT: isoformat(datetime(2026, 12, 1, tzinfo=UTC)),
            f.GPU_HOURS_UNTIL: isoformat(datetime(2026, 12, 2, tzinfo=UTC)),
            f.GPU_HOURS_HELD: f"{held:.3f}",
            f.GPU_HOURS_BUSY: f"{held:.3f}",
            f.GPU_HOURS_BY_MONTH: [f"2026-12={held:.3f}"],
            f.GPU_HOURS_MONTHS: ["2026-12"],
            f.RECLAIM_REASON: "released",
        },
    )


@pytest.fixture
def incidents() -> FakeIncidents:
    store = FakeIncidents(FakeClock(NOW))
    _lease(store, "nlp", "hpc", 192)  # EUR 480.00 at 2.50
    _lease(store, "vision", "hpc", 96)  # EUR 240.00
    _lease(store, "vision", "cloud", 48)  # no rate prices the cloud pool
    return store


@pytest.fixture
def report(incidents: FakeIncidents) -> Report:
    return make_report(incidents, FARM, NOW, month="2026-12")


def test_a_budget_in_money_burns_what_the_rate_card_prices_its_leases_at(report: Report) -> None:
    nlp, vision = (next(r for r in report.rows if r.key == k) for k in ("nlp", "vision"))
    assert nlp.budgets == [
        BudgetUse("nlp", "2026-12", 192.0, amount=Decimal(2000), spent=Decimal("480.00"), currency="EUR")
    ]
    assert not nlp.budgets[0].incomplete and nlp.budgets[0].percent == 24.0
    (used,) = vision.budgets
    assert used.incomplete and used.unpriced == ("cloud",) and used.spent == Decimal("240.00")
    assert (nlp.budgets_text(), vision.budgets_text()) == (NLP, VISION)


def test_the_table_csv_and_html_show_spent_of_amount_and_incomplete_never_under(report: Report) -> None:
    table = render_table(report)
    assert f"budget: {NLP}" in table and f"budget: {VISION}" in table
    rows = {r["team"]: r for r in csv.DictReader(io.StringIO(render_csv(report)))}
    assert (rows["nlp"]["budgets"], rows["vision"]["budgets"]) == (NLP, VISION)
    page = render_html(report)
    assert NLP in page and VISION in page
    assert "under budget" not in table + page


def test_the_json_gives_a_budget_in_money_its_amount_spent_currency_and_completeness(report: Report) -> None:
    doc = json.loads(json.dumps(report_json(report)))
    by_group = {r["group"]: r["budgets"] for r in doc["rows"]}
    assert by_group["nlp"] == [
        {
            "budget": "nlp",
            "period": "2026-12",
            "burned": 192.0,
            "gpu_hours": None,
            "amount": 2000.0,
            "spent": 480.0,
            "currency": "EUR",
            "incomplete": False,
            "unpriced": [],
        }
    ]
    vision = by_group["vision"][0]
    assert (vision["incomplete"], vision["unpriced"], vision["spent"]) == (True, ["cloud"], 240.0)


def test_a_gpu_hour_budget_beside_them_reads_as_before(incidents: FakeIncidents) -> None:
    by_project = make_report(incidents, FARM, NOW, month="2026-12", by="project")
    llm = next(r for r in by_project.rows if r.key == "llm")
    assert llm.budgets_text() == "nlp/llm 2026-12: 192/500 (38%)"
    doc = json.loads(json.dumps(report_json(by_project)))
    (entry,) = next(r["budgets"] for r in doc["rows"] if r["group"] == "llm")
    assert (entry["gpu_hours"], entry["amount"], entry["currency"], entry["incomplete"]) == (500, None, None, False)


def test_the_budget_json_fields_are_documented() -> None:
    documented = (Path(__file__).resolve().parents[2] / "docs/operate.md").read_text()
    assert all(f"`{name}`" in documented for name in ("amount", "spent", "incomplete", "unpriced"))
