"""One series push of the node agent, through urllib3 (SeriesIntake) and on the agent's own connection
(DirectSeriesIntake), side by side.

    .venv/bin/python benchmarks/node_push.py [--pushes 200] [--rounds 5]

The payload is a 60 s push of benchmarks/node.py's host (four cycles of 799 series, zstd1, about 10 KB), built by
the agent itself on the fake NVML; both intakes post it to node.py's local receiver (HTTP/1.1, keep-alive), through
the same datadog-api-client ApiClient. Each round times `--pushes` posts through each intake in thread CPU time,
alternating which goes first; it prints the median and spread over rounds of the CPU per push, and their ratio
paired by round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

# benchmarks/node.py, beside this script (first on sys.path).
from node import CYCLE_S, Receiver, TimedNvml, bench_agent, host_tags, tag_transport, topology


def _payload(spec: Any, receiver: Receiver, workdir: str) -> bytes:
    """The compressed body of one 60 s push, as the agent's sender makes it."""
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.sender import DatadogSender

    class Keep:
        encoding = "zstd1"
        bodies: list[bytes] = []

        def post(self, compressed: bytes) -> None:
            self.bodies.append(compressed)

    now = [time.time()]
    clock = lambda: now[0]  # noqa: E731 - a one-line clock
    fake = FakeNvml(spec, clock=clock)
    keep = Keep()
    agent = bench_agent(
        TimedNvml(fake),
        fake,
        workdir,
        DatadogSender(keep, "gpu-bench-01", clock=clock),
        clock,
        60.0,
        tag_transport(receiver.url, "socket"),
    )
    agent.start()
    for _ in range(9):  # the first push holds one cycle; the next ones four
        now[0] += CYCLE_S
        agent.cycle()
    agent.close()
    return keep.bodies[-1]


def _time(intake: Any, body: bytes, pushes: int) -> float:
    started = time.thread_time()
    for _ in range(pushes):
        intake.post(body)
    return (time.thread_time() - started) / pushes


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pushes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from gpufarm_node.datadog import DatadogTarget, api_client
    from gpufarm_node.sender import SeriesIntake
    from gpufarm_node.series_post import DirectSeriesIntake
    from gpufarm_node.topology import topology_from_dict

    spec = topology_from_dict(topology(), seed="bench")
    with Receiver(host_tags(spec)) as receiver, tempfile.TemporaryDirectory() as workdir:
        body = _payload(spec, receiver, workdir)
        client = api_client(DatadogTarget(receiver.url, "bench-api-key", "bench-app-key"), max_retries=0)
        intakes = {"urllib3": SeriesIntake(client, "zstd1"), "own connection": DirectSeriesIntake.from_client(client)}
        for intake in intakes.values():
            _time(intake, body, 10)  # connections open, code warm
        spent: dict[str, list[float]] = {name: [] for name in intakes}
        for round_ in range(args.rounds):
            order = list(intakes) if round_ % 2 == 0 else list(reversed(intakes))
            for name in order:
                spent[name].append(_time(intakes[name], body, args.pushes))
        client.close()
    print(f"one 60 s push ({len(body)} bytes zstd1), {args.pushes} pushes x {args.rounds} rounds, CPU per push:")
    for name, figures in spent.items():
        print(
            f"  {name:<15} median {1e3 * statistics.median(figures):.3f} ms ({1e3 * min(figures):.3f}-"
            f"{1e3 * max(figures):.3f})"
        )
    ratios = [own / lib for own, lib in zip(spent["own connection"], spent["urllib3"], strict=True)]
    print(
        f"  own connection / urllib3, paired by round: median {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f}); at the 60 s flush "
        f"{1e3 * (statistics.median(spent['urllib3']) - statistics.median(spent['own connection'])) / 4:.3f} ms "
        "less per 15 s cycle"
    )


if __name__ == "__main__":
    main()
