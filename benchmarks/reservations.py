"""Admission of a reservation in a busy pool (gpufarm.core.calendar): 3,000 live leases and 1,000 reservations.

What the pool's writer does once it holds the pool's live incidents: decode every incident of the pool (as the
live search answers them: `IncidentRecord`s with gpufarm's fields), turn them into holds (a lease until its
`expires_at`, a reservation over its window), sweep them into the pool's and the team's use over time, and decide
the booking: one that fits (checked over its whole window) and one that does not (the shortfall found, then the
nearest free window searched over every candidate start within the horizon). Each is run `--runs` times; the
figures are the median and the slowest, wall and CPU, and the decode apart. The live search itself (Datadog's
pages of the pool's incidents) is the read every request's decision already makes: benchmarks/scale.py measures
request → IR at 3,000 leases through the runtime's real clients.

Run: .venv/bin/python benchmarks/reservations.py [--leases 3000] [--reservations 1000] [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

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
            team=f"team-{i % TEAMS:02d}",
            project=f"proj-{i:05d}",
            gpu_model=MODEL,
            gpu_count=8 if reserved or i % 2 else 16,
            environment=POOL,
            duration_days=14,
            requester="U0000000001",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=3000)
    parser.add_argument("--reservations", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    now = datetime.now(UTC).replace(microsecond=0)
    found = records(args.leases, args.reservations, now)
    held = sum(int(r.fields[f.GPU_COUNT] or 0) for r in found[: args.leases])  # type: ignore[arg-type]
    capacity = held + 64
    start = now + timedelta(days=20)
    cases = {
        "fits": Booking("team-01", POOL, MODEL, 8, start, start + timedelta(days=3)),
        "refused, nearest window searched": Booking(
            "team-01", POOL, MODEL, 2000, now + timedelta(hours=1), now + timedelta(days=3, hours=1)
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


if __name__ == "__main__":
    main()
