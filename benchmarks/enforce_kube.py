"""The node agent's Kubernetes step (`--enforce kubernetes`, gpufarm_node.enforce.kube): what it adds to the agent's
CPU per cycle, beside the agent without it, in the same run.

The agent is node.py's (8 x H100, one as 7 MIG slices, 200 processes; its host tags read every cycle from the
in-process receiver, its series pushed there), on a virtual clock that moves one 15 s cycle per cycle. The Node is
served by the sandbox in a process of its own (its CPU is not this process's), reached through the official
kubernetes client as in a cluster. Blocks of `--block` cycles alternate: off (no step), on (the NodeMarker fed by
each cycle, its steps run when due on the same virtual clock: the Node read at every 5 min resync, so one GET per
20 cycles, as on a node whose lease does not change). Each cycle's cost is the main thread's CPU
(time.thread_time) for the cycle, less the fake NVML's (as node.py counts the agent's own CPU), plus, in the on
blocks, the step's when one ran: what the marker's thread spends.
Two figures of the added CPU: the difference of the two blocks'
means (noisy: a step is one cycle in 20), and the steps' own CPU spread over the on blocks' cycles. Beside them,
what one step costs when the lease changes (GET and PATCH).

Run: .venv/bin/python benchmarks/enforce_kube.py [--cycles 800] [--block 40] [--changes 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from node import CYCLE_S, Receiver, TimedNvml, bench_agent, host_tags, tag_transport, topology  # beside this script

TARGET_PCT = 5.0


def _node(server: str, token: str) -> None:
    from kubernetes import client

    configuration = client.Configuration(host=server)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as http:
        taint = client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
        node = client.V1Node(metadata=client.V1ObjectMeta(name="gpu-bench-01"), spec=client.V1NodeSpec(taints=[taint]))
        client.CoreV1Api(http).create_node(node)


def measure(cycles: int, block: int, changes: int) -> dict[str, Any]:
    """Per-cycle CPU with the step off and on (alternating blocks), and a lease change's step."""
    from gpufarm_node.agent import settle_process
    from gpufarm_node.datadog import DatadogTarget, api_client
    from gpufarm_node.enforce.kube import KubernetesNodeApi, NodeMarker
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.sender import DatadogSender, SeriesIntake
    from gpufarm_node.topology import topology_from_dict
    from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN
    from gpufarm_sandbox.process import free_port, start_sandbox

    port = free_port()
    proc, _ = start_sandbox(port)
    server = f"http://127.0.0.1:{port}{PREFIX}"
    now = [time.time()]
    clock = lambda: now[0]  # noqa: E731 - a one-line clock
    fake = FakeNvml(topology_from_dict(topology(), seed="bench"), clock=clock)
    tags = host_tags(topology_from_dict(topology(), seed="bench"))
    off: list[float] = []
    on: list[float] = []
    steps: list[float] = []
    try:
        _node(server, TOKEN)
        with Receiver(tags) as receiver, tempfile.TemporaryDirectory() as workdir:
            client = api_client(DatadogTarget(receiver.url, "bench-api-key", "bench-app-key"), max_retries=0)
            sender = DatadogSender(SeriesIntake(client, "zstd1"), "gpu-bench-01", clock=clock)
            timed = TimedNvml(fake)
            agent = bench_agent(timed, fake, workdir, sender, clock, 60.0, tag_transport(receiver.url, "socket"))
            marker = NodeMarker(KubernetesNodeApi(host=server, token=TOKEN), "gpu-bench-01", clock=clock)
            agent.start()
            settle_process()
            for i in range(cycles + 2 * block):
                enforcing = (i // block) % 2 == 1
                agent.lease_marks = marker if enforcing else None
                now[0] += CYCLE_S
                timed.reset()
                started = time.thread_time()
                agent.cycle()
                step = 0.0
                if enforcing and marker.due_in() <= 0.0:
                    step_started = time.thread_time()
                    marker.step()
                    step = time.thread_time() - step_started
                spent = time.thread_time() - started - timed.excluded()
                if i >= 2 * block:  # the first pair of blocks warms caches and connections
                    (on if enforcing else off).append(spent)
                    if enforcing:
                        steps.append(step)
            change: list[float] = []
            for n in range(changes):
                marker.want(f"ir-{n % 2 + 1}")
                started = time.thread_time()
                result = marker.step()
                change.append(time.thread_time() - started)
                assert result is not None and result.error is None and result.patched, result
            agent.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return {"off": off, "on": on, "steps": steps, "change": change}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=800)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--changes", type=int, default=40)
    args = parser.parse_args()
    result = measure(args.cycles, args.block, args.changes)
    off, on = statistics.mean(result["off"]) * 1000, statistics.mean(result["on"]) * 1000
    added = (on - off) / off * 100
    print(f"cycles measured: {len(result['off'])} off, {len(result['on'])} on (alternating blocks of {args.block})")
    print(f"agent CPU per cycle, step off: {off:.3f} ms (median {statistics.median(result['off']) * 1000:.3f})")
    print(f"agent CPU per cycle, step on:  {on:.3f} ms (median {statistics.median(result['on']) * 1000:.3f})")
    print(f"added: {on - off:+.3f} ms per cycle, {added:+.1f} % (target <= +{TARGET_PCT:.0f} %)")
    steps = [x for x in result["steps"] if x > 0]
    spread = sum(steps) / len(result["on"]) * 1000
    print(f"steady steps (one GET) in the on blocks: {len(steps)}, median {statistics.median(steps) * 1000:.3f} ms CPU")
    print(f"the steps' CPU over the on cycles: {spread:.4f} ms per cycle, {spread / off * 100:+.2f} % of the off mean")
    change = result["change"]
    print(f"a lease change's step (GET + PATCH): median {statistics.median(change) * 1000:.3f} ms CPU")


if __name__ == "__main__":
    main()
