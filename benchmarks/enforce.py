"""The Slurm enforcer (`gpufarm-node enforce slurm`, gpufarm_node.enforce): how soon Slurm holds a lease, and what a
run with nothing to do costs.

1. Latency on a real Slurm (`--parts latency`; needs slurm-wlm and munge, run as root): the local function host
   (start_local, gpufarm's Datadog setup, config/farm.example.yaml) with the sandbox playing Slack users
   (gpufarm_sandbox.demo.lifecycle_stage.LocalFarm), a local Slurm whose nodes are the HPC pool's four hosts
   (gpufarm_sandbox.slurmlocal), and the enforcer looping at its default interval (`--interval`, 20 s) in a
   thread, reading the local host's Datadog as the systemd unit reads Datadog. `--trials` times: alice requests
   8 H100 on onprem-hpc; from the moment the incident reads allocated, the seconds until `scontrol show
   reservation` shows gpufarm-ir-<n> ACTIVE; she releases; from the moment the incident reads reclaimed, the
   seconds until the reservation is gone. Requests are issued at a random point of the enforcer's interval. Beside
   them, the seconds one enforcer run takes (Datadog read, scontrol reads, the operation).
2. Cost of a no-change run at size (`--parts cost`): `--leases` live leases (3,000) of which `--reservations`
   (500) hold hosts of this Slurm cluster's pool, the rest on other pools or clusters; Datadog's incident search
   served page by page (100 a page, as Datadog pages) from a loopback HTTP server in this process, its JSON shaped
   as Datadog's; scontrol's `show node` (2,000 nodes) and `show reservation` (the 500 reservations, already as
   the leases want) answered by a fake with that output. `--runs` runs; per run the enforcer thread's CPU
   (time.thread_time: the server's thread is not counted), wall, Datadog requests and scontrol calls. Beside it,
   the floor: the same pages fetched and json.loads'ed alone.

Run: .venv/bin/python benchmarks/enforce.py [--parts latency,cost] [--trials 3] [--interval 20] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpufarm_node.datadog import DatadogTarget
from gpufarm_node.enforce.config import SlurmNames
from gpufarm_node.enforce.datadog_io import PAGE_SIZE, DatadogIO
from gpufarm_node.enforce.run import SlurmEnforcer
from gpufarm_node.enforce.slurm_plan import TIME_FORMAT

TYPE_ID = "00000000-0000-4000-8000-000000000001"


# -- 2. cost at size ------------------------------------------------------------------------------------------------


def _incidents(leases: int, reserved: int, end: datetime) -> list[dict[str, Any]]:
    out = []
    for n in range(1, leases + 1):
        ours = n <= reserved
        values = {
            "phase": "allocated",
            "environment": "onprem-hpc" if ours or n % 2 else "cloud-aws",
            "team": "nlp",
            "requester": "U0000000001" if n % 3 else f"U{n:010d}",
            "hosts": [f"hpc-{n:05d}"] if ours else [f"other-{n:05d}", f"other-{n:05d}b"],
            "expires_at": end.isoformat(),
            "project": "llm",
            "gpu_model": "H100",
            "gpu_count": "8",
            "gpufarm_history": [f"2026-12-0{1 + n % 7}T10:00:00Z U0000000001 allocated: hosts: h" for _ in range(6)],
        }
        fields = {k: {"type": "textarray" if isinstance(v, list) else "textbox", "value": v} for k, v in values.items()}
        attributes = {"public_id": n, "title": f"GPU lease {n}", "state": "active", "fields": fields}
        out.append(
            {
                "data": {
                    "id": f"inc-{n}",
                    "type": "incidents",
                    "attributes": attributes | {"incident_type_uuid": TYPE_ID},
                }
            }
        )
    return out


class _Datadog(BaseHTTPRequestHandler):
    pages: dict[int, bytes] = {}
    types = json.dumps({"data": [{"id": TYPE_ID, "attributes": {"name": "GPU allocation"}}]}).encode()
    requests = 0

    def do_GET(self) -> None:
        type(self).requests += 1
        url = urllib.parse.urlparse(self.path)
        if url.path.endswith("/config/types"):
            body = self.types
        else:
            offset = int(urllib.parse.parse_qs(url.query)["page[offset]"][0])
            body = self.pages.get(offset, self.pages[-1])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(202)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        return


class _FakeScontrol:
    def __init__(self, nodes: str, reservations: str) -> None:
        self.text_nodes, self.text_reservations, self.calls = nodes, reservations, 0

    def nodes(self) -> str:
        self.calls += 1
        return self.text_nodes

    def reservations(self) -> str:
        self.calls += 1
        return self.text_reservations

    def apply(self, args: Sequence[str]) -> None:
        raise AssertionError(f"a no-change run applied {args}")


def cost(leases: int, reserved: int, nodes: int, runs: int) -> None:
    end = (datetime.now(UTC) + timedelta(days=5)).replace(microsecond=0)
    incidents = _incidents(leases, reserved, end)
    pages = {}
    for offset in range(0, leases, PAGE_SIZE):
        chunk = incidents[offset : offset + PAGE_SIZE]
        pages[offset] = json.dumps({"data": {"attributes": {"incidents": chunk, "total": leases}}}).encode()
    pages[-1] = json.dumps({"data": {"attributes": {"incidents": [], "total": leases}}}).encode()
    _Datadog.pages = pages
    node_text = "".join(
        f"NodeName=hpc-{n:05d} Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUTot=128 State=IDLE Partitions=gpu\n"
        for n in range(1, nodes + 1)
    )
    local_end = end.astimezone().strftime(TIME_FORMAT)
    res_text = "".join(
        f"ReservationName=gpufarm-ir-{n} StartTime=2026-12-07T10:00:00 EndTime={local_end} Duration=5-00:00:00 "
        f"Nodes=hpc-{n:05d} NodeCnt=1 CoreCnt=128 Features=(null) PartitionName=(null) Flags=IGNORE_JOBS,SPEC_NODES "
        f"TRES=cpu=128 Users={'alice' if n % 3 else '(null)'} Groups=(null) Accounts={'(null)' if n % 3 else 'nlp'} "
        "Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
        for n in range(1, reserved + 1)
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Datadog)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    io = DatadogIO(DatadogTarget(base, "api-key", "app-key"))
    scontrol = _FakeScontrol(node_text, res_text)
    names = SlurmNames(frozenset({"onprem-hpc"}), {"U0000000001": "alice"}, {"nlp": "nlp"})
    enforcer = SlurmEnforcer(io, scontrol, names, io, cluster_tag="bench")
    cpu, wall, reads = [], [], []
    for _ in range(runs):
        before_requests, before_calls = _Datadog.requests, scontrol.calls
        c0, w0 = time.thread_time(), time.perf_counter()
        report = enforcer.run_once()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
        reads.append((_Datadog.requests - before_requests, scontrol.calls - before_calls))
        assert report.converged and not report.applied, report.lines()
    floor = []
    import urllib.request

    for _ in range(runs):
        c0 = time.thread_time()
        for offset in range(0, leases, PAGE_SIZE):
            with urllib.request.urlopen(f"{base}/api/v2/incidents/search?page%5Boffset%5D={offset}") as answer:
                json.loads(answer.read())
        floor.append(time.thread_time() - c0)
    server.shutdown()
    print(f"\n## no-change run: {leases} live leases, {reserved} reservations, {nodes} Slurm nodes, {runs} runs")
    print(
        f"enforcer CPU per run: median {statistics.median(cpu) * 1000:.0f} ms (min {min(cpu) * 1000:.0f}, "
        f"max {max(cpu) * 1000:.0f}); goal <= 1000 ms"
    )
    print(f"wall per run: median {statistics.median(wall) * 1000:.0f} ms")
    print(
        f"reads per run (Datadog requests, scontrol calls): {sorted(set(reads))} (the first run adds the type lookup)"
    )
    print(f"floor, the same pages fetched and json.loads'ed alone: median CPU {statistics.median(floor) * 1000:.0f} ms")
    print(f"enforcer / floor: {statistics.median(cpu) / statistics.median(floor):.2f}x")


# -- 1. latency on a real Slurm -------------------------------------------------------------------------------------


def latency(trials: int, interval: float) -> None:
    from gpufarm.config import Settings
    from gpufarm.core.kernel.lifecycle import Phase
    from gpufarm_node.enforce.config import load_slurm_names
    from gpufarm_node.enforce.scontrol import Scontrol
    from gpufarm_sandbox import slurmlocal
    from gpufarm_sandbox.demo.enforce_stage import NODES, _datadog
    from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
    from gpufarm_sandbox.example_farm import ALICE
    from gpufarm_sandbox.localhost import start_local

    reason = slurmlocal.missing()
    if reason:
        print(f"\n## latency: skipped ({reason})")
        return
    allocate, reclaim, runs = [], [], []
    with start_local(port=0) as local, slurmlocal.local_slurm(NODES) as slurm:
        farm = LocalFarm.ready(local, monitors=False)
        settings = Settings()
        names = load_slurm_names(local.host.root / "config" / "farm.example.yaml")
        # alice's cluster user must exist on this machine: the local account the demo plays her with.
        names = SlurmNames(names.pools, {ALICE.id: slurmlocal.LEASE_USER}, names.accounts)
        enforcer = SlurmEnforcer(_datadog(settings), Scontrol(env=slurm.env), names, None, cluster_tag="bench")
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                started = time.perf_counter()
                enforcer.run_once()
                runs.append(time.perf_counter() - started)
                stop.wait(max(0.0, interval - runs[-1]))

        threading.Thread(target=loop, daemon=True).start()
        rng = random.Random(23)
        for trial in range(trials):
            time.sleep(rng.uniform(0, interval))
            farm.slash(ALICE, f"request 8 H100 project=bench{trial} team=nlp env=onprem-hpc days=3")
            farm.settle()
            ir = ir_in(shown(farm.answer(ALICE, f"/bench{trial}`")))
            assert ir is not None, "no IR"
            name = f"gpufarm-ir-{ir}"
            assert farm.wait_for(lambda ir=ir: farm.allocation(ir).phase is Phase.ALLOCATED, timeout=30)
            t0 = time.perf_counter()
            while f"ReservationName={name} " not in slurm.reservations():
                assert time.perf_counter() - t0 < 5 * interval, f"{name} never appeared"
                time.sleep(0.1)
            allocate.append(time.perf_counter() - t0)
            time.sleep(rng.uniform(0, interval))
            farm.slash(ALICE, f"release IR-{ir} now")
            farm.settle()
            assert farm.wait_for(lambda ir=ir: farm.allocation(ir).phase is Phase.RECLAIMED, timeout=30)
            t0 = time.perf_counter()
            while f"ReservationName={name} " in slurm.reservations():
                assert time.perf_counter() - t0 < 5 * interval, f"{name} never went"
                time.sleep(0.1)
            reclaim.append(time.perf_counter() - t0)
            print(
                f"trial {trial + 1}: IR-{ir} allocated -> reservation active {allocate[-1]:.1f} s; "
                f"reclaimed -> gone {reclaim[-1]:.1f} s"
            )
        stop.set()
        farm.close()
    print(f"\n## latency on a real Slurm, enforcer every {interval:.0f} s, {trials} trials")
    print(
        f"allocated -> reservation active: max {max(allocate):.1f} s, median {statistics.median(allocate):.1f} s; "
        "goal <= 30 s"
    )
    print(
        f"reclaimed -> reservation gone: max {max(reclaim):.1f} s, median {statistics.median(reclaim):.1f} s; "
        "goal <= 30 s"
    )
    print(
        f"one enforcer run (Datadog read, scontrol reads and ops): median {statistics.median(runs):.2f} s, "
        f"max {max(runs):.2f} s over {len(runs)} runs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="latency,cost")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--interval", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--leases", type=int, default=3000)
    parser.add_argument("--reservations", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=2000)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "cost" in parts:
        cost(args.leases, args.reservations, args.nodes, args.runs)
    if "latency" in parts:
        latency(args.trials, args.interval)


if __name__ == "__main__":
    main()
