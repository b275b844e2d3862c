"""Every path at the scale of a real farm: 2,000 hosts / 300 live leases and 20,000 / 3,000, on the sandbox.

The sandbox runs in its own process on loopback (`gpufarm sandbox`); gpufarm_sandbox.scalefarm seeds it through
its public API (hosts through `/_sandbox/hosts`, leases as gpufarm makes them) and runs each path as the functions
would, one invocation at a time, with the runtime's real clients, measuring wall time, CPU, peak RSS and the
sandbox's request counter per invocation. Paths: request → IR (the worker and the queued create-and-decide),
approval → hosts tagged (the queue consumer's allocation), release → untagged (worker, queued release, the
consumer's reclaim), one sync with no change and one after 1 % of the hosts drifted (the scheduled function, then
each pool's or shard's repair). Prints every figure beside its target and how it grows from the small farm to
the large one.

With every inventory source on (the default; --no-sources leaves them out) the syncs also read AWS and Azure:
EC2 with 2,000 GPU instances in two regions (most of them the cloud pools' registered hosts, 20 without an agent)
and a stubbed Azure subscription with 500 VMs, through gpufarm's own sources (gpufarm_sandbox.clouds), and
the farm file's static list, and the Datadog Agent's GPU check on the shared pool (gpu.device.total, which the
inventory reads, and gpu.sm_active, which the ledger's used reads, of each of its hosts and of AGENT_ONLY hosts
gpufarm never registered); each sync's calls, wall time and nodes per source are printed.
The instances are recorded, not launched (SimulatedAws.record, gpufarm_sandbox.ec2_pages): their DescribeInstances
pages are answered in EC2's XML from the list, with the request's filters, MaxResults and NextToken, in a moment,
where launching and tagging them in moto and its rendering of pages of a thousand took 16 minutes per farm. moto
answers the rest (the instance types) once, before anything is measured (SimulatedAws.prime, printed), and the
syncs get those recorded answers through botocore: their AWS wall time is gpufarm's own work (the real source
sending requests and parsing EC2's XML through botocore).

Run: .venv/bin/python benchmarks/scale.py [--sizes small,large] [--no-sources] [--profile DIR]
(--profile: each scheduled sync's cProfile statistics in DIR/<size>/, its wall and CPU inflated by the profiler.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpufarm.core.config.farm import FarmConfig, parse_farm
from gpufarm.core.kernel.ports import InventorySource, SourceReading
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
    # The accrue commands the no-change sync queued for the leases due (a quarter of them; at most
    # ledger.max_accruals), each its own consumer invocation in its pool's group: writes apart from repairs.
    "accrual": ("accruals of that sync", 60.0),
    # Those of the drifted sync: the leases past ledger.max_accruals that the first sync left due.
    "drift accrual": ("accruals of the drifted sync", 60.0),
}
# The simulated clouds: EC2 GPU instances and Azure VMs, and how many of each run no agent.
EC2_INSTANCES = 2_000
AZURE_VMS = 500
NO_AGENT = {"ec2": 20, "azure": 5}
AZURE_SUBSCRIPTION = "00000000-0000-4000-8000-000000000001"
INVENTORY_YAML = f"""inventory:
  down_after_minutes: 60
  aws:
    regions: [us-east-1, us-west-2]
    default_environment: cloud-aws
  azure:
    subscriptions: [{AZURE_SUBSCRIPTION}]
    locations: [eastus]
  static:
    - {{name: onprem-static-01, environment: onprem-hpc, gpu_model: H100, gpu_count: 8}}
  datadog_agent: {{lookback_minutes: 180}}
"""
# The pool the Datadog Agent's GPU check reports (metrics_source: datadog-agent), and hosts only the check knows.
AGENT_POOL = "shared-slices"
AGENT_ONLY = 10
AGENT_PUSH = 1000  # series per push of the check's gauges
# The check's series the syncs read: the inventory's device count and the ledger's SM activity
# (core/accounting/agent_usage.py).
AGENT_METRICS = ("gpu.device.total", "gpu.sm_active")


def show(size: str, hosts: int, leases: int, seeded_s: float, paths: dict[str, FarmPath]) -> None:
    print(f"\n== {size}: {hosts:,} hosts / {leases:,} live leases (seeded in {seeded_s:.1f} s)")
    for key, path in paths.items():
        label, target = TARGETS[key]
        ok = "ok" if path.wall_s <= target else "MISSED"
        note = f" [{path.note}]" if path.note else ""
        print(
            f"  {label}{note}: {path.wall_s:.2f} s (target ≤ {target:g} s, {ok}); {len(path.calls)} invocation(s), "
            f"reads {path.total('reads')}, writes {path.total('writes')} (host tags {path.total('host_writes')}, "
            f"incidents {path.total('incident_writes')}), Slack {path.total('slack')}, "
            f"metric posts {path.total('metrics')}"
        )
        if key in ("accrual", "drift accrual") and path.calls:
            # One consumer invocation per lease due: their spread, not every line.
            walls = sorted(c.wall_s for c in path.calls)
            print(
                f"    command accrue x {len(walls)}: median {walls[len(walls) // 2]:.2f} s, "
                f"max {walls[-1]:.2f} s wall, "
                f"max {max(c.rss_mb for c in path.calls):.0f} MB peak RSS, {path.total('reads')} reads"
            )
            continue
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
        if not a.calls:
            print(f"  {label}: none at small → {b.wall_s:.2f} s, {len(b.calls)} invocation(s) at large")
            continue
        factor = b.wall_s / a.wall_s if a.wall_s else float("nan")
        cpu = sum(c.cpu_s for c in b.calls) / max(1e-9, sum(c.cpu_s for c in a.calls))
        print(
            f"  {label}: {a.wall_s:.2f} s → {b.wall_s:.2f} s = {factor:.1f} x wall, {cpu:.1f} x CPU "
            f"(reads {a.total('reads')} → {b.total('reads')})"
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
    print(
        f"  its GPU-hour accruals, apart: {large['accrual'].total('writes')} writes for {len(large['accrual'].calls)} "
        f"leases due (one PATCH each, at most ledger.max_accruals a sync)"
    )
    drifted = large["drift"]
    print(
        f"  sync after 1 % drift [{drifted.note}]: {drifted.total('host_writes')} host-tag writes "
        f"(target = {drifted.expected['host_writes']} hosts changed), {drifted.total('incident_writes')} incident "
        f"writes (target = {drifted.expected['incident_writes']} leases repaired, one history entry each)"
    )


class Measured:
    """An inventory source whose every reading is kept with its wall time."""

    def __init__(self, source: InventorySource, log: list[tuple[SourceReading, float]]) -> None:
        self.source, self.log, self.name = source, log, source.name

    def read(self) -> SourceReading:
        """The source's reading, timed."""
        started = time.perf_counter()
        reading = self.source.read()
        self.log.append((reading, time.perf_counter() - started))
        return reading


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """A moto server in its own process (as the sandbox is): its work is not the sync's CPU, only its wait."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the moto server did not start") from None
            time.sleep(0.2)
        else:
            return proc, url


def simulated_clouds(plan: scalefarm.Layout, log: list[tuple[SourceReading, float]], moto_url: str) -> object:
    """EC2 with EC2_INSTANCES recorded GPU instances and a stubbed Azure with AZURE_VMS, named after the cloud hosts."""
    from gpufarm.adapters.datadog import DatadogGateway
    from gpufarm.config import Settings
    from gpufarm.core.inventory import agent_source
    from gpufarm.handlers.runtime import SystemClock
    from gpufarm_sandbox.azurestub import Vm
    from gpufarm_sandbox.clouds import LocalClouds, SimulatedAws

    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"), timeout=30).close()
    clouds = LocalClouds(aws=SimulatedAws(endpoint_url=moto_url, cache_reads=True))
    half = EC2_INSTANCES // 2
    tag = {"gpufarm-environment": "cloud-aws"}
    for region, itype, prefix in (
        ("us-east-1", "p5.48xlarge", "cloud-aws-h100-"),
        ("us-west-2", "p4d.24xlarge", "cloud-aws-a100-"),
    ):
        registered = [h for h in plan.hosts if h.startswith(prefix)][: half - NO_AGENT["ec2"] // 2]
        spare = [f"{prefix}spare-{i:03d}" for i in range(half - len(registered))]
        clouds.aws.record(region, itype, [*registered, *spare], tag)
    azure = clouds.azure_farm(AZURE_SUBSCRIPTION)
    shared = [h for h in plan.hosts if h.startswith("shared-slices-a100-")][: AZURE_VMS - NO_AGENT["azure"]]
    names = [*shared, *(f"azure-spare-{i:03d}" for i in range(AZURE_VMS - len(shared)))]
    azure.vms = [Vm(n, "Standard_NC24ads_A100_v4", tags={"gpufarm-environment": "shared-slices"}) for n in names]
    azure.limits = {"standardNCADSA100v4Family": 24 * AZURE_VMS * 2}
    farm = parse_farm(farm_text())
    aws = [s for s in clouds.sources(farm) if s.name == "aws"]
    primed = clouds.aws.prime(aws[0].read)
    print(
        f"  moto answered the farm's EC2 reads once, before measuring: {primed:.1f} s "
        f"({clouds.aws.moto_calls} EC2 calls since the reset, {clouds.aws.moto_s:.1f} s in moto)"
    )
    clouds.aws.calls = 0

    def sources(farm: FarmConfig) -> list[InventorySource]:
        # The Agent GPU check's source too, on the runtime's own clients, so its readings are measured alike.
        agent = agent_source.for_farm(farm, DatadogGateway(Settings()), SystemClock())
        return [Measured(s, log) for s in [*clouds.sources(farm), *([agent] if agent else [])]]

    return sources


def farm_text() -> str:
    """The scale farm with AGENT_POOL on the Datadog Agent's GPU check, and every inventory source."""
    agent = f"\n  {AGENT_POOL}:\n    metrics_source: datadog-agent\n"
    return scalefarm.farm_yaml().replace(f"\n  {AGENT_POOL}:\n", agent, 1) + INVENTORY_YAML


def push_agent_checks(api: scalefarm.Api, plan: scalefarm.Layout, url: str) -> int:
    """The GPU check's AGENT_METRICS of AGENT_POOL's hosts and of AGENT_ONLY unregistered ones; hosts sent."""
    from gpufarm.core.kernel.hosts import tag_value
    from gpufarm_sandbox import agentcheck
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY

    now = int(float(api.ok("GET", "/_sandbox/clock")["now"]))
    pool = [(h, tags) for h, tags in plan.hosts.items() if h.startswith(f"{AGENT_POOL}-")]
    hosts = [(h, str(tag_value(tags, "gpu_model")).upper(), int(tag_value(tags, "gpu_count") or 8)) for h, tags in pool]
    hosts += [(f"agent-only-{i:03d}", "L4", 8) for i in range(AGENT_ONLY)]
    series = []
    for host, model, count in hosts:
        own = [] if host in plan.hosts else [f"environment:{AGENT_POOL}"]  # the Agent's `tags:` on a host of its own
        checked = agentcheck.AgentGpuCheck(host, model, count).series(agentcheck.IDLE, [now])
        series += [{**s, "tags": [*s["tags"], *own]} for s in checked if s["metric"] in AGENT_METRICS]
    # The intake takes at most 512,000 bytes uncompressed: about 1,200 of these series (one per GPU, ~420 bytes).
    for start in range(0, len(series), AGENT_PUSH):
        agentcheck.push(url, DEFAULT_DD_API_KEY, series[start : start + AGENT_PUSH])
    return len(hosts)


def show_sources(log: list[tuple[SourceReading, float]]) -> None:
    """Each sync's reading per source: calls, wall time, nodes, quotas, errors."""
    print("  inventory sources, per reading (each sync reads each source once):")
    for reading, wall in log:
        print(
            f"    {reading.source:<13} {reading.calls:3d} calls {wall:6.2f} s wall  {len(reading.nodes):5d} nodes"
            f"  {len(reading.quotas):2d} quotas  {len(reading.errors)} errors"
        )


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
    parser.add_argument("--no-sources", action="store_true", help="no AWS, Azure or static inventory source")
    parser.add_argument("--profile", type=Path, help="cProfile each scheduled sync into this folder, per size")
    args = parser.parse_args()
    if args.profile:
        # This folder's profile.py (benchmarks/profile.py) would shadow the standard library's, which cProfile imports.
        here = Path(__file__).resolve().parent
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    farm_file = Path(tempfile.mkdtemp(prefix="gpufarm-scale-")) / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml() if args.no_sources else farm_text())
    os.environ.update(scalefarm.environment(url, farm_file))
    proc, _ = start_sandbox(port)
    moto = None if args.no_sources else start_moto()
    api = scalefarm.Api(url)
    results: dict[str, dict[str, FarmPath]] = {}
    try:
        for size in args.sizes.split(","):
            hosts, leases = SIZES[size]
            started = time.perf_counter()
            scalefarm.prepare(api)
            plan = scalefarm.layout(hosts, leases)
            scalefarm.seed(api, plan)
            readings: list[tuple[SourceReading, float]] = []
            if moto is not None:
                scalefarm.OVERRIDES["inventory_sources"] = simulated_clouds(plan, readings, moto[1])
                print(f"  the Agent GPU check reports {push_agent_checks(api, plan, url)} hosts of {AGENT_POOL}")
            seeded = time.perf_counter() - started
            scalefarm.PROFILE_DIR = args.profile / size if args.profile else None
            results[size] = scalefarm.measure(api, plan)
            del plan
            show(size, hosts, leases, seeded, results[size])
            if readings:
                show_sources(readings)
        growth(results)
    finally:
        for child in (proc, *(moto[:1] if moto else ())):
            child.terminate()
            child.wait(timeout=10)


if __name__ == "__main__":
    main()
