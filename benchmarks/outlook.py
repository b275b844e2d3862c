"""The outlook and the chargeback over a month of a busy farm (gpufarm.core.outlook, gpufarm.reporting.chargeback).

What `gpufarm report --outlook` and `--format chargeback` compute once the leases are read: 3,000 leases (as the
report reads them, `LeaseFacts` decoded from their incident fields) over five pools, 30 teams and 120 projects,
each with an accrued month, a history (requested, waiting with its reason, allocated, an end), 40 % still holding
GPUs until an end over the next 30 days, plus 300 requests refused or withdrawn and 200 still waiting. Timed: the
decode from incident fields, the unmet demand, the four weeks of free capacity, and the chargeback's rows with their
cost (the rate card's written prices) and the CSV; `--runs` times each, median and slowest, wall and CPU.

Run: .venv/bin/python benchmarks/outlook.py [--leases 3000] [--runs 10]. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.money.card import RateCard
from gpufarm.core.outlook.capacity import outlook
from gpufarm.core.outlook.demand import unmet_demand
from gpufarm.reporting.chargeback import build_chargeback
from gpufarm.reporting.query import month_period
from gpufarm.reporting.render_chargeback import render_chargeback

NOW = datetime(2026, 12, 1, 6, tzinfo=UTC)
MONTH = "2026-11"
POOLS = (
    ("onprem-hpc", "H100"),
    ("cloud-aws", "H100"),
    ("cloud-aws", "A100"),
    ("shared-slices", "A100"),
    ("shared-slices", "L4"),
)
TEAMS = 30
GOAL_S = 1.0


def farm_yaml() -> str:
    teams = "\n".join(f"  t{i:02d}:\n    cost_center: CC-{4000 + i}\n    quotas: {{}}" for i in range(TEAMS))
    return f"""operators_usergroup: S0000000001
operators_channel: C0000000001
gpu_models: {{H100: {{}}, A100: {{}}, L4: {{}}}}
environments:
  onprem-hpc: {{kind: dedicated, gpu_models: [H100]}}
  cloud-aws: {{kind: dedicated, gpu_models: [H100, A100]}}
  shared-slices: {{kind: shared, gpu_models: [A100, L4]}}
teams:
{teams}
rates:
  currency: USD
  environments:
    onprem-hpc: {{per_gpu_hour: {{H100: 2.10}}}}
    cloud-aws: {{per_gpu_hour: {{H100: 6.88}}}}
    shared-slices: {{per_gpu_hour: {{A100: 1.40, L4: 0.55}}}}
"""


def _line(at: datetime, step: str, details: str) -> str:
    return f"{isoformat(at)} gpufarm {step}: {details}"


def incident_fields(index: int, rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One incident's state and fields as the search answers them."""
    env, model = POOLS[index % len(POOLS)]
    gpus = rng.choice((1, 2, 4, 8))
    asked = NOW - timedelta(days=rng.uniform(1, 30))
    waited = timedelta(hours=rng.uniform(0, 6))
    common: dict[str, Any] = {
        f.TEAM: f"t{index % TEAMS:02d}",
        f.PROJECT: f"p{index % (TEAMS * 4):03d}",
        f.ENVIRONMENT: env,
        f.GPU_MODEL: model,
        f.GPU_COUNT: str(gpus),
    }
    history = [
        _line(asked, "requested", f"{gpus} {model}"),
        _line(asked, "waiting", "1 of 3 [queued-capacity]"),
    ]
    kind = index % 10
    if kind == 0:  # refused or withdrawn
        code = rng.choice(("refused-policy", "rejected-operator", "withdrawn-wait-limit"))
        history.append(_line(asked + waited, "rejected", f"no [{code}]"))
        return "resolved", {**common, f.PHASE: "rejected", f.REASON: code, f.HISTORY: history}
    if kind == 1 and index % 20 == 1:  # still waiting
        return "active", {**common, f.PHASE: "waiting", f.WAITING_SINCE: isoformat(asked), f.HISTORY: history}
    start = asked + waited
    end = min(NOW, start + timedelta(days=rng.uniform(0.5, 10)))
    held = gpus * (end - max(start, datetime(2026, 11, 1, tzinfo=UTC))).total_seconds() / 3600
    busy, idle = held * rng.uniform(0.3, 0.8), held * rng.uniform(0, 0.2)
    history.append(_line(start, "allocated", f"node-{index}"))
    live = rng.random() < 0.4
    fields = {
        **common,
        f.PHASE: "allocated" if live else "reclaimed",
        f.ALLOCATED_AT: isoformat(start),
        f.EXPIRES_AT: isoformat(NOW + timedelta(days=rng.uniform(0.5, 30))),
        f.HOST_GPUS: [f"node-{index}={gpus}"],
        f.HOSTS: [f"node-{index}"],
        f.GPU_HOURS_HELD: f"{held:.3f}",
        f.GPU_HOURS_BUSY: f"{busy:.3f}",
        f.GPU_HOURS_IDLE: f"{idle:.3f}",
        f.GPU_HOURS_IDLE_HELD: f"{idle / 3:.3f}",
        f.GPU_HOURS_UNMEASURED: f"{max(held - busy - idle, 0):.3f}",
        f.GPU_HOURS_UNTIL: isoformat(end),
        f.GPU_HOURS_BY_MONTH: [f"{MONTH}={held:.3f}"],
        f.HISTORY: history if live else [*history, _line(end, "released", "by the requester [ended-released]")],
    }
    return ("stable" if live else "resolved"), fields


def timed(work: Callable[[], object], runs: int) -> dict[str, float]:
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "wall_median_s": round(statistics.median(walls), 4),
        "wall_max_s": round(max(walls), 4),
        "cpu_median_s": round(statistics.median(cpus), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(25)
    raw = [incident_fields(i, rng) for i in range(args.leases)]
    farm = FarmView.of(parse_farm(farm_yaml()))
    card = RateCard(farm.rates)
    period = month_period(MONTH, NOW)

    def decode() -> list[LeaseFacts]:
        return [LeaseFacts.decode(i + 1, state, f.decode_fields(fields)) for i, (state, fields) in enumerate(raw)]

    leases = decode()
    capacity = dict.fromkeys(POOLS, 2000)
    figures = {
        "leases": len(leases),
        "decode": timed(decode, args.runs),
        "unmet_demand": timed(lambda: unmet_demand(leases, period.start, period.end, NOW), args.runs),
        "free_capacity_4_weeks": timed(lambda: outlook(leases, capacity, NOW), args.runs),
        "chargeback_rows_and_csv": timed(
            lambda: render_chargeback(build_chargeback(leases, farm, card, period, NOW)), args.runs
        ),
    }
    rows = build_chargeback(leases, farm, card, period, NOW)
    figures["chargeback_rows"] = len(rows.rows)
    figures["chargeback_total"] = f"{rows.total_cost():.2f} {rows.currency}"
    figures["goal_s_each"] = GOAL_S
    figures["goal_met"] = all(
        v["wall_median_s"] <= GOAL_S for v in figures.values() if isinstance(v, dict) and "wall_median_s" in v
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
