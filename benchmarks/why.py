"""`/gpu why IR-n` at 3,000 live leases: what one answer costs the Slack worker (gpufarm.core.leases.why).

A sandbox in its own process is seeded as benchmarks/scale.py seeds it (gpufarm_sandbox.scalefarm: `--hosts` hosts,
`--leases` live leases over three pools and 30 teams), the farm file scalefarm's with the HPC pool ordering its
queue by fair share (`scheduling.environments.onprem-hpc.queue: fair-share`, so the answer also reads the pool's
ended leases for each team's usage), plus as many ended leases as live ones (benchmarks/sweep.py's) and
`--waiting` requests waiting in the HPC pool, one per team in turn. The worker answers `/gpu why IR-n` for the
newest of them `--runs` times (the first in a fresh container, the rest warm), measured as scalefarm measures
every invocation: wall, CPU, peak RSS and the sandbox's requests; the same for a FIFO pool (the farm file without
the fair-share line) and for an allocated lease (no queue to explain).

Run: .venv/bin/python benchmarks/why.py [--hosts 20000] [--leases 3000] [--runs 5] [--waiting 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sweep import seed_ended

from gpufarm.core.chat.command_text import parse_command
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import GpuRequest, isoformat
from gpufarm_sandbox import scalefarm
from gpufarm_sandbox.process import free_port, start_sandbox
from gpufarm_sandbox.scalefarm import FarmPath

FAIR_SHARE = "scheduling:\n  environments:\n    onprem-hpc: {queue: fair-share}\n"


def seed_waiting(api: scalefarm.Api, count: int) -> list[tuple[int, str]]:
    """`count` approved requests of 16 H100 waiting in the HPC pool, one per team in turn, as gpufarm leaves them
    (phase waiting, approved by policy, waiting since now): their IRs and requesters, oldest first."""
    from gpufarm.config import Settings

    types = api.ok("GET", "/api/v2/incidents/config/types")["data"]
    type_id = next(t["id"] for t in types if t["attributes"]["name"] == Settings().incident_type)
    now = datetime.now(UTC)
    out = []
    for k in range(count):
        req = GpuRequest(
            team=scalefarm.team(k % scalefarm.TEAMS),
            project="why-bench",
            gpu_model="H100",
            gpu_count=16,
            environment="onprem-hpc",
            duration_days=7,
            requester=scalefarm.user(k % scalefarm.TEAMS),
            request_id=f"why-bench-{k:04d}",
        )
        values = req.to_fields(Phase.WAITING, now) | {f.APPROVED_BY: "policy", f.WAITING_SINCE: isoformat(now)}
        attributes = {
            "title": req.title(),
            "customer_impacted": False,
            "fields": f.encode_fields(values),
            "incident_type_uuid": type_id,
        }
        answer = api.ok("POST", "/api/v2/incidents", {"data": {"type": "incidents", "attributes": attributes}})
        out.append((int(answer["data"]["attributes"]["public_id"]), req.requester))
    return out


def why_runs(runner: scalefarm.Runner, ir: int, user: str, runs: int, label: str) -> FarmPath:
    """`/gpu why IR-n` `runs` times through the worker, the first in a fresh container."""
    path = FarmPath(label)
    command = parse_command(f"why IR-{ir}").to_payload()
    runner.fresh()
    for k in range(runs):
        name = "fresh container" if k == 0 else "warm container"
        runner.worker(path, name, {"kind": "command", "user": user, "command": command})
    return path


def show(path: FarmPath) -> None:
    """One line per case: the fresh call, the warm calls' median and max, their reads."""
    fresh, warm = path.calls[0], path.calls[1:] or path.calls
    walls = [c.wall_s for c in warm]
    print(
        f"{path.name:<34} fresh {fresh.wall_s * 1000:7.0f} ms ({fresh.reads} reads) · warm median "
        f"{statistics.median(walls) * 1000:6.0f} ms, max {max(walls) * 1000:6.0f} ms, CPU median "
        f"{statistics.median(c.cpu_s for c in warm) * 1000:6.0f} ms, {warm[-1].reads} reads, "
        f"{warm[-1].writes} writes, peak RSS {max(c.rss_mb for c in path.calls):.0f} MB"
    )
    print(f"{'':<34} requests of a warm answer: {dict(sorted(warm[-1].by_endpoint.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20_000)
    parser.add_argument("--leases", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--waiting", type=int, default=30)
    args = parser.parse_args()
    farm_file = Path(tempfile.mkdtemp(prefix="gpufarm-why-")) / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml() + FAIR_SHARE)
    port = free_port()
    proc, _ = start_sandbox(port)
    try:
        url = f"http://127.0.0.1:{port}"
        api = scalefarm.Api(url)
        os.environ.update(scalefarm.environment(url, farm_file))
        began = time.perf_counter()
        scalefarm.prepare(api)
        plan = scalefarm.layout(args.hosts, args.leases)
        scalefarm.seed(api, plan)
        scalefarm.settle(api)
        print(f"seeded {args.hosts:,} hosts / {args.leases:,} live leases in {time.perf_counter() - began:.1f} s")
        ended = seed_ended(api, plan)
        ir, user = seed_waiting(api, args.waiting)[-1]
        scalefarm.settle(api)
        print(f"+ {ended:,} ended leases and {args.waiting} requests waiting in onprem-hpc (IR-{ir} the newest)")
        runner = scalefarm.Runner(api)
        held = next(lease for lease in plan.leases if lease.request.environment == "onprem-hpc")
        results = [why_runs(runner, ir, user, args.runs, f"waiting, fair-share pool (IR-{ir})")]
        farm_file.write_text(scalefarm.farm_yaml())
        results.append(why_runs(runner, ir, user, args.runs, f"waiting, FIFO pool (IR-{ir})"))
        results.append(why_runs(runner, held.ir, held.request.requester, args.runs, f"allocated (IR-{held.ir})"))
        for path in results:
            show(path)
        worst = max(c.wall_s for p in results for c in p.calls[1:])
        print(f"worst warm answer {worst * 1000:.0f} ms (the worker answers through Slack's response_url)")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
