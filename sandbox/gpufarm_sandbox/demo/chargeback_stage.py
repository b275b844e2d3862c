"""Demo stage "chargeback": the month's chargeback for finance, its totals checked against the ledger to the cent,
and the capacity outlook's four weeks for the HPC pool.

Runs after the report stage, over every lease this demo has held so far. The farm file is the example's, with an
on-prem written rate for every pool and model it has none for and a cost center for nlp (the stage's own copy,
gpufarm_sandbox.demo.farm_copy). `gpufarm report --month <this month> --format chargeback` runs as finance's
operator would run it, and a few rows and the totals line are printed. The check then reads the month's leases
once and, at one moment, builds the chargeback and the month's report by lease: the ledger is each lease's GPU-hours
held in the month as the report shows them, times its GPU-hour rate (gpufarm.core.money.lease_rate), summed per team,
project and pool and rounded to cents the same way; the chargeback's totals must equal it to the cent. Bad months
are exit 2. Last, `gpufarm report --outlook --format json` and the HPC pool's four weeks ahead.
"""

from __future__ import annotations

import csv
import io
import json
import os
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.demo.farm_copy import changed_farm
from gpufarm_sandbox.demo.report_cli import invoke_report

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

# Written prices per GPU-hour the stage gives a pool's model that the farm file does not price.
PRICES = {"H100": "2.10", "A100": "1.40", "L4": "0.55"}
COST_CENTER = "CC-4100"
POOL = ("onprem-hpc", "H100")


def _priced(farm: dict[str, Any]) -> None:
    """A written rate for every pool and model without one, and nlp's cost center."""
    rates = farm.setdefault("rates", {})
    pools = rates.setdefault("environments", {})
    for name, env in (farm.get("environments") or {}).items():
        pool = pools.setdefault(name, {})
        listed = {**pool.get("instance_types", {}), **pool.get("vm_sizes", {})}
        written = pool.setdefault("per_gpu_hour", {})
        for model in env.get("gpu_models", []):
            if model not in listed and model not in written:
                written[model] = float(PRICES.get(model, "1.00"))
    nlp = (farm.get("teams") or {}).get("nlp")
    if isinstance(nlp, dict):
        nlp.setdefault("cost_center", COST_CENTER)


def run(ctx: DemoContext) -> None:
    """The month's chargeback, its totals against the ledger, bad months refused, the HPC pool's outlook."""
    if ctx.local is None:
        ctx.check(False, "the chargeback stage needs the local function host (gpufarm demo starts it)")
        return
    with changed_farm(_priced):
        path = os.environ.get("GPUFARM_FARM_CONFIG", "")
        if not ctx.check(bool(path), "the stage has its own farm file with rates"):
            return
        month = datetime.fromtimestamp(ctx.sandbox.clock.now(), UTC).strftime("%Y-%m")
        _chargeback(ctx, month, path)
        _refused(ctx, path)
        _outlook(ctx, path)


def _chargeback(ctx: DemoContext, month: str, path: str) -> None:
    with ctx.step(f"gpufarm report --month {month} --format chargeback: the month's file for finance"):
        code, text = invoke_report(["--month", month, "--format", "chargeback", "--farm-config", path])
        rows = list(csv.DictReader(io.StringIO(text))) if code == 0 else []
        detail = f"{len(rows) - 1} rows and the totals" if rows else text.strip()[:200]
        if not ctx.check(bool(rows) and rows[-1]["team"] == "TOTAL", "the chargeback is written", detail):
            return
        *lines, total = rows
        for row in [*lines[:4], total]:
            ctx.info(
                f"{row['team']:>7} {row['project'] or '-':<14} {row['environment'] or '-':<14} "
                f"{row['cost_center'] or '-':<10} held {float(row['gpu_hours_held']):8.2f} GPU-h  "
                f"busy {float(row['gpu_hours_busy']):7.2f}  idle {float(row['gpu_hours_idle']):7.2f}  "
                f"cost {row['cost_total'] or 'unpriced':>9} {row['currency']}  priced {row['priced']}"
            )
        ctx.check(
            any(r["team"] == "nlp" and r["cost_center"] == COST_CENTER for r in lines),
            "nlp's rows carry its cost center, the others the default",
            ", ".join(sorted({r["cost_center"] for r in lines})),
        )
        _against_the_ledger(ctx, month, Path(path))


def _against_the_ledger(ctx: DemoContext, month: str, path: Path) -> None:
    """The chargeback and the month's report from one read and one moment: totals equal to the cent."""
    from gpufarm.cli.report import list_prices
    from gpufarm.core.config.farm import parse_farm
    from gpufarm.core.config.farm_view import FarmView
    from gpufarm.core.money.card import RateCard, round_cents
    from gpufarm.core.money.lease_rate import lease_rate
    from gpufarm.handlers import runtime as rt
    from gpufarm.reporting.build import build_report
    from gpufarm.reporting.chargeback import build_chargeback
    from gpufarm.reporting.query import parse_query
    from gpufarm.reporting.read import read_leases
    from gpufarm.reporting.render_chargeback import render_chargeback

    for point in entry_points(group="gpufarm.seams"):
        rt.install_seams(point.load())
    runtime = rt.current()
    farm = FarmView.of(parse_farm(path.read_text(encoding="utf-8")))
    now = runtime.clock().now()
    query = parse_query(farm, now, month=month, by="ir")
    read = read_leases(runtime.lease_reads(), query.period.months)
    # The same card as `gpufarm report`: the farm file's prices and the clouds' list prices the sync cached.
    card = RateCard(farm.rates, list_prices(runtime))
    total = list(
        csv.DictReader(io.StringIO(render_chargeback(build_chargeback(read.leases, farm, card, query.period, now))))
    )[-1]
    # The ledger: the report's held GPU-hours of each lease in the month, times its rate, per team x project x pool.
    facts = {lease.ir_label: lease for lease in read.leases}
    ledger: dict[tuple[str, str, str], Decimal] = {}
    for row in build_report(query, read, farm, now).rows:
        lease = facts.get(row.key)
        rate = lease_rate(card, lease.environment, lease.gpu_model, lease.devices) if lease else None
        if lease is None or rate is None or row.held <= 0:
            continue
        key = (lease.team or "", lease.project or "", lease.environment or "")
        ledger[key] = ledger.get(key, Decimal(0)) + rate.cost(row.held)
    figure = sum((round_cents(v) for v in ledger.values()), Decimal("0.00"))
    ctx.check(
        total["cost_total"] == f"{figure:.2f}" and figure > 0,
        "the chargeback's totals equal the month's ledger to the cent",
        f"{total['cost_total']} {total['currency']} = ledger {figure:.2f} over {len(ledger)} priced rows, "
        f"{float(total['gpu_hours_held']):,.2f} GPU-hours (both built at one moment, seconds after the file above: "
        "its live leases have held a little more since)",
    )


def _refused(ctx: DemoContext, path: str) -> None:
    with ctx.step("a bad or future month is refused with exit 2"):
        for args in (["--month", "2026-13"], ["--month", "2999-01"], ["--since", "30d"]):
            code, text = invoke_report([*args, "--format", "chargeback", "--farm-config", path])
            ctx.check(code == 2, f"gpufarm report {' '.join(args)} --format chargeback: exit 2", text.strip()[:100])


def _outlook(ctx: DemoContext, path: str) -> None:
    env, model = POOL
    with ctx.step(f"gpufarm report --outlook: unmet demand, and {env} {model}'s four weeks ahead"):
        code, text = invoke_report(["--outlook", "--format", "json", "--farm-config", path])
        document = json.loads(text) if code == 0 else {}
        pools = {(p["environment"], p["gpu_model"]): p for p in document.get("capacity", [])}
        pool = pools.get(POOL)
        said = "" if code == 0 else text.strip()[:120]
        if not ctx.check(pool is not None and len(pool["weeks"]) == 4, f"four weeks for {env} {model}", said):
            return
        assert pool is not None
        for week in pool["weeks"]:
            ctx.info(
                f"week {week['week']:02d} from {week['start'][:10]}: capacity {pool['capacity_gpus']}, "
                f"leases {week['leased_gpus']}, reserved {week['reserved_gpus']}, free {week['free_gpus']}"
            )
        for demand in document.get("unmet_demand", [])[:3]:
            ctx.info(
                f"unmet: {demand['environment']} {demand['gpu_model']}: {demand['waiting_gpu_hours']:,.1f} GPU-hours "
                f"waited, refused {demand['refused'] or '-'}, withdrawn {demand['withdrawn'] or '-'}"
            )
        ctx.check(
            all(
                pool["capacity_gpus"] - w["leased_gpus"] - w["reserved_gpus"]
                <= w["free_gpus"]
                <= pool["capacity_gpus"] - max(w["leased_gpus"], w["reserved_gpus"])
                for w in pool["weeks"]
            ),
            "each week's free GPUs are the capacity less what leases and reservations hold at its busiest moment",
        )
