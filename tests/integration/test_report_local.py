"""The report end to end on the local host (issue 13 point 3 and the demo's ending): a lease held for an hour with
6 of 8 GPUs busy accrues through the sync and ends; `gpufarm report --month` writes the month as CSV (a row per
team, nlp's held GPU-hours) and self-contained HTML; bad input exits 2 and writes nothing."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import report_stage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_the_demo_ends_with_the_months_report(
    run_stage: Callable[[ModuleType], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(report_stage.REPORT_DIR_ENV, str(tmp_path))
    output = run_stage(report_stage)
    [csv_path] = tmp_path.glob("report-*.csv")
    [html_path] = tmp_path.glob("report-*.html")
    assert f"report written: {csv_path}" in output and f"report written: {html_path}" in output
    rows = {r["team"]: r for r in csv.DictReader(io.StringIO(csv_path.read_text()))}
    assert {"nlp", "vision", "speech", "total"} <= set(rows)
    nlp = rows["nlp"]
    # One hour and a bit of 8 H100: held, most of it measured busy (6 of 8), 1 idle-held, the rest idle or unmeasured.
    assert float(nlp["gpu_hours_held"]) >= 8.0
    assert float(nlp["gpu_hours_busy"]) > 0 and float(nlp["gpu_hours_idle_held"]) > 0
    held = float(nlp["gpu_hours_held"])
    kinds = ("busy", "idle", "idle_held", "unmeasured")
    parts = sum(float(nlp[f"gpu_hours_{k}"]) for k in kinds)
    assert parts == pytest.approx(held, abs=0.3)
    # Cost beside hours: priced, the kinds add up to the held cost; unpriced, no amount at all (never 0).
    if nlp["cost_held"]:
        assert sum(Decimal(nlp[f"cost_{k}"]) for k in kinds) == Decimal(nlp["cost_held"])
    else:
        assert nlp["unpriced_leases"] == "1" and not any(nlp[f"cost_{k}"] for k in kinds)
    assert "the kinds (busy, idle, idle-held, unmeasured) add up to the held cost" in output
    assert nlp["reclaimed_released"] == "1" and nlp["leases"] == "1"
    page = html_path.read_text()
    assert page.count('class="chart"') == 3 and "<script src=" not in page
    # Usage over time came back through the gateway's timeseries query: the sync's ledger gauges for nlp.
    figures = json.loads(page.split('<script id="figures" type="application/json">', 1)[1].split("</script>", 1)[0])
    names = [t["name"] for t in figures["usage"]["data"]]
    assert "nlp busy" in names and "held (all teams)" in names
    busy = next(t for t in figures["usage"]["data"] if t["name"] == "nlp busy")
    assert max(busy["y"]) >= 6
    assert not (tmp_path / "refused.csv").exists()
