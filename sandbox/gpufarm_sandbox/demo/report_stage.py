"""Demo stage "report": the month's report, written as HTML and CSV, and the paths printed.

Alice holds 8 H100 on the HPC pool for an hour while its agent reports 6 of them busy and 1 idle-held (memory
held, no work); the scheduled sync measures and accrues the lease's GPU-hours into its incident, idle-held apart,
and she releases it. Then `gpufarm report --month <this
month>` runs as an operator would run it, once as CSV and once as self-contained HTML (plotly inlined, no CDN),
over everything this demo's leases held; the CSV must have a row for each of the farm's teams and non-zero held
GPU-hours for nlp, and the HTML its three charts. Each row's cost stands beside its hours, split by kind (busy,
idle, idle-held, unmeasured), and the kinds add up to the held cost to the cent; a row no rate prices says so.
Bad input is refused with exit 2 and writes nothing. The files go to GPUFARM_REPORT_DIR, else a
`gpufarm-demo-report` folder in the system's temporary directory.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.demo.report_cli import invoke_report
from gpufarm_sandbox.example_farm import ALICE

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

REPORT_DIR_ENV = "GPUFARM_REPORT_DIR"
REQUEST = "request 8 H100 project=report-demo team=nlp env=onprem-hpc days=1 purpose=monthly-report"
STEP_S = 600
HELD_S = 3600 + STEP_S


def report_dir() -> Path:
    """Where the demo writes the month's report."""
    named = os.environ.get(REPORT_DIR_ENV)
    return Path(named) if named else Path(tempfile.gettempdir()) / "gpufarm-demo-report"


def run(ctx: DemoContext) -> None:
    """Hold a lease for an hour with busy GPUs, release it, write the month's report as CSV and HTML."""
    if ctx.local is None:
        ctx.check(False, "the report stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    try:
        _hold_a_lease(ctx, farm)
        month = datetime.fromtimestamp(float(farm.get("/_sandbox/clock")["now"]), UTC).strftime("%Y-%m")
        _refused(ctx, month)
        _write(ctx, month)
    finally:
        farm.close()


def _busy(ir: int, host: str, start: int) -> list[dict[str, Any]]:
    """6 busy and 1 idle-held GPUs of the lease, one point a minute for STEP_S seconds, as gpufarm-node sends them."""
    return [
        {
            "metric": metric,
            "type": 3,
            "points": [{"timestamp": t, "value": value} for t in range(start, start + STEP_S, 60)],
            "tags": [f"gpu_ir:ir-{ir}", f"ir:ir-{ir}", "environment:onprem-hpc"],
            "resources": [{"name": host, "type": "host"}],
        }
        for metric, value in (("gpufarm.ir.gpus_busy", 6.0), ("gpufarm.ir.gpus_idle_held", 1.0))
    ]


def _hold_a_lease(ctx: DemoContext, farm: LocalFarm) -> None:
    with ctx.step(f"{ALICE.name} holds 8 H100 for an hour, 6 of them busy and 1 idle-held, then releases them"):
        farm.slash(ALICE, REQUEST)
        farm.settle()
        answers = farm.messages(user=ALICE.id, kind="response", contains="/report-demo`")
        ir = ir_in(answers[-1]["text"]) if answers else None
        if not ctx.check(ir is not None, "the request has an IR") or ir is None:
            return
        if not ctx.check(farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED), f"IR-{ir} is allocated"):
            return
        [host, *_] = farm.allocation(ir).hosts
        for _ in range(HELD_S // STEP_S):
            now = int(float(farm.get("/_sandbox/clock")["now"]))
            agentcheck.push(farm.base_url, farm.host.env["DD_API_KEY"], _busy(ir, host, now))
            farm.post("/_sandbox/clock", {"advance": STEP_S})
            farm.settle()
        farm.slash(ALICE, f"release IR-{ir} now")
        farm.settle()
        ended = farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED)
        lease = farm.allocation(ir)
        ctx.check(
            ended and lease.hours_held > 0,
            f"IR-{ir} ended with its GPU-hours in the incident",
            f"held {lease.hours_held:.1f}, busy {lease.hours_busy:.1f}, idle {lease.hours_idle:.1f} "
            f"(of which idle-held {lease.hours_idle_held:.1f}), unmeasured {lease.hours_unmeasured:.1f}",
        )


def _refused(ctx: DemoContext, month: str) -> None:
    with ctx.step("gpufarm report refuses bad input with exit 2, writing nothing"):
        target = report_dir() / "refused.csv"
        target.unlink(missing_ok=True)
        for args in (
            ["--since", "0d"],
            ["--month", "2026-13"],
            ["--since", "30d", "--month", month],
            ["--team", "ghost"],
        ):
            code, text = invoke_report([*args, "--format", "csv", "--out", str(target)])
            ctx.check(code == 2 and not target.exists(), f"gpufarm report {' '.join(args)}: exit 2", text.strip()[:120])


def _write(ctx: DemoContext, month: str) -> None:
    folder = report_dir()
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, html_path = folder / f"report-{month}.csv", folder / f"report-{month}.html"
    with ctx.step(f"gpufarm report --month {month}: the month's report as CSV and HTML"):
        code, text = invoke_report(["--month", month, "--format", "csv", "--out", str(csv_path)])
        if not ctx.check(code == 0 and csv_path.exists(), "the CSV is written", text.strip()[:200]):
            return
        rows = {r["team"]: r for r in csv.DictReader(io.StringIO(csv_path.read_text()))}
        teams = ("nlp", "vision", "speech")
        ctx.check(all(t in rows for t in teams), "a row for each of the farm's teams", ", ".join(rows))
        held = float(rows.get("nlp", {}).get("gpu_hours_held") or 0)
        nlp = rows.get("nlp", {})
        ctx.check(
            held > 0,
            "nlp held GPU-hours this month",
            f"held {held:.1f}, busy {nlp.get('gpu_hours_busy')}, idle {nlp.get('gpu_hours_idle')}, "
            f"unmeasured {nlp.get('gpu_hours_unmeasured')}, leases {nlp.get('leases')}",
        )
        _money(ctx, rows)
        code, text = invoke_report(["--month", month, "--format", "html", "--out", str(html_path)])
        page = html_path.read_text() if html_path.exists() else ""
        ctx.check(
            code == 0 and page.count('class="chart"') == 3 and "<script src=" not in page,
            "the HTML is written, self-contained, with its three charts",
            f"{len(page.encode()):,} bytes",
        )
        _, table = invoke_report(["--month", month])
        lines = table.splitlines()
        for line in lines[:10] + [x for x in lines if x.startswith("note:")]:
            ctx.info(line)
        _measured(ctx, month)
        ctx.info(f"report written: {csv_path}")
        ctx.info(f"report written: {html_path}")


KINDS = ("busy", "idle", "idle_held", "unmeasured")


def _money(ctx: DemoContext, rows: dict[str, dict[str, str]]) -> None:
    """Cost beside hours by kind: each priced row's kinds add up to its held cost; an unpriced row has no amount."""
    from decimal import Decimal

    priced = {team: row for team, row in rows.items() if row.get("cost_held")}
    for team, row in sorted(priced.items()):
        split = ", ".join(f"{k.replace('_', '-')} {row[f'gpu_hours_{k}']} h {row[f'cost_{k}']}" for k in KINDS)
        ctx.info(f"  {team}: held {row['gpu_hours_held']} h = {row['cost_held']} {row['currency']}: {split}")
    adds_up = all(sum(Decimal(row[f"cost_{k}"]) for k in KINDS) == Decimal(row["cost_held"]) for row in priced.values())
    unpriced = [t for t, row in rows.items() if not row.get("cost_held") and int(row.get("unpriced_leases") or 0)]
    said = f"{len(priced)} row(s) priced" + (f"; unpriced (no rate): {', '.join(sorted(unpriced))}" if unpriced else "")
    ctx.check(
        adds_up and all(not rows[t].get(f"cost_{k}") for t in unpriced for k in KINDS),
        "the kinds (busy, idle, idle-held, unmeasured) add up to the held cost; unpriced rows have no amount",
        said,
    )


def _measured(ctx: DemoContext, month: str) -> None:
    """The leases whose hosts ran an agent, with their measured busy and idle GPU-hours, and why the rest have
    none."""
    code, text = invoke_report(["--month", month, "--by", "ir", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(text))) if code == 0 else []
    leases = [r for r in rows if r.get("ir", "").startswith("IR-")]

    def hours(row: dict[str, str], name: str) -> float:
        return float(row.get(f"gpu_hours_{name}") or 0)

    measured = [r for r in leases if hours(r, "busy") + hours(r, "idle") + hours(r, "idle_held") > 0]
    ctx.check(
        bool(measured), "leases whose hosts ran an agent have measured busy and idle GPU-hours", f"{len(measured)}"
    )
    for row in measured:
        cost = f" ({row['cost_held']} {row['currency']})" if row.get("cost_held") else " (unpriced)"
        ctx.info(
            f"  {row['ir']}: held {hours(row, 'held'):,.1f} h{cost}, busy {hours(row, 'busy'):,.1f}, "
            f"idle {hours(row, 'idle'):,.1f}, idle-held {hours(row, 'idle_held'):,.1f}, "
            f"unmeasured {hours(row, 'unmeasured'):,.1f}"
        )
    rest = [r for r in leases if r not in measured and hours(r, "unmeasured") > 0]
    ctx.info(
        f"the other {len(rest)} leases ({sum(hours(r, 'unmeasured') for r in rest):,.1f} GPU-hours) are unmeasured, "
        "not idle: the demo registers their hosts by tags alone and runs no agent on them, so no sync had a "
        'measurement to accrue (docs/operate.md, "The ledger: used, idle, GPU-hours and budgets")'
    )
