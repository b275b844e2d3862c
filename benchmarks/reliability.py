"""Reliability figures against `gpufarm local`: each figure is one function in FIGURES, printed as it finishes.

Figures (issue 8):
- races (one writer per incident, docs/design.md, rule 7): release + extend, release + idle warning, expiry +
  keep, approve + reject, each `--rounds` times (default 100) with the incident API slowed to `--latency-ms`
  (default 250): how many rounds ended in the state a sequential order gives with each person told only what
  happened (gpufarm_sandbox.races);
- quota: `--burst` (default 200) concurrent `/gpu request`s on team nlp's H100 quota in onprem-hpc, then the
  operator approving every pending one at once: granted by policy against the quota, granted in all against the
  hard limit, requesters answered, hosts held twice;
- throughput (point 6): `--commands` (default 1,000) signed slash commands from `--threads` (12) client threads,
  mostly `/gpu list` and `/gpu status IR-n`, every tenth a `/gpu request`: sent, acked, errors, ack p50/p95/p99,
  wall, the worker's p50/p99 per kind (gpufarm_sandbox.load), then the worker's median time per
  `status IR-n` and `list`, one at a time, at 10 and at `--live` (500) live incidents.
- faults (point 5): `--requests` (default 200) requests in waves of eight kinds (policy, operators' approval and
  rejection, release, extend, idle warning / recovery / reclaim, expiry, refusal) with `--fault-rate` (20 %) of
  the Datadog and Slack API calls answered 429/500/503, then faults off, drained, one sync: lost, doubled, hosts in
  two incidents, orphan tags, requesters told (gpufarm_sandbox.badday);
- redelivery (point 5): the same `--requests` played in order, then on a fresh sandbox with every incident webhook
  and idle alert delivered 2-3 times in shuffled order: webhooks x deliveries and whether the final states are
  identical (gpufarm_sandbox.redelivery).

A new figure is a function `(RaceFarm, argparse.Namespace) -> dict[str, object]` added to FIGURES (its name is
what `--only` selects); it gets a fresh sandbox (workspace, hosts, `gpufarm datadog apply`), prints its lines
and returns its figures with "ok" (False fails the run). The CI-sized versions of these checks are
tests/integration/test_races.py.

Run: .venv/bin/python benchmarks/reliability.py [--rounds 100] [--burst 200] [--latency-ms 250] [--only races]
     [--commands 1000] [--threads 12] [--live 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from gpufarm.core.kernel.search import LIVE_QUERY
from gpufarm_sandbox import badday, load, redelivery
from gpufarm_sandbox.demo.lifecycle_stage import ALICE, BOB, CAROL, LocalFarm
from gpufarm_sandbox.localhost import LocalEnv, start_local
from gpufarm_sandbox.races import SCENARIOS, RaceFarm, quota_burst, run_scenario


def races(race: RaceFarm, args: argparse.Namespace) -> dict[str, object]:
    """Each pair of writers on one incident, `--rounds` times."""
    out: dict[str, object] = {}
    ok = True
    for name in SCENARIOS:
        tally = run_scenario(race, name, args.rounds)
        out[name] = {
            "rounds": tally.rounds,
            "sequential": tally.rounds - tally.failed,
            "failed": tally.failed,
            "seconds": round(tally.seconds, 1),
            "first problems": tally.problems[:3],
        }
        ok = ok and tally.failed == 0
        _line(f"  {name:24} {tally.rounds - tally.failed:4d} / {tally.rounds} sequential  ({tally.seconds:6.1f} s)")
        _problems(tally.problems, 3)
    return {**out, "ok": ok}


def quota(race: RaceFarm, args: argparse.Namespace) -> dict[str, object]:
    """A burst of concurrent requests on one team's quota, then every pending one approved at once."""
    burst = quota_burst(race, args.burst)
    _line(
        f"  {burst.sent} concurrent requests: {burst.incidents} incidents; granted by policy "
        f"{burst.granted_by_policy} <= quota {burst.quota}; after approving all pending "
        f"{burst.granted_after_approvals} <= hard limit {burst.hard_limit}"
    )
    _line(
        f"  answered {burst.answered} / {burst.sent} (to operators {burst.to_operators}, refused {burst.refused}); "
        f"hosts held twice: {len(burst.double_held_hosts)}; {burst.seconds:.1f} s"
    )
    _problems(burst.problems)
    return {
        "sent": burst.sent,
        "incidents": burst.incidents,
        "granted_by_policy": burst.granted_by_policy,
        "quota": burst.quota,
        "granted_after_approvals": burst.granted_after_approvals,
        "hard_limit": burst.hard_limit,
        "answered": burst.answered,
        "to_operators": burst.to_operators,
        "refused": burst.refused,
        "double_held_hosts": burst.double_held_hosts,
        "seconds": round(burst.seconds, 1),
        "problems": burst.problems,
        "ok": not burst.problems,
    }


THROUGHPUT_TARGETS = {"commands": 1000, "wall_s": 60.0, "ack_p99_ms": 1000.0}


def throughput(race: RaceFarm, args: argparse.Namespace) -> dict[str, object]:
    """`--commands` signed slash commands from `--threads` client threads (mostly list / status, some request),
    then the worker's time per `status IR-n` and `list` at 10 and `--live` live incidents."""
    farm = race.farm
    irs = load.seed_live(farm, 10, requester=ALICE, prefix="tp")
    farm.settle(timeout=60)
    few = _live_cost(farm, irs, args)
    # Alice holds the ten incidents the costs are measured on (her `list` always shows those ten); Bob and Carol
    # send the load and hold the rest.
    report = load.run_load(farm, load.mixed_commands(args.commands, (BOB, CAROL), irs), threads=args.threads)
    figures = report.summary()
    _line(
        f"  sent {report.sent} from {report.threads} threads: acked {report.acked}, errors {len(report.errors)} "
        f"(target {THROUGHPUT_TARGETS['commands']} acked in {THROUGHPUT_TARGETS['wall_s']:.0f} s, 0 errors)"
    )
    _line(
        f"  ack p50 {report.ack(50):.0f} ms, p95 {report.ack(95):.0f} ms, p99 {report.ack(99):.0f} ms "
        f"(target p99 < {THROUGHPUT_TARGETS['ack_p99_ms']:.0f} ms); wall {report.wall_s:.1f} s; "
        f"client round trip p99 {figures['round_trip_p99_ms']:.0f} ms"
    )
    for kind, ms in sorted(report.worker_ms.items()):
        _line(
            f"  worker {kind:8} n={len(ms):4d}  p50 {report.worker(kind, 50):6.0f} ms  "
            f"p99 {report.worker(kind, 99):6.0f} ms"
        )
    _line(
        f"  worker failures {len(report.worker_failures)}, dead letters {report.dead_letters}, settled {report.settled}"
    )
    _problems(figures["first_errors"] + figures["first_worker_failures"], None)
    load.seed_live(farm, max(0, args.live - _live_count(farm)), requester=CAROL, prefix="tp-many")
    farm.settle(timeout=120)
    many = _live_cost(farm, irs, args)
    for kind in ("status", "list"):
        _line(
            f"  worker ms per {kind:6} at {few.live:4d} live: {few.median(kind):6.1f}   at {many.live:4d} live: "
            f"{many.median(kind):6.1f}   (target: flat)"
        )
    flat = all(many.median(k) <= 2 * few.median(k) + 10 for k in ("status", "list"))
    ok = (
        not report.errors
        and report.acked == report.sent
        and report.ack(99) < THROUGHPUT_TARGETS["ack_p99_ms"]
        and (report.sent < THROUGHPUT_TARGETS["commands"] or report.wall_s <= THROUGHPUT_TARGETS["wall_s"])
        and not report.worker_failures
        and report.settled
        and flat
    )
    return {
        **figures,
        "worker_ms_by_live": {
            str(cost.live): {k: round(cost.median(k), 1) for k in ("status", "list")} for cost in (few, many)
        },
        "targets": THROUGHPUT_TARGETS,
        "ok": ok,
    }


def _live_count(farm: LocalFarm) -> int:
    return sum(1 for _ in farm.gateway.search(LIVE_QUERY))


def _live_cost(farm: LocalFarm, irs: list[int], args: argparse.Namespace) -> load.CostReport:
    """The worker's time per status / list, one command at a time, at the current number of live incidents."""
    return load.worker_cost(farm, load.cost_commands(ALICE, irs, args.cost_repeats), live=_live_count(farm))


def faults(race: RaceFarm, args: argparse.Namespace) -> dict[str, object]:
    """The fault day: `--requests` requests with `--fault-rate` of the Datadog and Slack calls failing."""
    logging.disable(logging.ERROR)  # each injected fault logs an error line; the figures are what counts here
    try:
        report = badday.BadDay(race.farm, rate=args.fault_rate).run(args.requests)
    finally:
        logging.disable(logging.WARNING)
    _line(
        f"  {report.requests} requests at {args.fault_rate:.0%} faults ({report.faults_injected} injected): "
        f"lost {report.lost}, doubled {report.doubled}, hosts in two incidents {report.hosts_in_two}, "
        f"orphan tags after one sync {report.orphan_tags}, told {report.told} / {report.requests}; "
        f"dead letters {report.dead_letters}; {report.seconds:.0f} s"
    )
    _problems(report.problems)
    return badday.figures(report)


def redelivered(race: RaceFarm, args: argparse.Namespace) -> dict[str, object]:
    """`--requests` requests in order, then with every webhook and idle alert delivered 2-3 times, shuffled."""
    result = redelivery.run(race.farm, args.fresh_farm, args.requests)
    deliveries = result.webhooks + result.webhook_copies
    alerts = result.alerts + result.alert_copies
    _line(
        f"  {result.requests} requests: {result.webhooks} webhooks x {deliveries / max(1, result.webhooks):.1f}"
        f" deliveries ({deliveries}), {result.alerts} idle alerts x {alerts / max(1, result.alerts):.1f} ({alerts});"
        f" final state identical to in-order: {result.identical}; {result.seconds:.0f} s"
    )
    _problems(result.differences)
    return {
        "requests": result.requests,
        "webhooks": result.webhooks,
        "webhook_deliveries": deliveries,
        "alerts": result.alerts,
        "alert_deliveries": alerts,
        "identical": result.identical,
        "differences": result.differences,
        "seconds": round(result.seconds, 1),
        "ok": result.identical,
    }


FIGURES: dict[str, Callable[[RaceFarm, argparse.Namespace], dict[str, object]]] = {
    "races": races,
    "quota": quota,
    "faults": faults,
    "redelivery": redelivered,
    "throughput": throughput,
}


def _fresh(env: LocalEnv, latency_ms: int) -> RaceFarm:
    return RaceFarm(LocalFarm.ready(env, drain_s=30), latency_ms=latency_ms)


def _line(text: str) -> None:
    print(text, flush=True)


def _problems(problems: list[Any], most: int | None = 5) -> None:
    """The first `most` problems of a figure (all of them with None), one indented line each."""
    for problem in problems[:most]:
        _line(f"    ! {problem}")


def main(argv: list[str] | None = None) -> int:
    """Run the figures; exit 1 when any round or check failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=100, help="rounds of each race (default 100)")
    parser.add_argument("--burst", type=int, default=200, help="concurrent requests in the quota burst")
    parser.add_argument("--latency-ms", type=int, default=250, help="injected incident API latency")
    parser.add_argument("--commands", type=int, default=1000, help="slash commands in the throughput figure")
    parser.add_argument("--threads", type=int, default=12, help="client threads sending them")
    parser.add_argument("--live", type=int, default=500, help="live incidents for the worker's cost per command")
    parser.add_argument("--cost-repeats", type=int, default=20, help="status and list commands timed per count")
    parser.add_argument("--requests", type=int, default=200, help="requests of the fault day and the redelivery")
    parser.add_argument("--fault-rate", type=float, default=badday.FAULT_RATE, help="share of API calls failing")
    parser.add_argument("--only", choices=sorted(FIGURES), action="append", help="run only these figures")
    parser.add_argument("--json", action="store_true", help="also print every figure as one JSON object")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the figures, not the host's logs
    results: dict[str, Any] = {}
    failed = False
    with start_local(port=0) as env:
        # The redelivery figure compares two runs, each on a fresh sandbox.
        args.fresh_farm = lambda: LocalFarm.ready(env, drain_s=30)
        for name in args.only or list(FIGURES):
            _line(f"{name}:")
            race = _fresh(env, args.latency_ms)
            start = time.monotonic()
            try:
                results[name] = FIGURES[name](race, args)
            finally:
                race.farm.close()
            _line(f"  ({time.monotonic() - start:.0f} s)")
            failed = failed or not results[name].get("ok", False)
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
