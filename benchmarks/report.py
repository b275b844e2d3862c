"""`gpufarm report` over 3,000 leases and 30 days of metrics on the sandbox: wall time and peak RSS (goal <= 30 s,
<= 512 MB), as the table and as the self-contained HTML.

The sandbox runs in this process on a free loopback port; `gpufarm datadog apply` is done as gpufarm_sandbox.
scalefarm prepares it (30 teams, three pools). Leases are seeded as gpufarm leaves them, through the incident API:
of gpufarm's type, with an allocation's fields, their accrued GPU-hours (held, busy, idle, unmeasured, up to when,
held per month) and their history (requested, allocated, some idle warnings and keeps, the end), allocated at
random over the last 30 days; 40 % still hold GPUs, the rest ended (released, expired, idle, operator). 30 days of
the ledger gauges the sync publishes (gpufarm.ledger.gpus.allocated / used per team, pool and model, every 15
minutes) are sent through the metrics intake, hour by hour: the intake takes points at most an hour old, so the
sandbox's clock starts 30 days back and is moved forward as they are sent, ending at wall time. Then the real
command runs in its own process (`python -m gpufarm report --since 30d`), measured from outside: wall time, and
its own peak RSS (VmHWM at its exit) and CPU.

The farm file prices every pool (a `rates:` section of written prices, RATES), so the report prices each lease's
hours by kind (busy, idle, idle-held, unmeasured) beside them. Side by side with its floor:
benchmarks/report_floor.py, a plain reader that makes the same requests (the type lookup and both searches' pages,
same query texts) with urllib3, parses them with json.loads and sums per team with dicts, pricing each lease's
hours at its pool's rate looked up in a dict (the equivalent of the report's pricing). `--rounds` pairs of fresh
processes, floor and report alternating (which goes first alternates), both checked to make the same requests;
CPU, wall and peak RSS as median and spread, and the report's ratio to the floor per pair (goal: <= 1.3 x in CPU
and peak RSS). The farm's validated dump (gpufarm.adapters.farm_dump) is kept in the run's own cache directory: one
report before the pairs validates the farm (printed as `table_first_after_a_farm_change`), the compared ones read
the dump, as every report does until the farm changes.

Run: .venv/bin/python benchmarks/report.py [--leases 3000] [--days 30] [--rounds 5]
[--screenshot docs/screenshots/report.png] (`make screenshots` makes the report's screenshot with a smaller
farm). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufarm.config import Settings
from gpufarm.core.accounting import gpu_hours
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.model import isoformat
from gpufarm_sandbox import scalefarm
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

ROOT = Path(__file__).resolve().parents[1]
GOAL_S, GOAL_MB = 30.0, 512.0
# The report against the plain reader of the same requests (benchmarks/report_floor.py): CPU and peak RSS.
GOAL_RATIO = 1.3
POOLS = (
    ("onprem-hpc", "H100", 8),
    ("cloud-aws", "H100", 8),
    ("cloud-aws", "A100", 8),
    ("shared-slices", "A100", 1),
    ("shared-slices", "L4", 1),
)
ENDINGS = ("released", "released", "expired", "idle", "operator")
# Written prices per GPU-hour of every pool and model (the report and the floor price with the same).
RATES = {
    ("onprem-hpc", "H100"): "2.10",
    ("cloud-aws", "H100"): "6.88",
    ("cloud-aws", "A100"): "4.10",
    ("shared-slices", "A100"): "4.10",
    ("shared-slices", "L4"): "0.80",
}


def rates_yaml() -> str:
    """The farm file's `rates:` section: RATES as on-prem written prices, in USD."""
    pools: dict[str, list[str]] = {}
    for (env, model), price in RATES.items():
        pools.setdefault(env, []).append(f"{model}: {price}")
    lines = ["rates:", "  currency: USD", "  environments:"]
    lines += [f"    {env}: {{per_gpu_hour: {{{', '.join(prices)}}}}}" for env, prices in pools.items()]
    return "\n".join(lines) + "\n"


STEP_S = 900
POOL_GPUS = 2500


def lease_fields(k: int, now: datetime, rng: random.Random, days: int) -> dict[str, object]:
    """One lease's incident fields as gpufarm leaves them: live (40 %) or ended, with hours and history."""
    env, model, per_host = POOLS[rng.randrange(len(POOLS))]
    who = rng.randrange(scalefarm.TEAMS)
    team, user = scalefarm.team(who), scalefarm.user(who)
    gpus = per_host * (1 + k % 2) if per_host == 8 else 1 + k % 4
    hosts = [f"{env}-{model.lower()}-{k:05d}-{i}" for i in range(2 if per_host == 8 and k % 2 else 1)]
    allocated = now - timedelta(hours=rng.uniform(3, days * 24))
    requested = allocated - timedelta(minutes=rng.uniform(0, 240))
    live = rng.random() < 0.4
    if live:
        until = now - timedelta(minutes=rng.uniform(5, 65))
    else:
        until = min(now - timedelta(minutes=10), allocated + timedelta(hours=rng.uniform(2, 120)))
    held_hours = max(0.0, (until - allocated).total_seconds() / 3600)
    held = gpus * held_hours
    unmeasured = held * rng.choice((0.0, 0.0, 0.02, 0.1))
    busy = (held - unmeasured) * rng.uniform(0.1, 0.95)
    idle = held - unmeasured - busy
    idle_held = idle * rng.choice((0.0, 0.2, 0.5))
    months = [f"{m}={gpus * span:.3f}" for m, span in gpu_hours.month_spans(allocated, until)]
    history = [
        f"{isoformat(requested)} {user} requested: {gpus}x{model} in {env}",
        f"{isoformat(allocated)} gpufarm allocated: hosts: {', '.join(hosts)}",
    ]
    if rng.random() < 0.15:
        warned = allocated + (until - allocated) / 2
        history += [f"{isoformat(warned)} monitor warned: kind idle", f"{isoformat(warned)} {user} kept: 1 of 2"]
    reason = rng.choice(ENDINGS)
    values: dict[str, object] = {
        f.STATE: "stable" if live else "resolved",
        f.PHASE: "allocated" if live else "reclaimed",
        f.TEAM: team,
        f.PROJECT: f"proj-{k % 200:03d}",
        f.GPU_MODEL: model,
        f.GPU_COUNT: str(gpus),
        f.ENVIRONMENT: env,
        f.REQUESTER: user,
        f.DURATION_DAYS: "14",
        f.EXPIRES_AT: isoformat(allocated + timedelta(days=14)),
        f.REQUEST_ID: f"report-bench-{k:06d}",
        f.HOSTS: hosts if live else [],
        f.HOST_GPUS: [f"{h}={gpus // len(hosts)}" for h in hosts],
        f.ALLOCATED_AT: isoformat(allocated),
        f.GPU_HOURS_HELD: f"{held:.3f}",
        f.GPU_HOURS_BUSY: f"{busy:.3f}",
        f.GPU_HOURS_IDLE: f"{idle:.3f}",
        f.GPU_HOURS_IDLE_HELD: f"{idle_held:.3f}",
        f.GPU_HOURS_UNMEASURED: f"{unmeasured:.3f}",
        f.GPU_HOURS_UNTIL: isoformat(until),
        f.GPU_HOURS_BY_MONTH: months,
        f.GPU_HOURS_MONTHS: sorted({m.split("=", 1)[0] for m in months}),
    }
    if not live:
        step = "released" if reason == "released" else "reclaimed"
        history.append(f"{isoformat(until)} {'gpufarm' if reason != 'released' else user} {step}: reason: {reason}")
        values[f.RECLAIM_REASON] = reason
    values[f.HISTORY] = history
    return values


def seed_leases(api: scalefarm.Api, n: int, days: int, now: datetime) -> None:
    """n incidents of gpufarm's type through the incident API."""
    from concurrent.futures import ThreadPoolExecutor

    types = api.ok("GET", "/api/v2/incidents/config/types")["data"]
    type_id = next(t["id"] for t in types if t["attributes"]["name"] == Settings().incident_type)
    rng = random.Random(13)
    bodies = []
    for k in range(n):
        values = lease_fields(k, now, rng, days)
        title = f"GPU request: {values[f.TEAM]}/{values[f.PROJECT]}"
        attributes = {
            "title": title,
            "customer_impacted": False,
            "fields": f.encode_fields(values),
            "incident_type_uuid": type_id,
        }
        bodies.append({"data": {"type": "incidents", "attributes": attributes}})
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda body: api.ok("POST", "/api/v2/incidents", body), bodies))


def seed_metrics(sandbox: Sandbox, api: scalefarm.Api, days: int) -> int:
    """`days` of ledger gauges per team, pool and model (and each pool's GPUs) every STEP_S, sent an hour at a time;
    points sent."""
    rng = random.Random(7)
    # The intake takes points at most an hour old: start the sandbox's clock `days` back (a benchmark's seeding of
    # the past; nothing else moves it backwards) and move it forward as each hour is sent.
    sandbox.clock._offset -= days * 86400
    sent = 0
    levels = {(t, p): rng.uniform(4, 40) for t in range(scalefarm.TEAMS) for p in range(len(POOLS))}
    for _ in range(days * 24):
        start = int(sandbox.clock.now()) - 3600 + STEP_S
        series = []
        for (t, p), level in levels.items():
            env, model, _ = POOLS[p]
            tags = [f"team:{scalefarm.team(t)}", "project:all", f"environment:{env}", f"gpu_model:{model.lower()}"]
            held = [
                {"timestamp": s, "value": round(level * rng.uniform(0.8, 1.2))}
                for s in range(start, start + 3600, STEP_S)
            ]
            used = [{"timestamp": p_["timestamp"], "value": p_["value"] * rng.uniform(0.2, 0.9)} for p_ in held]
            series += [
                {"metric": "gpufarm.ledger.gpus.allocated", "type": 3, "points": held, "tags": tags},
                {"metric": "gpufarm.ledger.gpus.used", "type": 3, "points": used, "tags": tags},
            ]
            sent += len(held) + len(used)
        # The inventory gauge the report's unallocated capacity reads: each pool's GPUs, steady.
        for env, model, _ in POOLS:
            total = [{"timestamp": s, "value": POOL_GPUS} for s in range(start, start + 3600, STEP_S)]
            tags = [f"environment:{env}", f"gpu_model:{model.lower()}"]
            series.append({"metric": "gpufarm.inventory.gpus.total", "type": 3, "points": total, "tags": tags})
            sent += len(total)
        status, answer = api.call("POST", "/api/v2/series", {"series": series})
        if status != 202 or (answer or {}).get("errors"):
            raise RuntimeError(f"metrics intake: {status} {str(answer)[:300]}")
        sandbox.clock.advance(3600)
    return sent


# Runs `gpufarm report ARGS` (or the floor's script) and, at exit, writes the process's own peak RSS (VmHWM: reset by
# exec, unlike rusage's ru_maxrss, which keeps the peak of the forked copy of this harness and its seeded sandbox).
LAUNCH = """
import atexit, os, runpy, sys
def peak():
    with open("/proc/self/status") as status, open(os.environ["REPORT_BENCH_PEAK_FILE"], "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(peak)
if sys.argv[1] == "report":
    sys.argv = ["gpufarm", *sys.argv[1:]]
    runpy.run_module("gpufarm", run_name="__main__")
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
FLOOR = Path(__file__).resolve().with_name("report_floor.py")


def run_child(env: dict[str, str], args: list[str]) -> dict[str, Any]:
    """`gpufarm report ARGS` (args[0] == "report") or the floor (args[0] its script) in a child process: exit
    status, wall time, CPU (rusage), its own peak RSS."""
    peak_file = Path(tempfile.mkstemp(prefix="gpufarm-report-peak-")[1])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        env={**env, "REPORT_BENCH_PEAK_FILE": str(peak_file)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = child.communicate()
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(args)[:200]}: exit {child.returncode}: {err.decode()[-500:]}")
    peak_kb = int(peak_file.read_text() or 0)
    peak_file.unlink()
    return {
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime, 3),
        "stdout": out.decode(),
    }


def run_report(env: dict[str, str], args: list[str]) -> dict[str, Any]:
    """`gpufarm report ARGS` in a child process (see run_child)."""
    return run_child(env, ["report", *args])


def floor_queries(farm_file: Path, days: int) -> list[str]:
    """The search texts `gpufarm report --since DAYSd` sends (the live leases; the ended ones of the months it
    reads, by their accrued months and by the month of their end's reason), each filtered on the type as the adapter
    does (`{type}` where the type's id goes)."""
    from gpufarm.core.config.farm import parse_farm
    from gpufarm.core.config.farm_view import FarmView
    from gpufarm.core.context.reads import live_query
    from gpufarm.reporting import reasons
    from gpufarm.reporting.build import months_to_read
    from gpufarm.reporting.query import parse_query
    from gpufarm.reporting.read import ended_query

    farm = FarmView.of(parse_farm(farm_file.read_text()))
    query = parse_query(farm, datetime.now(UTC), since=f"{days}d")
    months = months_to_read(query, farm)
    texts = [live_query().text(), ended_query(months).text(), reasons.ended_query(months).text()]
    return [f"incident_type:{{type}} AND ({text})" for text in texts]


def spread(values: list[float]) -> dict[str, float]:
    """Median, least and most of a series."""
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def side_by_side(
    env: dict[str, str], api: scalefarm.Api, report_args: list[str], floor_args: list[str], rounds: int
) -> dict[str, Any]:
    """`rounds` pairs of fresh processes, the floor and the report alternating (which goes first alternates too):
    each one's CPU, wall and peak RSS as median and spread, the report's ratio to the floor per pair likewise, and
    the requests each made (the same, or the comparison is void)."""
    runs: dict[str, list[dict[str, Any]]] = {"report": [], "floor": []}
    requests: dict[str, int] = {}
    for k in range(rounds):
        order = [("floor", floor_args), ("report", report_args)]
        for name, args in order if k % 2 == 0 else order[::-1]:
            before = sum(api.counts().values())
            runs[name].append(run_child(env, args))
            requests[name] = sum(api.counts().values()) - before - 1  # less the counter's own request
    if requests["floor"] != requests["report"]:
        raise RuntimeError(f"the floor made {requests['floor']} requests, the report {requests['report']}")
    out: dict[str, Any] = {"rounds": rounds, "requests": requests["report"]}
    for name, measured in runs.items():
        out[name] = {m: spread([r[m] for r in measured]) for m in ("cpu_s", "wall_s", "peak_rss_mb")}
    out["ratio"] = {
        m: spread([r[m] / fl[m] for r, fl in zip(runs["report"], runs["floor"], strict=True)])
        for m in ("cpu_s", "wall_s", "peak_rss_mb")
    }
    out["floor_leases"] = json.loads(runs["floor"][-1]["stdout"])["leases"]
    return out


def screenshot(html: Path, target: Path) -> dict[str, Any]:
    """The HTML in headless Chromium: drawn without a console error, saved as a full-page PNG."""
    from gpufarm_sandbox.browser import chromium

    with chromium() as browser:
        page = browser.load(html.resolve().as_uri(), timeout_s=60)
    if page.console_errors or not page.summary.get("rendered"):
        raise SystemExit(f"the report did not render cleanly: {page.console_errors} {page.summary}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(page.screenshot)
    return {"screenshot": str(target), "render_ms": page.summary.get("renderMs"), "svg": page.summary.get("svgCharts")}


def main() -> None:
    """Seed, run the table and the HTML, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=3000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5, help="pairs of floor and report runs, alternating")
    parser.add_argument("--screenshot", type=Path, default=None, help="also save the HTML's screenshot here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpufarm-report-bench-"))
    farm_file = work / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml() + rates_yaml())
    sandbox = Sandbox()
    with ServerThread(sandbox) as server:
        sandbox.base_url = server.url
        env = scalefarm.environment(server.url, farm_file)
        os.environ.update(env)
        api = scalefarm.Api(server.url)
        started = time.perf_counter()
        scalefarm.prepare(api)
        points = seed_metrics(sandbox, api, args.days)
        metrics_s = time.perf_counter() - started
        seed_leases(api, args.leases, args.days, datetime.now(UTC))
        seeded_s = time.perf_counter() - started
        child_env = {**{k: v for k, v in os.environ.items() if not k.startswith(("GPUFARM_", "DD_", "SLACK_"))}, **env}
        # The farm's validated dump (gpufarm.adapters.farm_dump) in this run's own cache: the first report after a
        # change of the farm validates it (measured on its own), the ones compared with the floor read the dump.
        child_env["XDG_CACHE_HOME"] = str(work / "cache")
        first = run_report(child_env, ["--since", f"{args.days}d"])
        child_env["REPORT_FLOOR_RATES"] = json.dumps({f"{e}/{m}": float(p) for (e, m), p in RATES.items()})
        floor_args = [str(FLOOR), server.url, Settings().incident_type, *floor_queries(farm_file, args.days)]
        compared = side_by_side(child_env, api, ["report", "--since", f"{args.days}d"], floor_args, args.rounds)
        # Each count is one request of its own: the requests between two counts are one fewer than they differ.
        before = sum(api.counts().values())
        table = run_report(child_env, ["--since", f"{args.days}d"])
        between = sum(api.counts().values())
        html_path = work / "report.html"
        html = run_report(child_env, ["--since", f"{args.days}d", "--format", "html", "--out", str(html_path)])
        after = sum(api.counts().values())
        # The HTML's two timeseries queries, timed on their own: the sandbox's query engine answers them over every
        # point seeded (in this process), where Datadog answers in about a second.
        queried = time.perf_counter()
        end_ms = int(sandbox.clock.now() * 1000)
        for metric in ("gpufarm.ledger.gpus.allocated", "gpufarm.ledger.gpus.used"):
            attributes = {
                "from": end_ms - args.days * 86_400_000,
                "to": end_ms,
                "interval": max(60_000, args.days * 86_400_000 // 300 // 60_000 * 60_000),
                "queries": [{"data_source": "metrics", "name": "a", "query": f"sum:{metric}{{*}} by {{team}}"}],
            }
            api.ok(
                "POST", "/api/v2/query/timeseries", {"data": {"type": "timeseries_request", "attributes": attributes}}
            )
        sandbox_query_s = time.perf_counter() - queried
        result: dict[str, Any] = {
            "leases": args.leases,
            "days": args.days,
            "metric_points": points,
            "seed_s": {"metrics": round(metrics_s, 1), "total": round(seeded_s, 1)},
            "goal": {"wall_s": GOAL_S, "peak_rss_mb": GOAL_MB},
            "table": {k: v for k, v in table.items() if k != "stdout"} | {"requests": between - before - 1},
            "table_first_after_a_farm_change": {k: v for k, v in first.items() if k != "stdout"},
            "html": {k: v for k, v in html.items() if k != "stdout"}
            | {
                "requests": after - between - 1,
                "bytes": html_path.stat().st_size,
                "sandbox_query_s": round(sandbox_query_s, 2),
            },
            "table_head": table["stdout"].splitlines()[:8],
            "against_the_floor": compared,
        }
        if args.screenshot is not None:
            result["browser"] = screenshot(html_path, args.screenshot)
        ok = all(r["wall_s"] <= GOAL_S and r["peak_rss_mb"] <= GOAL_MB for r in (table, html))
        result["within_goal"] = ok
        result["goal"]["ratio_to_floor"] = GOAL_RATIO
        result["within_floor_goal"] = all(
            compared["ratio"][m]["median"] <= GOAL_RATIO for m in ("cpu_s", "peak_rss_mb")
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
