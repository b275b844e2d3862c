"""Reliability figures against `gpufarm local`: each figure is one function in FIGURES, printed as it finishes.

Figures (issue 8):
- races (one writer per incident, docs/design.md, rule 7): release + extend, release + idle warning, expiry +
  keep, approve + reject, each `--rounds` times (default 100) with the incident API slowed to `--latency-ms`
  (default 250): how many rounds ended in the state a sequential order gives with each person told only what
  happened (gpufarm_sandbox.races);
- quota: `--burst` (default 200) concurrent `/gpu request`s on team nlp's H100 quota in onprem-hpc, then the
  operator approving every pending one at once: granted by policy against the quota, granted in all against the
  hard limit, requesters answered, hosts held twice.
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
     [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from gpufarm_sandbox import badday, redelivery
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
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
        for problem in tally.problems[:3]:
            _line(f"    ! {problem}")
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
    for problem in burst.problems[:5]:
        _line(f"    ! {problem}")
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
    for problem in report.problems[:5]:
        _line(f"    ! {problem}")
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
    for difference in result.differences[:5]:
        _line(f"    ! {difference}")
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
}


def _fresh(env: LocalEnv, latency_ms: int) -> RaceFarm:
    return RaceFarm(LocalFarm.ready(env, drain_s=30), latency_ms=latency_ms)


def _line(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the figures; exit 1 when any round or check failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=100, help="rounds of each race (default 100)")
    parser.add_argument("--burst", type=int, default=200, help="concurrent requests in the quota burst")
    parser.add_argument("--latency-ms", type=int, default=250, help="injected incident API latency")
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
