"""Every path at the scale of a real farm: 2,000 hosts / 300 live leases and 20,000 / 3,000, on the sandbox.

The sandbox runs in its own process on loopback (`gpufarm sandbox`); gpufarm_sandbox.scalefarm seeds it through
its public API (hosts through `/_sandbox/hosts`, leases as gpufarm makes them) and runs each path as the functions
would, one invocation at a time, with the runtime's real clients, measuring wall time, CPU, peak RSS and the
sandbox's request counter per invocation. Paths: request → IR (the worker and the queued create-and-decide),
approval → hosts tagged (the queue consumer's allocation), release → untagged (worker, queued release, the
consumer's reclaim), one sync with no change and one after 1 % of the hosts drifted (the scheduled function, then
each pool's or shard's repair). Prints every figure beside its target and how it grows from the small farm to
the large one.

Run: .venv/bin/python benchmarks/scale.py [--sizes small,large]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from gpufarm_sandbox import scalefarm
from gpufarm_sandbox.localhost.template import load_template
from gpufarm_sandbox.process import free_port, start_sandbox
from gpufarm_sandbox.scalefarm import TIMEOUT_S, FarmPath

ROOT = Path(__file__).resolve().parent.parent
# The function each kind of invocation runs in; its Timeout and MemorySize come from template.yaml.
FUNCTIONS = {"worker": "SlackWorkerFunction", "consumer": "IncidentWebhookFunction", "sync": "QuotaSyncFunction"}

SIZES = {"tiny": (200, 30), "small": (2_000, 300), "large": (20_000, 3_000)}
MEMORY_MB = 512  # the ceiling for every invocation, whatever the function is given
# (label, target in seconds) per path.
TARGETS = {
    "request": ("request → IR", 2.0),
    "approval": ("approval → hosts tagged", 5.0),
    "release": ("release → untagged", 5.0),
    "sync": ("sync, no change", 60.0),
    "drift": ("sync, 1 % drift", 60.0),
}
# Before this work, at 20,000 / 3,000 (issue 9): request 145 s, approval 121 s, sync 400-650 s.
BEFORE = {"request": "145 s", "approval": "121 s", "sync": "400-650 s"}


def show(size: str, hosts: int, leases: int, seeded_s: float, paths: dict[str, FarmPath]) -> None:
    print(f"\n== {size}: {hosts:,} hosts / {leases:,} live leases (seeded in {seeded_s:.1f} s)")
    for key, path in paths.items():
        label, target = TARGETS[key]
        ok = "ok" if path.wall_s <= target else "MISSED"
        note = f" [{path.note}]" if path.note else ""
        print(
            f"  {label}{note}: {path.wall_s:.2f} s (target ≤ {target:g} s, {ok}); {len(path.calls)} invocation(s), "
            f"reads {path.total('reads')}, writes {path.total('writes')}, Slack {path.total('slack')}, "
            f"metric posts {path.total('metrics')}"
        )
        for call in path.calls:
            print(
                f"    {call.name:<30} {call.wall_s:7.2f} s wall {call.cpu_s:6.2f} s CPU {call.rss_mb:5.0f} MB peak RSS"
                f"  {call.timeout_share:5.1%} of {TIMEOUT_S[call.function]} s"
                f"  reads {call.reads:4d}  writes {call.writes:4d}"
            )


def growth(results: dict[str, dict[str, FarmPath]]) -> None:
    if not {"small", "large"} <= results.keys():
        return
    small, large = results["small"], results["large"]
    print("\n== growth small → large (target: cost at large ≤ 10 x cost at small)")
    for key, (label, _) in TARGETS.items():
        a, b = small[key], large[key]
        factor = b.wall_s / a.wall_s if a.wall_s else float("nan")
        cpu = sum(c.cpu_s for c in b.calls) / max(1e-9, sum(c.cpu_s for c in a.calls))
        before = f"; before: {BEFORE[key]}" if key in BEFORE else ""
        print(
            f"  {label}: {a.wall_s:.2f} s → {b.wall_s:.2f} s = {factor:.1f} x wall, {cpu:.1f} x CPU "
            f"(reads {a.total('reads')} → {b.total('reads')}){before}"
        )
    calls = [c for path in large.values() for c in path.calls]
    worst = max(calls, key=lambda c: c.timeout_share)
    rss = max(c.rss_mb for c in calls)
    print(
        f"\n== every invocation at the large farm: at most {worst.timeout_share:.1%} of its timeout "
        f"({worst.name}, {worst.wall_s:.2f} s of {TIMEOUT_S[worst.function]} s; target ≤ 50 %), "
        f"peak RSS at most {rss:.0f} MB (target ≤ {MEMORY_MB} MB)"
    )
    print(f"  sync without changes: {large['sync'].total('writes')} writes (target 0)")
    print(f"  sync after 1 % drift: {large['drift'].total('writes')} writes, {large['drift'].note} (target equal)")


def template_limits() -> dict[str, int]:
    """Each function's MemorySize from template.yaml; its Timeout goes into TIMEOUT_S (shares are of it)."""
    functions = load_template(ROOT / "template.yaml").functions
    memory = {}
    for kind, logical_id in FUNCTIONS.items():
        TIMEOUT_S[kind] = functions[logical_id].timeout
        memory[kind] = functions[logical_id].memory
    return memory


def main() -> None:
    memory = template_limits()
    print("template.yaml: " + ", ".join(f"{FUNCTIONS[k]} {TIMEOUT_S[k]} s / {memory[k]} MB" for k in FUNCTIONS))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,large", help="comma-separated: tiny, small, large")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    farm_file = Path(tempfile.mkdtemp(prefix="gpufarm-scale-")) / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml())
    os.environ.update(scalefarm.environment(url, farm_file))
    proc, _ = start_sandbox(port)
    api = scalefarm.Api(url)
    results: dict[str, dict[str, FarmPath]] = {}
    try:
        for size in args.sizes.split(","):
            hosts, leases = SIZES[size]
            started = time.perf_counter()
            scalefarm.prepare(api)
            plan = scalefarm.layout(hosts, leases)
            scalefarm.seed(api, plan)
            seeded = time.perf_counter() - started
            results[size] = scalefarm.measure(api, plan)
            del plan
            show(size, hosts, leases, seeded, results[size])
        growth(results)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
