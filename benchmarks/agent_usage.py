"""What the ledger's query on the Datadog Agent's pools costs a sync (gpufarm.core.accounting.agent_usage): one scalar
query answering a row per device, at the size of the large farm's Agent pool.

The sandbox runs in its own process (so only gpufarm's work is on this process's CPU clock), seeded with `--hosts`
hosts of the pool (`environment:shared-slices`), the first `--leased` of them holding two leases (`ir:` host tags,
as on a sliced host), and one check run of `gpu.sm_active` for each of their 8 GPUs (gpufarm_sandbox.agentcheck),
a third of them busy. Then `agent_usage.measure` runs through the runtime's Datadog gateway `--runs` times: wall
time and CPU of this process per run, the groups answered, the sandbox's request count, and (in one more run under
tracemalloc) the peak of Python allocation. At 20,000 hosts / 3,000 leases (benchmarks/scale.py) the pool on the
Agent holds a fifth of the hosts: 4,000, the default.

Run: .venv/bin/python benchmarks/agent_usage.py [--hosts 4000] [--leased 600] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufarm_sandbox import agentcheck, scalefarm
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY
from gpufarm_sandbox.process import free_port, start_sandbox

POOL = "shared-slices"
SEED_CHUNK = 1000  # hosts per seeding call and series per push (the intake's 512,000-byte limit)


def seed(api: scalefarm.Api, url: str, hosts: int, leased: int) -> int:
    """The pool's hosts and one check run of their GPUs' SM activity; the sandbox's clock now."""
    names = [f"{POOL}-a100-{i:05d}" for i in range(hosts)]
    for start in range(0, hosts, SEED_CHUNK):
        body = []
        for i, name in enumerate(names[start : start + SEED_CHUNK], start=start):
            tags = [f"environment:{POOL}", "gpufarm:managed"]
            tags += [f"ir:ir-{2 * i + 1}", f"ir:ir-{2 * i + 2}"] if i < leased else []
            body.append({"name": name, "tags": {"user": tags}, "reporting": True})
        api.ok("POST", "/_sandbox/hosts", {"hosts": body})
    now = int(float(api.ok("GET", "/_sandbox/clock")["now"]))
    series = []
    for i, name in enumerate(names):
        activity = {g: agentcheck.Activity.busy() if (g + i) % 3 == 0 else agentcheck.IDLE for g in range(8)}
        run = agentcheck.AgentGpuCheck(name, "A100").series(activity, [now - 60, now])
        series += [s for s in run if s["metric"] == "gpu.sm_active"]
    for start in range(0, len(series), SEED_CHUNK):
        agentcheck.push(url, DEFAULT_DD_API_KEY, series[start : start + SEED_CHUNK])
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4000)
    parser.add_argument("--leased", type=int, default=600)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    farm_file = Path(tempfile.mkdtemp(prefix="gpufarm-agent-usage-")) / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml())
    os.environ.update(scalefarm.environment(url, farm_file))
    proc, _ = start_sandbox(port)
    try:
        from gpufarm.adapters.datadog import DatadogGateway
        from gpufarm.config import Settings
        from gpufarm.core.accounting import agent_usage

        api = scalefarm.Api(url)
        now = seed(api, url, args.hosts, args.leased)
        gateway = DatadogGateway(Settings())
        pools = agent_usage.AgentPools(((f"environment:{POOL}",),))
        end = datetime.fromtimestamp(now + 1, UTC)
        start = end - timedelta(minutes=60)
        print(f"{args.hosts:,} hosts of {POOL}, {args.leased:,} with two leases; {pools.query()}")
        for run in range(args.runs + 1):
            traced = run == args.runs
            if traced:
                tracemalloc.start()
            api.ok("DELETE", "/_sandbox/requests")
            wall, cpu = time.perf_counter(), time.process_time()
            reading = agent_usage.measure(gateway, pools, start, end)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if reading is None:
                raise SystemExit("the query failed")
            calls = sum(api.counts().values())
            line = (
                f"  run {run + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, {calls} call(s); {len(reading.hosts):,} hosts "
                f"measured, {len(reading.busy):,} (lease, host) keys, {sum(reading.busy.values()):,.0f} busy devices"
            )
            if traced:
                line += f"; peak Python allocation {tracemalloc.get_traced_memory()[1] / 2**20:.0f} MB (traced run)"
                tracemalloc.stop()
            print(line)
        gateway.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
