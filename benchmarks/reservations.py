"""Admission of a reservation in a busy pool (gpufarm.core.calendar): 3,000 live leases and 1,000 reservations.

What the pool's writer does once it holds the pool's live incidents: decode every incident of the pool (as the
live search answers them: `IncidentRecord`s with gpufarm's fields), turn them into holds (a lease until its
`expires_at`, a reservation over its window), sweep them into the pool's and the team's use over time, and decide
the booking: one that fits (checked over its whole window) and one that does not (the shortfall found, then the
nearest free window searched over every candidate start within the horizon). Each is run `--runs` times; the
figures are the median and the slowest, wall and CPU, and the decode apart.

With --sandbox it also measures the whole path through the runtime's real clients: the sandbox in its own process
(gpufarm_sandbox.scalefarm) seeded with the pool's 3,000 leases on their hosts and its 1,000 reservations as
incidents, then `/gpu reserve` as the Slack worker runs it (membership, the up-front check against the calendar,
the create queued) and the queue consumer's create and decision in the pool's group (the decision that counts):
wall time, CPU and the sandbox's reads per invocation, `--rounds` bookings (each a fresh runtime).

Run: .venv/bin/python benchmarks/reservations.py [--leases 3000] [--reservations 1000] [--runs 20] [--sandbox]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufarm.core.calendar.admission import Booking, decide
from gpufarm.core.calendar.booking import Calendar, Limits
from gpufarm.core.calendar.reservations import holds
from gpufarm.core.config.reservations import ReservationSettings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, GpuRequest, IncidentRecord, isoformat

POOL, MODEL, TEAMS = "onprem-hpc", "H100", 12
GOAL_S = 1.0


def records(leases: int, reservations: int, now: datetime) -> list[IncidentRecord]:
    """The pool's live incidents as the search returns them: leases of 8 or 16 GPUs ending over the next 30 days,
    reservations of 8 GPUs for 1-5 days over the next 80."""
    out: list[IncidentRecord] = []
    for i in range(leases + reservations):
        reserved = i >= leases
        request = GpuRequest(
            team=f"team{i % TEAMS:02d}",
            project=f"proj-{i:05d}",
            gpu_model=MODEL,
            gpu_count=8 if reserved or i % 2 else 16,
            environment=POOL,
            duration_days=14,
            requester=f"U{i % TEAMS:010d}",  # each team's researcher (gpufarm_sandbox.scalefarm.user)
            request_id=f"bench-{i:06d}",
        )
        if reserved:
            start = now + timedelta(hours=6 * (i % 320))
            request = request.model_copy(
                update={"reserved_from": start, "reserved_until": start + timedelta(days=1 + i % 5)}
            )
        phase = Phase.RESERVED if reserved else Phase.ALLOCATED
        values = request.to_fields(phase, now)
        if not reserved:
            values |= {
                f.STATE: State.STABLE.value,
                f.HOSTS: [f"hpc-{i:05d}"],
                f.EXPIRES_AT: isoformat(now + timedelta(hours=1 + (i * 7) % (30 * 24))),
                f.ALLOCATED_AT: isoformat(now - timedelta(days=1)),
            }
        out.append(
            IncidentRecord(
                id=f"id-{i}", public_id=i + 1, title=request.title(), fields=f.decode_fields(f.encode_fields(values))
            )
        )
    return out


def admit(found: list[IncidentRecord], booking: Booking, capacity: int, quota: int, now: datetime) -> tuple[str, float]:
    """Decode, sweep and decide one booking; what was decided and how long the decode took."""
    started = time.perf_counter()
    live = [Allocation.from_record(r) for r in found]
    decoded = time.perf_counter() - started
    calendar = Calendar(holds(live, POOL, MODEL, now), Limits(capacity, quota), booking.team)
    reason = decide(booking, calendar, ReservationSettings().policy(POOL), now)
    return (reason.code.value if reason else "reserved"), decoded


def through_sandbox(leases: int, reservations: int, rounds: int) -> None:
    """Seed the pool on a sandbox of its own and book through the worker and the queue consumer, `rounds` times."""
    import os
    import tempfile

    from gpufarm.core.chat.command_text import parse_command
    from gpufarm_sandbox import scalefarm
    from gpufarm_sandbox.process import free_port, start_sandbox

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    farm_file = Path(tempfile.mkdtemp(prefix="gpufarm-reservations-")) / "farm.yaml"
    farm_file.write_text(scalefarm.farm_yaml())
    os.environ.update(scalefarm.environment(url, farm_file))
    proc, _ = start_sandbox(port)
    try:
        api = scalefarm.Api(url)
        seeded = time.perf_counter()
        scalefarm.prepare(api)
        pool = (scalefarm.PoolShare(POOL, "dedicated", MODEL, 1.0, 1.0, ("hpc-a", "hpc-b")),)
        plan = scalefarm.layout(int(leases * 1.6), leases, pools=pool)
        scalefarm.seed(api, plan)
        now = datetime.now(UTC).replace(microsecond=0)
        _seed_reservations(api, reservations, now)
        print(
            f"seeded {leases} leases on {len(plan.hosts)} hosts and {reservations} reservations in "
            f"{time.perf_counter() - seeded:.1f} s"
        )
        warmed = time.perf_counter()
        pages = _warm(api)
        print(f"the sandbox's pool search warmed (every page rendered once) in {time.perf_counter() - warmed:.1f} s")
        print(_parse_figures(pages))
        runner = scalefarm.Runner(api)
        print(
            "| round | worker (check, queue) | consumer (create, decide) | total wall | gpufarm CPU | sandbox CPU | "
            "reads | decided | goal |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n in range(rounds):
            path = scalefarm.FarmPath(f"reserve-{n}")
            runner.fresh()
            start = now + timedelta(days=30 + n)
            text = (
                f"reserve 8 {MODEL} env={POOL} project=bench-{n} team={scalefarm.team(1)} "
                f"from {start:%Y-%m-%d %H:%M} for 3d"
            )
            command = {**parse_command(text).to_payload(), "request_id": f"bench-reserve-{n:04d}"}
            job = {"kind": "command", "user": scalefarm.user(1), "command": command}
            served = _cpu_s(proc.pid)
            runner.worker(path, "worker reserve", job)
            runner.drain(path)
            served = _cpu_s(proc.pid) - served
            worker, consumer = path.calls[0], path.calls[1:]
            endpoints: dict[str, int] = {}
            for call in consumer:
                for endpoint, count in call.by_endpoint.items():
                    endpoints[endpoint] = endpoints.get(endpoint, 0) + count
            decided = _decided(api, f"bench-reserve-{n:04d}")
            met = "met" if path.wall_s <= GOAL_S else "MISSED"
            print(
                f"| {n + 1} | {worker.wall_s:.2f} s | {sum(c.wall_s for c in consumer):.2f} s | {path.wall_s:.2f} s | "
                f"{sum(c.cpu_s for c in path.calls):.2f} s | {served:.2f} s | {path.total('reads')} | {decided} | "
                f"{met} |"
            )
            top = sorted(endpoints.items(), key=lambda kv: -kv[1])[:4]
            print("|  | the consumer's calls: " + ", ".join(f"{e} {n}" for e, n in top) + " | | | | | | | |")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user and system, from /proc): the sandbox's share of a path."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _warm(api: object) -> list[bytes]:
    """Read the pool's live incidents once, every page, outside any measured path: Datadog's index serves a search
    warm, and the sandbox renders each incident's view once per change (its first read of a pool pays for 4,000).
    Returns the pages as JSON text (re-encoded as `json.dumps` writes it) for `_parse_figures`."""
    import urllib.parse

    from gpufarm_sandbox import scalefarm

    assert isinstance(api, scalefarm.Api)
    query = urllib.parse.quote(f'state:(active OR stable) AND environment:("{POOL}")')
    offset, total = 0, 1
    pages: list[bytes] = []
    while offset < total:
        page = api.ok("GET", f"/api/v2/incidents/search?query={query}&page[size]=100&page[offset]={offset}")
        pages.append(json.dumps(page).encode())
        total = page["data"]["attributes"]["total"]
        offset += 100
    return pages


def _parse_figures(pages: list[bytes]) -> str:
    """The pool's pages parsed by gpufarm's parser (`datadog_http.parse_json`: orjson) and by `json.loads`, both
    with the cycle collector paused as parse_json pauses it: CPU medians of 3 passes over every page."""
    import gc

    from gpufarm.adapters.datadog_http import parse_json

    def cpu(parse: Callable[[bytes], object]) -> float:
        passes = []
        for _ in range(3):
            gc.disable()
            try:
                began = time.process_time()
                for page in pages:
                    parse(page)
                passes.append(time.process_time() - began)
            finally:
                gc.enable()
        return statistics.median(passes)

    size = sum(len(page) for page in pages) / 1e6
    return (
        f"the pool's {len(pages)} search pages ({size:.1f} MB of JSON) parsed: parse_json (orjson) "
        f"{cpu(parse_json):.3f} s CPU, json.loads {cpu(json.loads):.3f} s CPU"
    )


def _seed_reservations(api: object, count: int, now: datetime) -> None:
    """The pool's reservations as incidents in phase reserved, through the sandbox's incident API."""
    from concurrent.futures import ThreadPoolExecutor

    from gpufarm.config import Settings
    from gpufarm_sandbox import scalefarm

    assert isinstance(api, scalefarm.Api)
    types = api.ok("GET", "/api/v2/incidents/config/types")["data"]
    type_id = next(t["id"] for t in types if t["attributes"]["name"] == Settings().incident_type)
    found = records(0, count, now)

    def create(record: IncidentRecord) -> None:
        values = {k: v for k, v in record.fields.items() if v is not None}
        attributes = {
            "title": record.title,
            "customer_impacted": False,
            "fields": f.encode_fields(values),
            "incident_type_uuid": type_id,
        }
        api.ok("POST", "/api/v2/incidents", {"data": {"type": "incidents", "attributes": attributes}})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(create, found))


def _decided(api: object, request_id: str) -> str:
    from gpufarm_sandbox import scalefarm

    assert isinstance(api, scalefarm.Api)
    _, incident_id = scalefarm.find_incident(api, request_id)
    fields = api.ok("GET", f"/api/v2/incidents/{incident_id}")["data"]["attributes"]["fields"]
    return str((fields.get(f.PHASE) or {}).get("value"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=3000)
    parser.add_argument("--reservations", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sandbox", action="store_true", help="also book through the runtime on a seeded sandbox")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    now = datetime.now(UTC).replace(microsecond=0)
    found = records(args.leases, args.reservations, now)
    held = sum(int(r.fields[f.GPU_COUNT] or 0) for r in found[: args.leases])  # type: ignore[arg-type]
    capacity = held + 64
    start = now + timedelta(days=20)
    cases = {
        "fits": Booking("team01", POOL, MODEL, 8, start, start + timedelta(days=3)),
        "refused, nearest window searched": Booking(
            "team01", POOL, MODEL, 2000, now + timedelta(hours=1), now + timedelta(days=3, hours=1)
        ),
    }
    print(
        f"pool {POOL}: {args.leases} live leases ({held} GPUs), {args.reservations} reservations, "
        f"capacity {capacity} {MODEL}; {args.runs} runs each"
    )
    print(f"| booking | decided | wall median | wall max | CPU median | of it, decoding | goal ≤ {GOAL_S:g} s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, booking in cases.items():
        walls: list[float] = []
        cpus: list[float] = []
        decodes: list[float] = []
        decided = ""
        for _ in range(args.runs):
            wall, cpu = time.perf_counter(), time.process_time()
            decided, decoded = admit(found, booking, capacity, 10**6, now)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            decodes.append(decoded)
        met = "met" if max(walls) <= GOAL_S else "MISSED"
        print(
            f"| {name} | {decided} | {statistics.median(walls):.3f} s | {max(walls):.3f} s | "
            f"{statistics.median(cpus):.3f} s | {statistics.median(decodes):.3f} s | {met} |"
        )
    if args.sandbox:
        through_sandbox(args.leases, args.reservations, args.rounds)


if __name__ == "__main__":
    main()
