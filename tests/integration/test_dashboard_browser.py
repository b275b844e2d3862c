"""A real browser looks at a local dashboard: headless Chromium loads the node dashboard the sandbox draws from a
small simulated farm (`gpufarm datadog apply`, the real node agent on fake NVML, leases, the sync's gauges), and
the charts must have drawn: no console error, an SVG per chart, every widget's title, the tables filled. The page's
screenshot and its time to render are kept under .artifacts/dashboards/ (the CI's artefacts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufarm.core.farm import parse_farm
from gpufarm.setup.dashboards_widgets import walk
from gpufarm_sandbox.browser import chromium, find_chromium
from gpufarm_sandbox.dashboard_preview import build_preview
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "dashboards"
RENDER_LIMIT_MS = 30_000


def _chromium() -> str:
    """Debian's chromium; installed with apt-get when missing and possible (CI runs as root), else a skip."""
    found = find_chromium()
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get)")
    install = [apt, "install", "-y", "--no-install-recommends", "chromium"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=900, check=False)
    found = find_chromium()
    if done.returncode != 0 or not found:
        pytest.skip(f"chromium is not installed and apt-get could not install it: {done.stderr.strip()[-300:]}")
    return found


@pytest.fixture(scope="module")
def preview() -> Iterator[tuple[str, dict[str, str], Sandbox]]:
    sandbox = Sandbox()
    with ServerThread(sandbox) as server:
        sandbox.base_url = server.url
        farm = parse_farm((ROOT / "config" / "farm.example.yaml").read_text())
        made = build_preview(sandbox, server.url, farm, hosts=3, cycles=5)
        yield server.url, made.dashboards, sandbox


def test_the_node_dashboard_draws_in_headless_chromium(preview: tuple[str, dict[str, str], Sandbox]) -> None:
    binary = _chromium()
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
