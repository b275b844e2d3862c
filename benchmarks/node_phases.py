"""Where the node agent's cycle goes: its own CPU per phase, on benchmarks/node.py's fake host and receiver.

    .venv/bin/python benchmarks/node_phases.py [--cycles 80] [--flush 60]

One process, the agent as benchmarks/node.py builds it (the fake NVML behind the same timing wrapper, its own tag
reader, its push on its own connection with the real datadog-api-client behind it, to a local receiver), 4 warm-up
cycles and the collector settled as node.py's child settles it, then each phase of `Agent.cycle` timed
in thread CPU: the NVML snapshot (the time inside the fake's calls and the wrapper's calibrated share
subtracted, as node.py does), the attribution of processes to pods and IRs, the host tag read, building the
cycle's series, queueing them and the push (the JSON body, its compression, the POST), which runs once per flush
interval and is spread over the cycles here. Prints ms per cycle and each phase's share.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

# benchmarks/node.py, beside this script (first on sys.path).
from node import CYCLE_S, Receiver, TimedNvml, bench_agent, host_tags, tag_transport, topology


def _timed(spent: dict[str, float], label: str, function: Callable[..., Any], nvml: TimedNvml | None) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        if nvml is not None:
            nvml.reset()
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            own = time.thread_time() - started - (nvml.excluded() if nvml is not None else 0.0)
            spent[label] = spent.get(label, 0.0) + own

    return run


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=80)
    parser.add_argument("--flush", type=float, default=60.0, help="the push interval in seconds (default 60)")
    args = parser.parse_args()
    from gpufarm_node.agent import settle_process
    from gpufarm_node.datadog import DatadogTarget, api_client
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.sender import DatadogSender
    from gpufarm_node.series_post import DirectSeriesIntake
    from gpufarm_node.topology import topology_from_dict

    spec = topology_from_dict(topology(), seed="bench")
    spent: dict[str, float] = {}
    with Receiver(host_tags(spec)) as receiver, tempfile.TemporaryDirectory() as workdir:
        now = [time.time()]
        clock = lambda: now[0]  # noqa: E731 - a one-line clock
        fake = FakeNvml(spec, clock=clock)
        nvml = TimedNvml(fake)
        client = api_client(DatadogTarget(receiver.url, "bench-api-key", "bench-app-key"), max_retries=0)
        sender = DatadogSender(DirectSeriesIntake.from_client(client, "zstd1"), "gpu-bench-01", clock=clock)
        agent = bench_agent(nvml, fake, workdir, sender, clock, args.flush, tag_transport(receiver.url, "socket"))
        agent.start()
        for _ in range(4):
            now[0] += CYCLE_S
            agent.cycle()
        settle_process()  # as the command line and benchmarks/node.py's child do after start-up
        phases = (
            (agent.source, "snapshot", "NVML snapshot (own, NVML excluded)", nvml),
            (agent, "_attribute", "attribution (pids to pods and IRs)", None),
            (agent.host_tags, "poll", "host tag read", None),
            (agent.builder, "rows", "building the series", None),
            (agent.sender, "send", "queueing", None),
            (agent.sender, "flush", "push: JSON, compression, POST", None),
        )
        for owner, name, label, timed in phases:
            setattr(owner, name, _timed(spent, label, getattr(owner, name), timed))
        total = 0.0
        for _ in range(args.cycles):
            now[0] += CYCLE_S
            nvml.reset()
            started = time.thread_time()
            agent.cycle()
            total += time.thread_time() - started - nvml.excluded()
        agent.close()
    own = sum(spent.values())
    print(f"agent's own CPU per cycle by phase, {args.cycles} cycles, flush every {args.flush:.0f} s:")
    for label, seconds in spent.items():
        print(f"  {label:<40} {seconds / args.cycles * 1000:6.3f} ms  {100 * seconds / own:5.1f} %")
    print(f"  {'the rest of the cycle':<40} {(total - own) / args.cycles * 1000:6.3f} ms")
    print(f"  {'cycle':<40} {total / args.cycles * 1000:6.3f} ms")


if __name__ == "__main__":
    main()
