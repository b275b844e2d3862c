"""Node agent cost on the fake NVML: 8 GPUs (one in MIG 7 x 1g.10gb) and 200 processes in 40 containers.

    .venv/bin/python benchmarks/node.py [--cycles 40] [--runs 5] [--encoding zstd1|gzip] [--json]

The agent runs in a child process (so its peak RSS is its own, with only gpufarm-node's imports) against a local
HTTP receiver standing in for Datadog's /api/v2/series (202, counting bytes), through the real datadog-api-client.
Each run measures, per cycle, in process CPU time (time.thread_time, so other load on the machine costs little):
- the agent's own CPU: the agent thread's CPU minus the CPU spent inside fake NVML calls (which a real node spends
  in libnvidia-ml instead; the fake's /proc generation is inside those calls too) and minus what the timing
  wrapper round each call adds (calibrated, printed), for two push cadences: every
  cycle, and the default 60 s flush (one push per four 15 s cycles), as the mean over the measured cycles (the
  cycles that push carry their share);
- the host's tags read once per cycle (gpufarm_node.hosttags), one GET to the receiver, whose answer carries the
  tags such a shared host has (registration, 14 units, 7 slice assignments) and Datadog's rate-limit headers: the
  agent's cost includes it. Each run is made twice, in fresh processes, alternating which goes first: once with
  the agent's own bounded HTTP/1.1 reader and once reading through urllib3 (benchmarks/node_tag_reader.py, held
  to the same behaviour), so what urllib3 would add to a cycle is measured side by side (paired by run), along
  with the read's own CPU (the thread time inside each read);
- the floor: a plain loop making the very NVML calls of one agent cycle (recorded from the agent, same
  arguments), measured the same way, in the same process;
- Datadog's community `nvml` check (benchmarks/peers/nvml, integrations-extras, vendored unchanged) on the same
  fake topology, reached through the check's own `NvmlCheck.N` as `--fake` hands the fake to the agent, behind the
  same timing wrapper, one `run()` per cycle into datadog-checks-base's stub aggregator; 5 runs in fresh
  processes, before the agent's runs on even rounds and after them on odd ones. The agent / check ratios (per
  cycle, per series) pair the runs of one round;
- peak RSS of the agent process, bytes sent per cycle (compressed on the wire, zstd1 by default as the agent
  sends with zstandard installed, gzip with --encoding gzip; and raw JSON).
It prints the median and spread (min-max) over the runs of the agent as it ships (its own reader), the agent /
floor ratio, and the side-by-side figures of the tag read.
Targets (issue 9): <= 3.4 ms own CPU per cycle at the 60 s flush (about 5 us per series), <= 40 MB RSS; (issue 27)
<= 1.0 x Datadog's nvml check per cycle at the 60 s flush, side by side, and <= 4 x the floor of the same run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import zstandard

# The agent's own tag reader first: the figures of the agent as it ships are this reader's.
READERS = ("socket", "urllib3")

CYCLE_S = 15.0
TARGET_MS = 3.4
TARGET_RSS_MB = 40.0
TARGET_VS_CHECK = 1.0  # issue 27: x Datadog's nvml check per cycle at the default flush, measured beside it
TARGET_VS_FLOOR = 4.0  # issue 27: x the plain NVML-call floor of the same run


def topology() -> dict[str, Any]:
    """8 x H100, GPU 7 as 7 x 1g.10gb; 200 processes: 189 on whole GPUs in 38 pods, 11 on slices."""
    pods = []
    processes = []
    pid = 20_000
    for p in range(38):
        gpu = p % 7
        labels = {"gpufarm.io/ir": f"IR-{1000 + p % 12}"} if p % 5 else {}
        pods.append(
            {
                "name": f"job-{p}",
                "namespace": f"team-{p % 6}",
                "labels": labels,
                "containers": [{"name": "main", "devices": [str(gpu)]}],
            }
        )
        for k in range(5 if p < 37 else 4):
            pid += 1
            env = {"GPUFARM_IR": f"IR-{2000 + p}"} if p % 5 == 0 and k == 0 else {}
            workload = ("busy", "light", "bursty", "idle-held")[(p + k) % 4]
            processes.append(
                {
                    "pid": pid,
                    "gpu": gpu,
                    "pod": f"job-{p}",
                    "workload": workload,
                    "env": env,
                    "memory_mib": 1000 + 100 * k,
                }
            )
    for s in range(11):
        pid += 1
        processes.append(
            {
                "pid": pid,
                "gpu": 7,
                "mig": s % 7,
                "docker": "auto" if s % 3 == 0 else None,
                "env": {"GPUFARM_IR": f"IR-{3000 + s % 7}"},
                "workload": ("busy", "idle-held")[s % 2],
            }
        )
    for proc in processes:
        if proc.get("docker") is None:
            proc.pop("docker", None)
    return {
        "name": "bench",
        "gpus": [{"model": "H100", "count": 7}, {"model": "H100", "mig": {"profile": "1g.10gb", "count": 7}}],
        "pods": pods,
        "processes": processes,
    }


class TimedTransport:
    """Forwards the tag reads and adds up the thread CPU time spent inside them."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.spent = 0.0

    def get(self) -> Any:
        """One read, timed."""
        started = time.thread_time()
        try:
            return self._transport.get()
        finally:
            self.spent += time.thread_time() - started

    def close(self) -> None:
        """Close the reader's connection."""
        self._transport.close()


def tag_transport(url: str, reader: str) -> Any:
    """The host tag read of the benchmark's host: the agent's own reader (`socket`) or urllib3 held to it."""
    keys = {"DD-API-KEY": "bench-api-key", "DD-APPLICATION-KEY": "bench-app-key"}
    if reader == "urllib3":
        from node_tag_reader import Urllib3TagsTransport  # beside this script, first on sys.path

        return Urllib3TagsTransport(url, "gpu-bench-01", keys)
    from gpufarm_node.hosttags import HttpTagsTransport

    return HttpTagsTransport(url, "gpu-bench-01", keys)


class TimedNvml:
    """Forwards to the fake NVML and adds up the thread CPU time spent inside it.

    `excluded()` is that time plus what this wrapper itself adds to each call outside the timed span (a frame,
    a counter, a clock read), calibrated against calling a plain function: the instrument is not the agent.
    """

    def __init__(self, fake: Any) -> None:
        self._fake = fake
        self.spent = 0.0
        self.calls = 0
        self.overhead = self._calibrate()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fake, name)
        if not callable(target) or not name.startswith("nvml"):
            return target
        timed = self._wrap(target)
        setattr(self, name, timed)  # bound once: later calls find it in the instance
        return timed

    def _wrap(self, target: Any) -> Any:
        clock = time.thread_time

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            started = clock()
            try:
                return target(*args, **kwargs)
            finally:
                self.spent += clock() - started

        return timed

    def _calibrate(self, calls: int = 2000) -> float:
        def plain() -> None:
            return None

        wrapped = self._wrap(plain)
        best = float("inf")
        for _ in range(7):
            self.spent = 0.0
            started = time.thread_time()
            for _ in range(calls):
                plain()
            bare = time.thread_time() - started
            started = time.thread_time()
            for _ in range(calls):
                wrapped()
            best = min(best, (time.thread_time() - started - self.spent - bare) / calls)
        self.spent, self.calls = 0.0, 0
        return max(best, 0.0)

    def reset(self) -> None:
        """Start a new measured span."""
        self.spent, self.calls = 0.0, 0

    def excluded(self) -> float:
        """CPU seconds since `reset` that belong to the fake NVML or to this wrapper, not to the agent."""
        return self.spent + self.calls * self.overhead


def host_tags(spec: Any) -> list[str]:
    """The host's user tags as a shared H100 host carries them: registration, its units, the slices' leases."""
    tags = ["gpufarm:managed", "gpu_model:h100", "gpu_count:8", "environment:aws-cloud", "cluster:bench"]
    assigned = []
    for gpu in spec.gpus:
        if gpu.mig is None:
            tags.append(f"gpu_unit:{gpu.index}/{gpu.uuid.lower()}")
            continue
        for n, (mig, uuid) in enumerate(zip(gpu.mig, gpu.mig_uuids, strict=True)):
            tags.append(f"gpu_unit:{gpu.index}.{mig.gpu_instance_id}/{uuid.lower()}/{mig.profile}")
            assigned.append(f"gpu_assign:ir-{3000 + n}/{uuid.lower()}")
    irs = sorted({f"ir:{a.partition('/')[0].partition(':')[2]}" for a in assigned})
    return tags + irs + assigned


def bench_agent(
    nvml: Any,
    fake: Any,
    workdir: str,
    sender: Any,
    clock: Callable[[], float],
    flush_interval: float,
    tags: Any = None,
    *,
    squatters: bool = True,
) -> Any:
    """The agent as the benchmarks run it: `nvml` (the fake, or a wrapper of it) on a fake host in `workdir`,
    reading its host tags through `tags` (a transport, see tag_transport) every cycle; squatter detection on unless
    `squatters` is False (benchmarks/squatters.py)."""
    from gpufarm_node.agent import Agent
    from gpufarm_node.attribution import Attributor, PodMetadataFile, PodResourcesOwners, ProcFs
    from gpufarm_node.collect import CollectOptions
    from gpufarm_node.fake_host import FakeHost
    from gpufarm_node.hosttags import HostTagWatch
    from gpufarm_node.nvml.source import NvmlSource

    host = FakeHost(fake, workdir)
    pods = PodMetadataFile(host.pods_file)
    watch = None if tags is None else HostTagWatch(tags, "gpu-bench-01")
    return Agent(
        NvmlSource(nvml, clock=clock, xid_mode="poll"),
        Attributor(ProcFs(host.proc_root), pods=pods, owners=PodResourcesOwners(host.pod_resources, pods)),
        sender,
        hostname="gpu-bench-01",
        environment="aws-cloud",
        cluster="bench",
        clock=clock,
        flush_interval=flush_interval,
        host_tags=watch,
        options=CollectOptions(squatters=squatters),
    )


def child(url: str, cycles: int, flush_interval: float, encoding: str, reader: str) -> dict[str, Any]:
    """Run the agent; returns CPU per cycle (excluding the fake), the tag read's CPU per cycle and peak RSS."""
    from gpufarm_node.agent import settle_process
    from gpufarm_node.datadog import DatadogTarget, api_client
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.sender import DatadogSender
    from gpufarm_node.series_post import DirectSeriesIntake
    from gpufarm_node.topology import topology_from_dict

    now = [time.time()]
    clock = lambda: now[0]  # noqa: E731 - a one-line clock
    fake = FakeNvml(topology_from_dict(topology(), seed="bench"), clock=clock)
    timed = TimedNvml(fake)
    with tempfile.TemporaryDirectory() as workdir:
        client = api_client(DatadogTarget(url, "bench-api-key", "bench-app-key"), max_retries=0)
        sender = DatadogSender(DirectSeriesIntake.from_client(client, encoding), "gpu-bench-01", clock=clock)
        tags = TimedTransport(tag_transport(url, reader))
        agent = bench_agent(timed, fake, workdir, sender, clock, flush_interval, tags)
        agent.start()
        settle_process()  # as the command line does before its first cycle
        costs, reads, series = [], [], []
        for i in range(cycles + 3):
            now[0] += CYCLE_S
            timed.reset()
            tags.spent = 0.0
            started = time.thread_time()
            report = agent.cycle()
            total = time.thread_time() - started
            if i >= 3:  # warm-up: first sightings fill caches, the first GPM sample has no pair yet
                costs.append(total - timed.excluded())
                reads.append(tags.spent)
                series.append(report.series)
        floor = _floor(timed, agent, now, cycles)
        agent.close()
    return {
        "reader": reader,
        "cpu_ms": [c * 1000 for c in costs],
        "read_us": [r * 1e6 for r in reads],
        "floor_ms": [c * 1000 for c in floor],
        "wrapper_us_per_call": timed.overhead * 1e6,
        "series": statistics.mean(series),
        "processes": len(topology()["processes"]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "requests": sender.stats["requests"],
        "tag_reads": agent.host_tags.stats["reads"],
    }


def child_check(cycles: int) -> dict[str, Any]:
    """Run Datadog's nvml check (benchmarks/peers/nvml) on the same fake topology, timed as the agent is.

    The fake reaches the check the way `--fake` reaches the agent, as the object the code calls NVML through:
    the check's own `NvmlCheck.N` ("the pynvml package, explicitly assigned, used for easy test mocking"). Its
    metrics land in datadog-checks-base's stub aggregator (what runs a check outside the Datadog Agent, where the
    Agent's Go aggregator would take them), emptied between cycles. Per cycle: one `run()`, as the Agent's
    collector makes every 15 s.
    """
    from datadog_checks.base.stubs import aggregator
    from peers.nvml.nvml import NvmlCheck  # benchmarks/peers, beside this script

    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.topology import topology_from_dict

    now = [time.time()]
    fake = FakeNvml(topology_from_dict(topology(), seed="bench"), clock=lambda: now[0])
    timed = TimedNvml(fake)
    NvmlCheck.N = timed
    check = NvmlCheck("nvml", {}, [{}])
    costs, series = [], []
    for i in range(cycles + 3):
        now[0] += CYCLE_S
        aggregator.reset()
        timed.reset()
        started = time.thread_time()
        error = check.run()
        total = time.thread_time() - started
        if error:
            raise RuntimeError(f"the nvml check failed: {error}")
        if i >= 3:  # the same warm-up as the agent's
            costs.append(total - timed.excluded())
            series.append(sum(len(aggregator.metrics(name)) for name in aggregator.metric_names))
    return {
        "cpu_ms": [c * 1000 for c in costs],
        "series": statistics.mean(series),
        "nvml_calls_per_cycle": timed.calls,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _floor(timed: TimedNvml, agent: Any, now: list[float], cycles: int) -> list[float]:
    """The NVML calls of one agent cycle, recorded, then replayed as a plain loop: CPU per cycle outside NVML."""
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    source = agent.source
    real = source._n

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            target = getattr(real, name)

            def record(*args: Any) -> Any:
                calls.append((target, args))
                return target(*args)

            return record

    source._n = Recorder()
    now[0] += CYCLE_S
    source.snapshot()
    source._n = real
    costs = []
    for _ in range(cycles):
        now[0] += CYCLE_S
        timed.reset()
        started = time.thread_time()
        for function, args in calls:
            function(*args)
        costs.append(time.thread_time() - started - timed.excluded())
    return costs


class Receiver:
    """Datadog's series intake, reduced to counting bytes, and its host tags endpoint answering `tags`: HTTP/1.1
    with keep-alive, as Datadog's is (a server that closes after each answer would add a reconnect to every push)."""

    def __init__(self, tags: list[str] | None = None) -> None:
        self.compressed = 0
        self.raw = 0
        self.requests = 0
        self.tag_reads = 0
        self.lock = threading.Lock()
        receiver = self
        tags_body = json.dumps({"host": "gpu-bench-01", "tags": tags or []}).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in one write (unbuffered, the body's own segment waits for a delayed ACK).
            wbufsize = 1 << 16

            def do_GET(self) -> None:
                if not self.path.startswith("/api/v1/tags/hosts/gpu-bench-01?source=user"):
                    self.send_error(404)
                    return
                with receiver.lock:
                    receiver.tag_reads += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(tags_body)))
                # A generous budget, as Datadog's headers say it: the agent reads every cycle.
                for name, value in (("Limit", "6000"), ("Period", "60"), ("Remaining", "5000"), ("Reset", "30")):
                    self.send_header(f"X-RateLimit-{name}", value)
                self.send_header("X-RateLimit-Name", "tags")
                self.end_headers()
                self.wfile.write(tags_body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = self.headers.get("Content-Encoding")
                if encoding == "gzip":
                    raw = gzip.decompress(body)
                elif encoding == "zstd1":
                    raw = zstandard.ZstdDecompressor().decompress(body)
                else:
                    raw = body
                json.loads(raw)
                with receiver.lock:
                    receiver.compressed += len(body)
                    receiver.raw += len(raw)
                    receiver.requests += 1
                answer = b'{"errors":[]}'
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def run(cycles: int, flush_interval: float, encoding: str, reader: str) -> dict[str, Any]:
    """One measured run in a child process; adds the bytes the receiver saw."""
    from gpufarm_node.topology import topology_from_dict

    tags = host_tags(topology_from_dict(topology(), seed="bench"))
    with Receiver(tags) as receiver:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                receiver.url,
                "--cycles",
                str(cycles),
                "--flush",
                str(flush_interval),
                "--encoding",
                encoding,
                "--reader",
                reader,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    result = json.loads(out.stdout)
    measured_cycles = cycles + 3
    result["bytes_compressed_per_cycle"] = receiver.compressed / measured_cycles
    result["bytes_raw_per_cycle"] = receiver.raw / measured_cycles
    result["receiver_requests"] = receiver.requests
    return result


def run_check(cycles: int) -> dict[str, Any]:
    """One measured run of Datadog's nvml check in a child process."""
    out = subprocess.run(
        [sys.executable, __file__, "--child-check", "--cycles", str(cycles)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}, {min(values):.2f}-{max(values):.2f}"


def _median_of(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [statistics.median(r[key]) for r in runs]


def _side_by_side(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """What urllib3 would add to the agent's cycle, per pair of runs (the same run index, made one after the other)."""
    own, other = runs["socket"], runs["urllib3"]
    agent = [statistics.mean(r["cpu_ms"]) for r in own]
    with_urllib3 = [statistics.mean(r["cpu_ms"]) for r in other]
    read = _median_of(own, "read_us")
    urllib3_read = _median_of(other, "read_us")
    return {
        "agent_ms": agent,
        "urllib3_ms": with_urllib3,
        "added_pct": [100 * (u - a) / a for u, a in zip(with_urllib3, agent, strict=True)],
        "read_us": read,
        "urllib3_read_us": urllib3_read,
        # The reads' difference against the agent's cycle: the same question, without the rest of the cycle's noise.
        "read_added_pct": [100 * (u - r) / (a * 1000) for u, r, a in zip(urllib3_read, read, agent, strict=True)],
    }


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5, help="runs of each cadence and reader (median and spread)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--child-check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flush", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--reader", choices=READERS, default=READERS[0], help=argparse.SUPPRESS)
    parser.add_argument("--encoding", choices=("zstd1", "gzip"), default="zstd1", help="the push's compression")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cycles, args.flush, args.encoding, args.reader)))
        return
    if args.child_check:
        print(json.dumps(child_check(args.cycles)))
        return
    cadences = {"push every cycle": 0.0, "flush every 60 s (default)": 60.0}
    figures: dict[str, dict[str, list[dict[str, Any]]]] = {name: {r: [] for r in READERS} for name in cadences}
    checks: list[dict[str, Any]] = []
    for index in range(args.runs):
        # Datadog's check before the agents on even runs and after them on odd ones: a machine that grows busier
        # during a run favours neither side.
        if index % 2 == 0:
            checks.append(run_check(args.cycles))
        for name, flush in cadences.items():
            # Alternating which reader goes first: a machine that grows busier during a pair favours neither.
            for reader in READERS if index % 2 == 0 else READERS[::-1]:
                figures[name][reader].append(run(args.cycles, flush, args.encoding, reader))
        if index % 2 == 1:
            checks.append(run_check(args.cycles))
    if args.json:
        out = {name: {**runs, "side_by_side": _side_by_side(runs)} for name, runs in figures.items()}
        print(json.dumps({**out, "nvml_check": checks}))
        return
    first = figures["push every cycle"][READERS[0]][0]
    print(
        f"gpufarm-node on the fake NVML: 8 GPUs (7 whole + 7 MIG slices), {first['processes']} processes, "
        f"{first['series']:.0f} series per cycle, {args.cycles} measured cycles of {CYCLE_S:.0f} s, {args.runs} runs "
        f"per reader, {args.encoding} (median, min-max over runs)"
    )
    peer = [statistics.mean(c["cpu_ms"]) for c in checks]
    peer_series = [c["series"] for c in checks]
    peer_per_series = [p * 1000 / n for p, n in zip(peer, peer_series, strict=True)]
    print(
        f"\n  Datadog's nvml check (integrations-extras 1.0.9) on the same fake, {args.runs} runs in fresh processes "
        f"alternating with the agent's: {_spread(peer)} ms per cycle, NVML excluded, "
        f"{statistics.median(peer_series):.0f} series, {_spread(peer_per_series)} us per series"
    )
    for name, by_reader in figures.items():
        runs = by_reader[READERS[0]]
        agent = [statistics.mean(r["cpu_ms"]) for r in runs]
        floor = [statistics.mean(r["floor_ms"]) for r in runs]
        ratio = [a / f for a, f in zip(agent, floor, strict=True)]
        per_series = [a * 1000 / r["series"] for a, r in zip(agent, runs, strict=True)]
        # Paired by run index: the agent's run and the check's run made next to each other.
        vs_check = [a / p for a, p in zip(agent, peer, strict=True)]
        vs_check_series = [a / p for a, p in zip(per_series, peer_per_series, strict=True)]
        p95 = [sorted(r["cpu_ms"])[int(0.95 * (len(r["cpu_ms"]) - 1))] for r in runs]
        rss = [r["peak_rss_mb"] for r in runs]
        target = f"   (target <= {TARGET_MS} ms)" if name.startswith("flush") else ""
        print(f"\n  {name}:")
        print(f"    agent CPU per cycle, NVML excluded (mean of cycles): {_spread(agent)} ms{target}")
        print(f"    per series: {_spread(per_series)} us; p95 cycle: {_spread(p95)} ms")
        check_target = f"   (target <= {TARGET_VS_CHECK})" if name.startswith("flush") else ""
        print(f"    agent / Datadog's nvml check per cycle, paired by run: {_spread(vs_check)}{check_target}")
        print(f"    agent / Datadog's nvml check per series, paired by run: {_spread(vs_check_series)}")
        print(
            f"    floor (the same NVML calls in a plain loop): {_spread(floor)} ms; agent / floor {_spread(ratio)}"
            f"   (target <= {TARGET_VS_FLOOR})"
        )
        print(f"    peak RSS: {_spread(rss)} MB   (target <= {TARGET_RSS_MB:.0f} MB)")
        r = runs[0]
        print(f"    timing wrapper per NVML call (subtracted): {_spread([x['wrapper_us_per_call'] for x in runs])} us")
        print(
            f"    sent per cycle: {r['bytes_compressed_per_cycle'] / 1024:.1f} KiB {args.encoding}, "
            f"{r['bytes_raw_per_cycle'] / 1024:.1f} KiB JSON ({r['receiver_requests']} requests)"
        )
        side = _side_by_side(by_reader)
        print("    host tag read through urllib3 instead of the agent's reader, side by side:")
        print(f"      agent CPU per cycle: {_spread(side['urllib3_ms'])} ms against {_spread(side['agent_ms'])} ms")
        print(f"      urllib3 adds to the agent's cycle, paired by run: {_spread(side['added_pct'])} %")
        print(
            f"      the read's own CPU (median per run): {_spread(side['urllib3_read_us'])} us against "
            f"{_spread(side['read_us'])} us, a difference of {_spread(side['read_added_pct'])} % of the cycle"
        )


if __name__ == "__main__":
    main()
