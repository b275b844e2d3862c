"""Demo stage "reservations": two windows booked on the HPC pool's calendar, an over-quota booking refused with the
nearest free window, both reservations honoured at their start, and the one whose GPUs stay idle released as a
no-show.

In accelerated time on the sandbox clock. The window starts an hour after the last lease earlier stages left in
the pool ends (so the teams' quotas hold over it), and the clock jumps to just before it. Bob (vision) and Alice
(nlp) each book 8 H100 for a day; Alice's second booking in the same window is over her team's quota and is
refused, naming the nearest window that would fit; `/gpu calendar` shows the pool's days. At the start the sweep
allocates both reservations through the allocation step (the pool enforces by Slurm reservation, so the enforcer
follows as for any lease). The simulated nodes run the real agent on fake NVML: Bob's job keeps his GPUs busy,
Alice's never start. When the ledger's accrual covers the no-show window with her GPUs idle and never busy, her
reservation is released (reason no-show) and its hours go back; Bob's stays. Both histories are printed as
`/gpu status` shows them. This stage runs last: its jump ends every lease the earlier stages left.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gpufarm.core.kernel.lifecycle import HOLDING, Phase, ReclaimReason, State
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB, HOSTS

if TYPE_CHECKING:
    from gpufarm.core.kernel.model import Allocation
    from gpufarm_sandbox.demo.context import DemoContext
    from gpufarm_sandbox.simfarm import SimulatedFarm

POOL, MODEL = "onprem-hpc", "H100"
STEP_MIN = 5  # the nodes' cycles after the start, in sandbox minutes
START_LIMIT_MIN = 10  # the sweep runs every minute: both are allocated within this
NO_SHOW_LIMIT_MIN = 150  # the no-show window (30 min) and the ledger's hourly accrual, with room


def run(ctx: DemoContext) -> None:
    """Book, refuse, honour at the start, release the no-show."""
    if ctx.local is None:
        ctx.check(False, "the reservation stage needs the local function host (gpufarm demo starts it)")
        return
    farm = LocalFarm(ctx.base_url, ctx.local.host, ctx.settings)
    nodes: SimulatedFarm | None = None
    try:
        start = _window_start(ctx, farm)
        booked = _book(ctx, farm, start)
        if booked is None:
            return
        honoured, no_show = booked
        nodes = _simulate(ctx)
        if not _started(ctx, farm, nodes, start, (honoured, no_show)):
            return
        _released(ctx, farm, nodes, honoured, no_show)
        for ir in (no_show, honoured):
            _status(ctx, farm, ir)
    finally:
        if nodes is not None:
            nodes.stop()
        farm.close()


def _now(ctx: DemoContext) -> datetime:
    return datetime.fromtimestamp(ctx.sandbox.clock.now(), UTC)


def _window_start(ctx: DemoContext, farm: LocalFarm) -> datetime:
    """An hour after the last live lease of the pool ends (or from now), on the hour."""
    ends = [
        a.expires_at
        for a in farm.incidents()
        if a.state is not State.RESOLVED and a.environment == POOL and a.expires_at is not None
    ]
    after = max([_now(ctx), *ends]) + timedelta(hours=1)
    return after.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def _book(ctx: DemoContext, farm: LocalFarm, start: datetime) -> tuple[int, int] | None:
    window = f"from {start:%Y-%m-%d %H:%M} for 1d"
    irs: list[int] = []
    with ctx.step(f"{BOB.name} and {ALICE.name} each book 8 {MODEL} in {POOL} {window} (UTC)"):
        for person, team, project in ((BOB, "vision", "vit-l"), (ALICE, "nlp", "llm-ko")):
            farm.slash(person, f"reserve 8 {MODEL} env={POOL} project={project} team={team} {window}")
            farm.settle()
            answer = farm.answer(person, "reserved: 8 H100")
            ir = ir_in(answer["text"]) if answer else None
            alloc = farm.allocation(ir) if ir is not None else None
            ctx.check(
                alloc is not None and alloc.phase is Phase.RESERVED and alloc.reserved_from == start,
                f"{person.name}'s booking is an incident in phase reserved, its window in its fields",
                f"IR-{ir}: {alloc.reserved_from:%Y-%m-%d %H:%M} to {alloc.reserved_until:%Y-%m-%d %H:%M}"
                if alloc is not None and alloc.reserved_from and alloc.reserved_until
                else "no IR",
            )
            if ir is not None:
                irs.append(ir)
    with ctx.step(f"{ALICE.name} books 8 more in the same window: over team nlp's quota of 8"):
        farm.slash(ALICE, f"reserve 8 {MODEL} env={POOL} project=llm-ko-eval team=nlp {window}")
        farm.settle()
        refused = farm.answer(ALICE, "[reservation-over-quota]")
        text = refused["text"] if refused else ""
        ctx.check("nearest free window is from" in text, "refused, with the nearest window that would fit", text[:200])
    with ctx.step("/gpu calendar shows the pool's days: capacity, leases, reserved, free"):
        farm.slash(BOB, f"calendar {POOL} {MODEL}")
        farm.settle()
        shown = farm.answer(BOB, f"{POOL} {MODEL}: day (UTC)")
        lines = (shown["text"] if shown else "").splitlines()
        day = f"{start:%Y-%m-%d}"
        row = next((line for line in lines if day in line), "")
        ctx.check(row.split()[-2:-1] == ["16"], f"on {day}, 16 reserved", row.strip())
    return (irs[0], irs[1]) if len(irs) == 2 else None


def _simulate(ctx: DemoContext) -> SimulatedFarm:
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
    from gpufarm_sandbox.simfarm import HostSpec, simulate_hosts

    specs = [HostSpec(name, env, cluster, model, gpus) for name, model, gpus, env, cluster in HOSTS if env == POOL]
    return simulate_hosts(
        specs, ctx.base_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, clock=ctx.sandbox.clock.now, background=False
    )


def _started(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, start: datetime, irs: tuple[int, int]) -> bool:
    honoured, no_show = irs
    with ctx.step("the sandbox clock jumps to the window's start; the sweep allocates both reservations"):
        jump = (start - _now(ctx)).total_seconds() - 120
        ctx.info(f"the clock jumps {jump / 3600:.1f} h; the leases earlier stages left there expire on the way")
        farm.post("/_sandbox/clock", {"advance": jump})
        farm.settle()
        minutes = 0
        while minutes < START_LIMIT_MIN and not all(farm.allocation(ir).phase in HOLDING for ir in irs):
            farm.minute(nodes)
            minutes += 1
        for ir, who in ((honoured, BOB), (no_show, ALICE)):
            alloc = farm.allocation(ir)
            ctx.check(
                alloc.phase is Phase.ALLOCATED and len(alloc.hosts) == 1 and alloc.expires_at == alloc.reserved_until,
                f"IR-{ir} allocated at its start until its window ends",
                f"{', '.join(alloc.hosts)} at {alloc.allocated_at:%H:%M}" if alloc.allocated_at else alloc.phase.value,
            )
            told = farm.messages(user=who.id, kind="dm", contains=f"IR-{ir}")
            ctx.check(bool(told), f"{who.name} is told", told[-1]["text"][:100] if told else "")
        return all(farm.allocation(ir).phase in HOLDING for ir in irs)


def _released(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, honoured: int, no_show: int) -> None:
    kept, idle = farm.allocation(honoured), farm.allocation(no_show)
    with ctx.step(f"{BOB.name}'s job runs; {ALICE.name}'s GPUs stay idle through the no-show window"):
        for host in kept.hosts:
            nodes.assign(host, honoured)
            nodes.set_profile(host, "busy")
        for host in idle.hosts:
            nodes.assign(host, no_show)
            nodes.set_profile(host, "idle")
        minutes = 0
        while minutes < NO_SHOW_LIMIT_MIN and farm.allocation(no_show).state is not State.RESOLVED:
            farm.minute(nodes, STEP_MIN)
            minutes += STEP_MIN
        farm.wait_for(lambda: farm.allocation(no_show).phase is Phase.RECLAIMED, timeout=20)
        gone, stays = farm.allocation(no_show), farm.allocation(honoured)
        ctx.check(
            gone.reclaim_reason is ReclaimReason.NO_SHOW and gone.phase is Phase.RECLAIMED,
            f"IR-{no_show} released as a no-show",
            f"{minutes} min after the start; reason {gone.reclaim_reason.value if gone.reclaim_reason else '-'}",
        )
        line = next((h for h in gone.history if "[no-show]" in h), "")
        ctx.check(bool(line), "its history says why, with the numbers", line[:160])
        ctx.check(
            stays.phase is Phase.ALLOCATED and stays.hours_busy > 0,
            f"IR-{honoured} stays: its GPUs were busy",
            f"{stays.hours_busy:.1f} of {stays.hours_held:.1f} GPU-hours busy",
        )
        freed = gone.gpu_count * max((gone.reserved_until or _now(ctx)) - _now(ctx), timedelta()).total_seconds()
        ctx.info(f"GPU-hours back to the pool: {math.floor(freed / 3600)} (the rest of the window)")


def _status(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step(f"/gpu status IR-{ir}: the reservation's history"):
        farm.slash(BOB if _owner(farm.allocation(ir)) == BOB.id else ALICE, f"status IR-{ir}")
        farm.settle()
        shown = farm.answer(BOB, f"IR-{ir}") or farm.answer(ALICE, f"IR-{ir}")
        text = shown["text"] if shown else ""
        ctx.check("reserved" in text, f"IR-{ir}'s status shows its history", f"{len(text.splitlines())} lines")
        for line in text.splitlines():
            ctx.info(line)


def _owner(alloc: Allocation) -> str:
    return alloc.requester or ""
