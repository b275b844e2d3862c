"""A real browser looks at a local dashboard: headless Chromium loads the node dashboard the sandbox draws from a
small simulated farm (`gpufarm datadog apply`, the real node agent on fake NVML, leases, the sync's gauges), and
the charts must have drawn: no console error, an SVG per chart, every widget's title, the tables filled. The page's
screenshot and its time to render are kept under .artifacts/dashboards/ (the CI's artefacts)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_chromium import installed_chromium

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.setup.dashboards_widgets import walk
from gpufarm_sandbox.browser import chromium
from gpufarm_sandbox.dashboard_preview import build_preview
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "dashboards"
RENDER_LIMIT_MS = 30_000


@pytest.fixture(scope="module")
def preview() -> Iterator[tuple[str, dict[str, str], Sandbox]]:
    sandbox = Sandbox()
    with ServerThread(sandbox) as server:
        sandbox.base_url = server.url
        farm = parse_farm((ROOT / "config" / "farm.example.yaml").read_text())
        made = build_preview(sandbox, server.url, farm, hosts=3, cycles=5)
        yield server.url, made.dashboards, sandbox


def test_the_node_dashboard_draws_in_headless_chromium(preview: tuple[str, dict[str, str], Sandbox]) -> None:
    binary = installed_chromium()
    url, dashboards, sandbox = preview
    stored: dict[str, Any] = next(d for d in sandbox.dashboards.live() if d["id"] == dashboards["node"])
    with chromium(binary) as browser:
        report = browser.load(f"{url}/dashboards/{dashboards['node']}?span=1h")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "node.png").write_bytes(report.screenshot)
    summary = report.summary
    (ARTIFACTS / "node.json").write_text(json.dumps({**summary, "load_ms": round(report.load_ms)}, indent=2))

    assert report.console_errors == []
    assert summary["rendered"] is True, summary
    assert summary["title"] == "gpufarm: node, device, process"
    # Every chart drew its SVG; every titled widget of the stored JSON is on the page.
    charts = [w for w in walk(stored["widgets"]) if w["definition"]["type"] in ("timeseries", "toplist")]
    assert summary["charts"] == len(charts) and summary["svgCharts"] >= summary["charts"] > 0
    titles = [str(w["definition"]["title"]) for w in walk(stored["widgets"]) if w["definition"].get("title")]
    assert set(titles) <= set(summary["headings"])
    assert summary["tables"] == sum(1 for w in walk(stored["widgets"]) if w["definition"]["type"] == "query_table")
    assert summary["errors"] == []
    assert report.screenshot.startswith(b"\x89PNG") and len(report.screenshot) > 20_000
    assert 0 < summary["renderMs"] < RENDER_LIMIT_MS


def test_the_html_report_draws_in_headless_chromium(tmp_path: Path) -> None:
    """The self-contained report (issue 13 point 3), opened from a file as a user opens it, offline: no console
    error, every chart's SVG and title, the table's rows; the screenshot is kept under .artifacts/report/."""
    from datetime import UTC, datetime, timedelta

    from gpufarm.core.kernel.model import Allocation, isoformat
    from gpufarm.reporting.build import build_report
    from gpufarm.reporting.model import UsageSeries
    from gpufarm.reporting.query import GroupBy, ReportQuery, since_period
    from gpufarm.reporting.read import Leases
    from gpufarm.reporting.render_html import CHART_TITLES, render_html

    binary = installed_chromium()
    now = datetime(2026, 12, 10, 12, tzinfo=UTC)
    farm = parse_farm((ROOT / "config" / "farm.example.yaml").read_text())
    leases = []
    for i, (team, busy) in enumerate((("nlp", 0.8), ("vision", 0.3), ("speech", 0.5), ("nlp", 0.1)), start=1):
        start, until = now - timedelta(days=3 + i), now - timedelta(hours=1)
        held = 8 * (until - start).total_seconds() / 3600
        leases.append(
            Allocation.model_validate(
                {
                    "incident_id": f"i{i}",
                    "ir": i,
                    "title": "t",
                    "state": "stable",
                    "phase": "allocated",
                    "team": team,
                    "project": f"p{i}",
                    "environment": "onprem-hpc",
                    "hosts": (f"h{i}",),
                    "host_gpus": {f"h{i}": 8},
                    "allocated_at": start,
                    "hours_until": until,
                    "hours_held": held,
                    "hours_busy": held * busy * 0.9,
                    "hours_idle": held * (1 - busy) * 0.9,
                    "hours_unmeasured": held * 0.1,
                    "hours_by_month": (f"2026-12={held:.3f}",),
                    "history": (f"{isoformat(start)} gpufarm allocated: hosts: h{i}",),
                }
            )
        )
    hours = range(int((now - timedelta(days=7)).timestamp()), int(now.timestamp()), 3600)
    usage = [
        UsageSeries(team, metric, tuple((t, float(level)) for t in hours))
        for team, level in (("nlp", 16), ("vision", 8), ("speech", 8))
        for metric in ("gpufarm.ledger.gpus.allocated", "gpufarm.ledger.gpus.used")
    ]
    report = build_report(
        ReportQuery(since_period("7d", now), GroupBy.TEAM), Leases(tuple(leases)), FarmView.of(farm), now, usage=usage
    )
    page = tmp_path / "report.html"
    page.write_text(render_html(report))
    with chromium(binary) as browser:
        shown = browser.load(page.as_uri(), timeout_s=60)
    artifacts = ROOT / ".artifacts" / "report"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "report.png").write_bytes(shown.screenshot)
    summary = shown.summary
    (artifacts / "report.json").write_text(json.dumps({**summary, "load_ms": round(shown.load_ms)}, indent=2))

    assert shown.console_errors == []
    assert summary["rendered"] is True, summary
    assert summary["title"] == "gpufarm report: last 7d to 2026-12-10T12:00:00Z by team"
    assert summary["charts"] == 3 and summary["svgCharts"] >= 3
    assert set(CHART_TITLES) <= set(summary["headings"])
    assert shown.screenshot.startswith(b"\x89PNG") and len(shown.screenshot) > 20_000
    assert 0 < summary["renderMs"] < RENDER_LIMIT_MS
