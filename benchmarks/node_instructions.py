"""The node agent's own instructions per cycle, counted by callgrind on benchmarks/node.py's topology.

    .venv/bin/python benchmarks/node_instructions.py [--warmup 4] [--cycles 16] [--flush 60] [--reader R] [--json]

Thread time on a shared machine moves by a third from run to run; instruction counts do not. This runs the agent
as benchmarks/node.py's child builds it (8 x H100, GPU 7 as 7 x 1g.10gb, 200 processes, 673 series, zstd1), with
an intake that keeps the compressed bodies instead of an HTTP receiver (the push's compression and body are
counted, the urllib3 request is not), and the host's tags read every cycle over HTTP from benchmarks/node.py's
receiver running in this (uncounted) process (the read's request, answer and parsing are counted, the kernel's
side of the socket is not; `--reader urllib3` reads through urllib3 as benchmarks/node.py's side-by-side figure
does, instead of the agent's own reader), four times under `valgrind --tool=callgrind`:
- warm-up cycles alone, and warm-up plus the measured cycles: the difference is the measured cycles' whole cost
  (interpreter start-up and imports cancel out);
- the same pair with every fake NVML call made inside `functools.reduce` and callgrind collecting only inside
  `functools_reduce`: the fake's own share (a real node spends it in libnvidia-ml), subtracted.
It prints instructions per cycle: whole (agent and fake), the fake's, and the agent's own, against the target of
issue 9 (<= 3.4 ms own CPU per cycle, about 9.5 M instructions at ~0.35 ns per own instruction, docs/nvml.md §10).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

# benchmarks/node.py's topology and cadence: the script's own folder is first on sys.path.
from node import CYCLE_S, READERS, Receiver, bench_agent, host_tags, tag_transport, topology

TARGET_INSTRUCTIONS = 9.5e6


class KeptIntake:
    """Datadog's series intake reduced to keeping what was posted (zstd1, as the agent sends by default)."""

    encoding = "zstd1"

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def post(self, compressed: bytes) -> None:
        """Keep the body."""
        self.bodies.append(compressed)


class ReducedNvml:
    """Forwards to the fake NVML, each call made inside functools.reduce so callgrind can count the fake alone."""

    def __init__(self, fake: Any) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fake, name)
        if not callable(target) or not name.startswith("nvml"):
            return target
        reduce = functools.reduce

        def call(_: Any, call_args: tuple[Any, ...]) -> Any:
            return target(*call_args)

        def reduced(*args: Any) -> Any:
            return reduce(call, (args,), None)

        setattr(self, name, reduced)
        return reduced


def child(
    cycles: int, flush_interval: float, reduced: bool, tags_url: str, reader: str, squatters: bool, clean: bool
) -> None:
    """Run the agent for `cycles` cycles (under callgrind when the parent asks)."""
    from gpufarm_node.agent import settle_process
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.sender import DatadogSender
    from gpufarm_node.topology import topology_from_dict

    now = [1_800_000_000.0]
    clock = lambda: now[0]  # noqa: E731 - a one-line clock
    fake = FakeNvml(topology_from_dict(_topology(clean), seed="bench"), clock=clock)
    nvml: Any = ReducedNvml(fake) if reduced else fake
    with tempfile.TemporaryDirectory() as workdir:
        intake = KeptIntake()
        sender = DatadogSender(intake, "gpu-bench-01", clock=clock)
        tags = tag_transport(tags_url, reader)
        agent = bench_agent(nvml, fake, workdir, sender, clock, flush_interval, tags, squatters=squatters)
        agent.start()
        settle_process()
        for _ in range(cycles):
            now[0] += CYCLE_S
            agent.cycle()
        agent.close()


def _topology(clean: bool) -> dict[str, Any]:
    """benchmarks/node.py's host; `clean`: every whole GPU's processes of its lease (benchmarks/squatters.py)."""
    if not clean:
        return topology()
    from squatters import clean_topology  # beside this script, first on sys.path

    return clean_topology()


def _host_tags(clean: bool) -> list[str]:
    from gpufarm_node.topology import topology_from_dict

    spec = topology_from_dict(_topology(clean), seed="bench")
    if not clean:
        return host_tags(spec)
    from squatters import clean_host_tags

    return clean_host_tags(spec)


def _count(
    cycles: int, flush_interval: float, reduced: bool, tags_url: str, reader: str, squatters: bool, clean: bool
) -> int:
    """Instructions callgrind counted for one child run (only inside functools_reduce when `reduced`)."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}/callgrind.out",
            *(["--toggle-collect=functools_reduce"] if reduced else []),
            sys.executable,
            __file__,
            "--child",
            str(cycles),
            "--flush",
            str(flush_interval),
            "--tags-url",
            tags_url,
            "--reader",
            reader,
            *(["--reduced"] if reduced else []),
            *([] if squatters else ["--no-squatters"]),
            *(["--clean"] if clean else []),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        match = re.search(r"Collected : (\d+)", done.stderr)
        if match is None:
            raise RuntimeError(f"callgrind printed no total:\n{done.stderr[-2000:]}")
        return int(match.group(1))


def main() -> None:
    """Count and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=4, help="cycles before the measured ones")
    parser.add_argument("--cycles", type=int, default=16, help="measured cycles (a multiple of 4 at the 60 s flush)")
    parser.add_argument("--flush", type=float, default=60.0, help="the push cadence, seconds")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", type=int, metavar="CYCLES", help=argparse.SUPPRESS)
    parser.add_argument("--reduced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tags-url", help=argparse.SUPPRESS)
    parser.add_argument("--reader", choices=READERS, default=READERS[0], help="socket: the agent's tag reader")
    parser.add_argument("--no-squatters", action="store_true", help="squatter detection off (benchmarks/squatters.py)")
    parser.add_argument("--clean", action="store_true", help="every process of its GPU's lease: no squatter")
    args = parser.parse_args()
    squatters = not args.no_squatters
    if args.child is not None:
        child(args.child, args.flush, args.reduced, args.tags_url, args.reader, squatters, args.clean)
        return

    started = time.monotonic()
    with Receiver(_host_tags(args.clean)) as receiver:
        counts = {
            (cycles, reduced): _count(cycles, args.flush, reduced, receiver.url, args.reader, squatters, args.clean)
            for cycles in (args.warmup, args.warmup + args.cycles)
            for reduced in (False, True)
        }
        tag_reads = receiver.tag_reads
    whole = (counts[(args.warmup + args.cycles, False)] - counts[(args.warmup, False)]) / args.cycles
    fake = (counts[(args.warmup + args.cycles, True)] - counts[(args.warmup, True)]) / args.cycles
    own = whole - fake
    figures = {
        "cycles": args.cycles,
        "flush_s": args.flush,
        "reader": args.reader,
        "squatters": squatters,
        "clean": args.clean,
        "whole_per_cycle": whole,
        "fake_per_cycle": fake,
        "own_per_cycle": own,
        "target_own_per_cycle": TARGET_INSTRUCTIONS,
        "tag_reads": tag_reads,
        "seconds": time.monotonic() - started,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"instructions per cycle over {args.cycles} cycles ({args.flush:g} s flush, {args.reader} tag read):")
    print(f"  whole cycle (agent and fake NVML): {whole / 1e6:.2f} M")
    print(f"  fake NVML's share:                 {fake / 1e6:.2f} M")
    print(
        f"  the agent's own:                   {own / 1e6:.2f} M (target <= {TARGET_INSTRUCTIONS / 1e6:.1f} M: "
        f"{'met' if own <= TARGET_INSTRUCTIONS else 'missed'})"
    )
    print(f"  host tag reads answered:           {tag_reads} (one per cycle of the four runs)")


if __name__ == "__main__":
    main()
