"""Squatter detection: how soon a squatter is reported, and what detection adds to the agent's CPU per cycle.

    .venv/bin/python benchmarks/squatters.py [--cycles 40] [--runs 5] [--json]

The agent runs on the fake NVML host of benchmarks/node.py (8 x H100, GPU 7 as 7 x 1g.10gb, 200 processes in 38
pods and 11 slice processes), reading that shared host's tags every cycle (a static answer, no HTTP): its seven
slices are assigned to the leases their processes claim, its seven whole GPUs to no lease. So every busy process on
a whole GPU squats: this is detection's worst case, each cycle reporting about a hundred squatters (16 per device
at most), plus one `gpufarm.gpu.squatters` value per device.

- CPU: the agent thread's CPU per cycle (time.thread_time) minus the CPU spent inside fake NVML calls (which a real
  node spends in libnvidia-ml), through a sender that serialises and compresses the series as the real one does
  and drops the bytes. Each run measures detection off, then on (or on, then off: alternated per run), in the same
  process after the same warm-up; the figure is the median over the runs of each run's mean, and the added share.
- Latency: a process claiming no lease starts on a device of a lease between two cycles; the number of agent cycles
  until a `gpufarm.process.squatter` series names its pid (1: the next cycle). Datadog then evaluates the monitor
  on its own schedule (every minute for metric monitors), which a local run cannot measure.
Goals (issue 23): the squatter reported within one agent cycle (+ one monitor evaluation); detection adds <= 5 %
CPU per cycle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node import CYCLE_S, TimedNvml, host_tags, topology  # noqa: E402 - beside this script

TARGET_ADDED = 0.05
WARMUP = 3


class _StaticTags:
    """The host tags answer of the benchmark's host, the same every read."""

    def __init__(self, tags: list[str]) -> None:
        self.body = json.dumps({"tags": tags}).encode()

    def get(self) -> tuple[int, bytes, dict[str, str]]:
        return 200, self.body, {}

    def close(self) -> None:
        return None


class _Drop:
    """An intake that takes every payload and keeps nothing."""

    encoding = "gzip"

    def post(self, compressed: bytes) -> None:
        return None


def _agent(fake: Any, timed: Any, workdir: str, clock: Any, squatters: bool) -> Any:
    from gpufarm_node.agent import Agent
    from gpufarm_node.attribution import Attributor, PodMetadataFile, PodResourcesOwners, ProcFs
    from gpufarm_node.collect import CollectOptions
    from gpufarm_node.fake_host import FakeHost
    from gpufarm_node.hosttags import HostTagWatch
    from gpufarm_node.nvml.source import NvmlSource
    from gpufarm_node.sender import DatadogSender

    host = FakeHost(fake, workdir)
    pods = PodMetadataFile(host.pods_file)
    spec = fake.topology
    return Agent(
        NvmlSource(timed, clock=clock, xid_mode="poll"),
        Attributor(ProcFs(host.proc_root), pods=pods, owners=PodResourcesOwners(host.pod_resources, pods)),
        DatadogSender(_Drop(), "gpu-bench-01", clock=clock),
        hostname="gpu-bench-01",
        environment="aws-cloud",
        cluster="bench",
        clock=clock,
        flush_interval=60.0,
        options=CollectOptions(squatters=squatters),
        host_tags=HostTagWatch(_StaticTags(host_tags(spec)), "gpu-bench-01"),
    )


def cpu_run(cycles: int, squatters: bool) -> dict[str, float]:
    """One agent, `cycles` measured cycles: mean own CPU per cycle (ms) and squatter series per cycle."""
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.topology import topology_from_dict

    now = [time.time()]
    clock = lambda: now[0]  # noqa: E731 - a one-line clock
    fake = FakeNvml(topology_from_dict(topology(), seed="bench"), clock=clock)
    timed = TimedNvml(fake)
    costs, reported = [], []
    with tempfile.TemporaryDirectory() as workdir:
        agent = _agent(fake, timed, workdir, clock, squatters)
        agent.start()
        for i in range(cycles + WARMUP):
            now[0] += CYCLE_S
            timed.reset()
            started = time.thread_time()
            agent.cycle()
            spent = time.thread_time() - started - timed.excluded()
            if i >= WARMUP:
                costs.append(spent)
                reported.append(sum(1 for row in agent.last_rows if row[0] == "gpufarm.process.squatter"))
        agent.close()
    return {"cpu_ms": statistics.mean(costs) * 1000, "squatter_series": statistics.mean(reported)}


def latency() -> int:
    """Cycles from a squatter's start to the first series naming it."""
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.topology import topology_from_dict

    doc = topology()
    squatter_pid = 29_999
    # On slice 0 of GPU 7 (assigned to ir-3000), claiming no lease, from 100 s after the start (between cycles).
    doc["processes"].append({"pid": squatter_pid, "gpu": 7, "mig": 0, "workload": "busy", "start": 100.0})
    now = [time.time()]
    clock = lambda: now[0]  # noqa: E731 - a one-line clock
    fake = FakeNvml(topology_from_dict(doc, seed="bench"), clock=clock)
    with tempfile.TemporaryDirectory() as workdir:
        agent = _agent(fake, TimedNvml(fake), workdir, clock, True)
        agent.start()
        started_at, cycles = None, 0
        try:
            for _ in range(40):
                now[0] += CYCLE_S
                agent.cycle()
                if started_at is None and fake.now() >= 100.0:
                    started_at = fake.now()
                if started_at is not None:
                    cycles += 1
                    if any(
                        row[0] == "gpufarm.process.squatter" and f"pid:{squatter_pid}" in row[2]
                        for row in agent.last_rows
                    ):
                        return cycles
        finally:
            agent.close()
    raise RuntimeError("the squatter was never reported")


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for run in range(args.runs):
        for squatters in (False, True) if run % 2 == 0 else (True, False):
            runs[squatters].append(cpu_run(args.cycles, squatters))
    off = statistics.median(r["cpu_ms"] for r in runs[False])
    on = statistics.median(r["cpu_ms"] for r in runs[True])
    paired = [b["cpu_ms"] / a["cpu_ms"] - 1 for a, b in zip(runs[False], runs[True], strict=True)]
    figures = {
        "cpu_ms_off": off,
        "cpu_ms_on": on,
        "added": on / off - 1,
        "added_paired_min_max": [min(paired), max(paired)],
        "squatter_series_per_cycle": statistics.median(r["squatter_series"] for r in runs[True]),
        "latency_cycles": latency(),
        "cycle_s": CYCLE_S,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"agent CPU per cycle, detection off: {off:.3f} ms; on: {on:.3f} ms (median of {args.runs} runs)")
    low, high = figures["added_paired_min_max"]
    print(f"added by detection: {figures['added']:+.1%} (per run {low:+.1%} .. {high:+.1%}; goal <= +5 %)")
    print(f"squatter series per cycle (worst case): {figures['squatter_series_per_cycle']:.0f}")
    print(
        f"latency: reported {figures['latency_cycles']} agent cycle(s) after it started "
        f"(<= {CYCLE_S:.0f} s), then one monitor evaluation"
    )


if __name__ == "__main__":
    main()
