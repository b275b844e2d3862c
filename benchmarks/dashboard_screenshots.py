"""Screenshots of gpufarm's five dashboards as the sandbox draws them, and each page's time to render in Chromium.

A sandbox on a free loopback port gets `gpufarm datadog apply` with config/farm.example.yaml, simulated nodes of
the three example pools running the real node agent with leases on them, and the sync's quota and inventory
gauges, every sandbox minute for `--minutes` (gpufarm_sandbox.dashboard_preview); headless Chromium then loads
each local dashboard page (`/dashboards/<id>`), waits until its charts have drawn, and saves a full-page PNG.
Each page is loaded `--loads` times in one browser: the very first load (of the first dashboard) includes fetching
and compiling plotly.js (4.8 MB); later ones take it from the browser's cache, as a user's next look does.

Run: .venv/bin/python benchmarks/dashboard_screenshots.py [--out docs/screenshots] [--hosts 12] [--minutes 60]
(`make screenshots`). Prints one JSON document: per dashboard the render times (ms) and what the page drew.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gpufarm.core.config.farm import parse_farm
from gpufarm_sandbox.browser import chromium
from gpufarm_sandbox.dashboard_preview import build_preview
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Build the preview farm, render every dashboard, save the screenshots, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--hosts", type=int, default=12, help="simulated nodes (spread over the three pools)")
    parser.add_argument("--minutes", type=int, default=60, help="sandbox minutes of agent cycles and gauges")
    parser.add_argument("--loads", type=int, default=3, help="loads of each page (the first one is cold)")
    parser.add_argument("--span", default="1h", help="the pages' time frame")
    args = parser.parse_args()

    farm = parse_farm((ROOT / "config" / "farm.example.yaml").read_text())
    sandbox = Sandbox()
    results: dict[str, dict[str, object]] = {}
    with ServerThread(sandbox) as server:
        sandbox.base_url = server.url
        started = time.perf_counter()
        preview = build_preview(sandbox, server.url, farm, hosts=args.hosts, cycles=args.minutes)
        built_s = time.perf_counter() - started
        args.out.mkdir(parents=True, exist_ok=True)
        with chromium() as browser:
            for key, dashboard_id in preview.dashboards.items():
                url = f"{server.url}/dashboards/{dashboard_id}?span={args.span}"
                reports = [browser.load(url, screenshot=i == args.loads - 1) for i in range(args.loads)]
                last = reports[-1]
                if last.console_errors or not last.summary.get("rendered"):
                    raise SystemExit(f"{key}: did not render cleanly: {last.console_errors} {last.summary}")
                path = args.out / f"{key}.png"
                path.write_bytes(last.screenshot)
                renders = [float(r.summary["renderMs"]) for r in reports]
                results[key] = {
                    "screenshot": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                    "render_ms_first": renders[0],
                    "render_ms_again_median": statistics.median(renders[1:]) if len(renders) > 1 else None,
                    "charts": last.summary["charts"],
                    "svg": last.summary["svgCharts"],
                    "tables": last.summary["tables"],
                    "height_px": last.summary["height"],
                }
    print(
        json.dumps({"hosts": args.hosts, "minutes": args.minutes, "preview_s": round(built_s, 1), **results}, indent=2)
    )


if __name__ == "__main__":
    main()
