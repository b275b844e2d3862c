"""Demo stage "idle": an idle lease is warned and reclaimed for a waiting request, a lease expires, and a two-host
lease half idle loses its idle host.

Driven only by the node agent's metrics through the monitors `gpufarm datadog apply` creates from the farm's idle
policy; no alert is posted by hand. The cloud pool's one A100 host goes to a lease whose job runs, then stops (the
simulated node runs the real gpufarm-node on fake NVML, its fake processes gone); a second request for that host
waits. On the sandbox clock the monitors see the idle host after the window, the idle webhook warns the requester
with Keep / Release, nobody keeps it, and after the grace the lease is reclaimed (reason idle) and the waiting
request gets the host. That lease then runs past its expiry and the scheduled sync reclaims it (reason expired).
Then a 16-GPU lease on two HPC hosts keeps one host busy while the other's job stops: only the idle host alerts,
it is warned on its own, and past the grace it is given back (idle.partial: reclaim) while the lease stays open on
its busy host, which keeps its tag. The GPU-hours each reclaim frees until the lease's expiry are printed from the
incident fields.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, actions, ir_in
from gpufarm_sandbox.example_farm import ALICE, CAROL, DANA, HOSTS, OPERATORS_CHANNEL

if TYPE_CHECKING:
    from gpufarm.core.kernel.model import Allocation
    from gpufarm_sandbox.demo.context import DemoContext
    from gpufarm_sandbox.simfarm import SimulatedFarm

HOST = ("aws-p4d-01", "cloud-aws", "aws-use1", "A100", 8)
# The half-idle lease is followed in coarser steps (16 GPUs per cycle): the monitors' windows hold a dozen points.
HALF_STEP_MIN = 5
BUSY_MINUTES = 10  # the job runs this long after the allocation, then stops
# Simulated minutes to wait for the warning (start-up grace + window + slack) and for the reclaim (grace + slack).
WARN_LIMIT_MIN = 240
RECLAIM_LIMIT_MIN = 180


def run(ctx: DemoContext) -> None:
    """Fill the cloud A100 pool, let its lease go idle, and follow the warning, the reclaim and an expiry."""
    if ctx.local is None:
        ctx.check(False, "the idle stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.adapters.aws import load_farm_text
    from gpufarm.config import Settings
    from gpufarm.core.config.farm import parse_farm

    settings = Settings()
    grace_minutes = parse_farm(load_farm_text(settings)).idle.grace_minutes
    farm = LocalFarm(ctx.base_url, ctx.local.host, settings)
    nodes: SimulatedFarm | None = None
    try:
        if not _setup(ctx):
            return
        irs = _fill_pool(ctx, farm)
        if irs is None:
            return
        idle_ir, waiting_ir = irs
        nodes = _simulate(ctx)
        if not _warned(ctx, farm, nodes, idle_ir):
            return
        if not _reclaimed(ctx, farm, nodes, (idle_ir, waiting_ir), grace_minutes):
            return
        _expired(ctx, farm, nodes, waiting_ir)
        nodes.stop()
        nodes = None
        _half_idle(ctx, farm, grace_minutes)
        hours = ctx.shared.get("idle_gpu_hours_reclaimed", 0.0) + ctx.shared.get("partial_gpu_hours_reclaimed", 0.0)
        ctx.info(f"GPU-hours reclaimed in this stage: {hours:.0f} (whole lease and partial)")
    finally:
        if nodes is not None:
            nodes.stop()
        farm.close()


def _setup(ctx: DemoContext) -> bool:
    from gpufarm_sandbox.localhost.setup import apply_local_setup

    ok = False
    with ctx.step("gpufarm datadog apply with the farm's idle policy: the idle monitors"):
        setup = apply_local_setup(ctx.local)
        monitors = setup.counts("monitor") if setup.plan is not None else {}
        listed = ctx.sandbox.monitors.dump()["monitors"]
        names = sorted({m["name"].split(" (")[0] for m in listed if m["name"].startswith("[gpufarm]")})
        ok = ctx.check(
            bool(names), "monitors made from the farm YAML", ", ".join(f"{n} {a}" for a, n in monitors.items() if n)
        )
        ctx.info("; ".join(names))
    return ok


def _fill_pool(ctx: DemoContext, farm: LocalFarm) -> tuple[int, int] | None:
    idle_ir = waiting_ir = None
    lease = waiting = None
    with ctx.step(f"{CAROL.name} takes the cloud pool's only A100 host; {ALICE.name}'s request for it waits"):
        idle_ir = farm.request_ir(CAROL, "request 8 A100 project=tts team=speech env=cloud-aws days=7 purpose=finetune")
        lease = farm.allocation(idle_ir) if idle_ir is not None else None
        ctx.check(
            lease is not None and lease.phase is Phase.ALLOCATED and lease.hosts == (HOST[0],),
            f"{CAROL.name}'s lease holds {HOST[0]}",
            f"IR-{idle_ir}" if idle_ir is not None else "no IR",
        )
        waiting_ir = farm.request_ir(ALICE, "request 8 A100 project=llm-ko team=nlp env=cloud-aws days=1 purpose=eval")
        waiting = farm.allocation(waiting_ir) if waiting_ir is not None else None
        ctx.check(
            waiting is not None and waiting.phase is Phase.WAITING,
            f"{ALICE.name}'s request waits for a host",
            f"IR-{waiting_ir} {waiting.phase.value}" if waiting is not None else "no IR",
        )
    if idle_ir is None or waiting_ir is None or lease is None or waiting is None:
        return None
    return idle_ir, waiting_ir


def _simulate(ctx: DemoContext, hosts: list[Any] | None = None) -> SimulatedFarm:
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
    from gpufarm_sandbox.simfarm import HostSpec, simulate_hosts

    return simulate_hosts(
        hosts or [HostSpec(*HOST)],
        ctx.base_url,
        DEFAULT_DD_API_KEY,
        DEFAULT_DD_APP_KEY,
        clock=ctx.sandbox.clock.now,
        background=False,
    )


def _warned(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, ir: int) -> bool:
    warned = False
    with ctx.step(f"IR-{ir}'s job stops; the agent reports its 8 GPUs idle until the monitors alert"):
        nodes.assign(HOST[0], ir)
        nodes.set_profile(HOST[0], "busy")
        started = ctx.sandbox.clock.now()
        pushed = True
        minutes = 0
        while minutes < WARN_LIMIT_MIN and farm.allocation(ir).phase is not Phase.IDLE_WARNED:
            if minutes == BUSY_MINUTES:
                nodes.set_profile(HOST[0], "idle")
            pushed = farm.minute(nodes) and pushed
            minutes += 1
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.IDLE_WARNED, timeout=10)
        lease = farm.allocation(ir)
        ctx.check(pushed, "every agent cycle reached the sandbox", f"{minutes} cycles")
        ctx.check(
            lease.phase is Phase.IDLE_WARNED,
            "the idle monitors alerted and the idle webhook warned",
            f"{(ctx.sandbox.clock.now() - started) / 60:.0f} min after allocation, "
            f"{minutes - BUSY_MINUTES} min after the job stopped",
        )
        fired = sorted(
            {
                e["monitor_name"].split(" (")[0]
                for e in farm.get("/_sandbox/monitors/events")["events"]
                if e["notified"] and e["transition"] == "Triggered" and f"ir-{ir}," in e["group"]
            }
        )
        ctx.check(bool(fired), "alerts came from gpufarm's own monitors", "; ".join(fired))
        # The warning is the DM about this IR that carries the Keep button (its wording is the views' business).
        dms = [
            m for m in farm.messages(user=CAROL.id, kind="dm") if ir_in(m["text"]) == ir and "gpu_keep" in actions(m)
        ]
        buttons = actions(dms[-1]) if dms else set()
        ctx.check(
            bool(dms) and {"gpu_keep", "gpu_release"} <= buttons,
            f"{CAROL.name} is warned in a DM with Keep / Release",
            dms[-1]["text"][:110] if dms else "no DM",
        )
        ctx.info("nobody clicks Keep")
        warned = lease.phase is Phase.IDLE_WARNED
    return warned


def _reclaimed(
    ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, irs: tuple[int, int], grace_minutes: int
) -> bool:
    ir, waiting_ir = irs
    reclaimed = False
    with ctx.step(f"Past the {grace_minutes}-minute grace: IR-{ir} is reclaimed and IR-{waiting_ir} gets its host"):
        minutes = 0
        while minutes < RECLAIM_LIMIT_MIN and farm.allocation(ir).phase is not Phase.RECLAIMED:
            farm.minute(nodes)
            minutes += 1
        farm.wait_for(lambda: farm.allocation(waiting_ir).phase is Phase.ALLOCATED, timeout=20)
        lease = farm.allocation(ir)
        ctx.check(
            lease.phase is Phase.RECLAIMED and lease.reclaim_reason is ReclaimReason.IDLE,
            "phase reclaimed, reason idle",
            f"{minutes} min after the warning",
        )
        now_on_host = farm.ir_tags(HOST[0])
        ctx.check(
            f"ir:ir-{ir}" not in now_on_host, f"IR-{ir}'s tags are gone from {HOST[0]}", "now " + " ".join(now_on_host)
        )
        waiting = farm.allocation(waiting_ir)
        ctx.check(
            waiting.phase is Phase.ALLOCATED and waiting.hosts == (HOST[0],),
            f"the waiting IR-{waiting_ir} is allocated {HOST[0]}",
            waiting.phase.value,
        )
        told = farm.messages(user=ALICE.id, kind="dm", contains=f"GPUFARM_IR=IR-{waiting_ir}")
        ctx.check(
            bool(told) and HOST[0] in json.dumps(told[-1]),
            f"{ALICE.name}'s DM names her host",
            told[-1]["text"][:110] if told else "no DM",
        )
        _gpu_hours(ctx, lease.gpu_count, lease.idle_warned_at, lease.expires_at, grace_minutes)
        reclaimed = lease.phase is Phase.RECLAIMED
    return reclaimed


def _gpu_hours(
    ctx: DemoContext, gpus: int, warned: datetime | None, expires: datetime | None, grace_minutes: int
) -> None:
    """GPUs x hours from the reclaim (warning + grace) to the lease's expiry, from the incident's fields."""
    if warned is None or expires is None:
        ctx.check(False, "the reclaimed lease records its warning and expiry", f"warned={warned} expires={expires}")
        return
    reclaimed = warned + timedelta(minutes=grace_minutes)
    hours = max(0.0, (expires - reclaimed).total_seconds() / 3600)
    ctx.check(hours > 0, "GPU-hours reclaimed", f"{gpus} GPUs x {hours:.1f} h = {gpus * hours:.0f} GPU-hours")
    ctx.shared["idle_gpu_hours_reclaimed"] = gpus * hours


def _expired(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, ir: int) -> None:
    with ctx.step(f"IR-{ir} runs past its expiry; the scheduled sync reclaims it"):
        nodes.assign(HOST[0], ir)
        nodes.set_profile(HOST[0], "busy")
        farm.minute(nodes)
        lease = farm.allocation(ir)
        if lease.expires_at is None:
            ctx.check(False, "the lease has an expiry", "expires_at is empty")
            return
        now = datetime.fromtimestamp(ctx.sandbox.clock.now(), UTC)
        # Past the expiry by one sync period (rate(15 minutes)) and a minute, so a sync tick falls after it.
        jump = (lease.expires_at - now).total_seconds() + 16 * 60
        ctx.info(f"expires {lease.expires_at:%Y-%m-%d %H:%M} UTC; the sandbox clock jumps {jump / 3600:.1f} h")
        farm.post("/_sandbox/clock", {"advance": jump})
        farm.settle()
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED, timeout=20)
        lease = farm.allocation(ir)
        ctx.check(
            lease.phase is Phase.RECLAIMED and lease.reclaim_reason is ReclaimReason.EXPIRED,
            "phase reclaimed, reason expired",
            f"{lease.phase.value}, {lease.reclaim_reason.value if lease.reclaim_reason else '-'}",
        )
        leftover = [t for t in farm.user_tags(HOST[0]) if t == f"ir:ir-{ir}"]
        ctx.check(not leftover, f"its tags are gone from {HOST[0]}", " ".join(leftover))
        told = farm.messages(user=ALICE.id, kind="dm", contains=f"IR-{ir}")
        ctx.check(
            bool(told) and "reclaimed" in told[-1]["text"],
            f"{ALICE.name} is told",
            told[-1]["text"][:110] if told else "",
        )


def _half_idle(ctx: DemoContext, farm: LocalFarm, grace_minutes: int) -> None:
    """A two-host lease whose second host goes idle: warned for that host, which then leaves the lease."""
    lease = None
    with ctx.step(f"{ALICE.name} gets 16 H100 on two HPC hosts (beyond quota: {DANA.name} approves)"):
        ir = farm.request_ir(ALICE, "request 16 H100 project=llm-ko team=nlp env=onprem-hpc days=7 purpose=pretraining")
        asked = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir} needs approval") if ir else []
        if asked:
            farm.click(DANA, asked[-1], "gpu_approve")
            farm.settle()
        lease = farm.allocation(ir) if ir is not None else None
        ctx.check(
            lease is not None and lease.phase is Phase.ALLOCATED and len(lease.hosts) == 2,
            f"{ALICE.name}'s lease holds two hosts",
            f"IR-{ir} {lease.phase.value} on {', '.join(lease.hosts)}" if lease is not None else "no IR",
        )
    if lease is None or lease.phase is not Phase.ALLOCATED or len(lease.hosts) != 2:
        return
    busy_host, idle_host = sorted(lease.hosts)
    nodes = _simulate(ctx, [_spec(busy_host), _spec(idle_host)])
    try:
        for host in (busy_host, idle_host):
            nodes.assign(host, lease.ir)
            nodes.set_profile(host, "busy")
        if _half_warned(ctx, farm, nodes, lease.ir, idle_host):
            _half_reclaimed(ctx, farm, nodes, (lease.ir, idle_host, busy_host), grace_minutes)
    finally:
        nodes.stop()
        # The stages after this one find the HPC pool and the team's quota as they were.
        farm.slash(ALICE, f"release IR-{lease.ir} now")
        farm.settle()


def _spec(host: str) -> Any:
    from gpufarm_sandbox.simfarm import HostSpec

    name, model, gpus, env, cluster = next(h for h in HOSTS if h[0] == host)
    return HostSpec(name, env, cluster, model, gpus)


def _half_warned(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, ir: int, idle_host: str) -> bool:
    with ctx.step(f"The job on {idle_host} stops, the other host keeps training: only {idle_host} alerts"):
        started = ctx.sandbox.clock.now()
        minutes = 0
        while minutes < WARN_LIMIT_MIN and farm.allocation(ir).phase is not Phase.IDLE_WARNED:
            if minutes >= BUSY_MINUTES:
                nodes.set_profile(idle_host, "idle")
            farm.minute(nodes, HALF_STEP_MIN)
            minutes += HALF_STEP_MIN
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.IDLE_WARNED, timeout=10)
        lease = farm.allocation(ir)
        ctx.check(
            lease.phase is Phase.IDLE_WARNED and [p.split("=")[0] for p in lease.idle_parts] == [idle_host],
            f"warned for {idle_host} alone (the lease's idle state names that host)",
            f"{(ctx.sandbox.clock.now() - started) / 60:.0f} min after allocation; " + " ".join(lease.idle_parts),
        )
        groups = {
            e["group"]
            for e in farm.get("/_sandbox/monitors/events")["events"]
            if e["notified"] and e["transition"] == "Triggered" and f"ir-{ir}," in e["group"]
        }
        ctx.check(
            bool(groups) and all(f"host:{idle_host}" in g for g in groups),
            "gpufarm's monitors alerted on the idle host's group only",
            "; ".join(sorted(groups)),
        )
        dms = farm.messages(user=ALICE.id, kind="dm", contains=f"part of IR-{ir} is idle")
        ctx.check(
            bool(dms) and idle_host in json.dumps(dms[-1]),
            f"{ALICE.name} is told {idle_host} goes back unless kept",
            dms[-1]["text"][:110] if dms else "no DM",
        )
        return lease.phase is Phase.IDLE_WARNED


def _check_told_half(ctx: DemoContext, farm: LocalFarm, ir: int, idle_host: str, busy_host: str) -> None:
    told = farm.messages(user=ALICE.id, kind="dm", contains=f"IR-{ir} gave back")
    ops = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir} gave back")
    ctx.check(
        bool(told) and bool(ops) and idle_host in told[-1]["text"] and busy_host in told[-1]["text"],
        f"{ALICE.name} and the operators are told which host went and what the lease keeps",
        told[-1]["text"][:120] if told else "no DM",
    )


def _count_reclaimed_hours(ctx: DemoContext, lease: Allocation, idle_host: str) -> None:
    """The GPU-hours the returned host frees until the lease's end, from the record the lease keeps of it."""
    returned = [r for r in lease.idle_returned if r.startswith(f"{idle_host}=")]
    if not returned or lease.expires_at is None:
        ctx.check(False, "the lease records the host it gave back", " ".join(lease.idle_returned))
        return
    gpus, _, at = returned[-1].partition("=")[2].partition("@")
    when = datetime.fromisoformat(at.replace("Z", "+00:00"))
    hours = max(0.0, (lease.expires_at - when).total_seconds() / 3600)
    ctx.check(
        hours > 0,
        "GPU-hours reclaimed from the idle half",
        f"{gpus} GPUs x {hours:.1f} h = {int(gpus) * hours:.0f} GPU-hours",
    )
    ctx.shared["partial_gpu_hours_reclaimed"] = int(gpus) * hours


def _half_reclaimed(
    ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, lease_hosts: tuple[int, str, str], grace_minutes: int
) -> None:
    ir, idle_host, busy_host = lease_hosts
    with ctx.step(f"Past the {grace_minutes}-minute grace: {idle_host} leaves IR-{ir}, {busy_host} stays"):
        minutes = 0
        while minutes < RECLAIM_LIMIT_MIN and idle_host in farm.allocation(ir).hosts:
            farm.minute(nodes, HALF_STEP_MIN)
            minutes += HALF_STEP_MIN
        lease = farm.allocation(ir)
        ctx.check(
            lease.phase is Phase.ALLOCATED
            and lease.hosts == (busy_host,)
            and lease.host_gpus == {busy_host: 8}
            and lease.gpu_count == 8,
            f"the lease stays open with {busy_host}: hosts, GPUs per host and GPU count shrank",
            f"{minutes} min after the warning; {lease.phase.value}, {lease.gpu_count} GPUs on {', '.join(lease.hosts)}",
        )
        ctx.check(
            f"ir:ir-{ir}" not in farm.ir_tags(idle_host) and f"ir:ir-{ir}" in farm.ir_tags(busy_host),
            f"{idle_host} lost the lease's tag; {busy_host} keeps it",
            f"{idle_host}: {' '.join(farm.ir_tags(idle_host)) or 'no ir tag'}; "
            f"{busy_host}: {' '.join(farm.ir_tags(busy_host))}",
        )
        _check_told_half(ctx, farm, ir, idle_host, busy_host)
        # Still idle there, the monitors keep alerting for a host the lease no longer holds: nothing else changes.
        for _ in range(3):
            farm.minute(nodes, HALF_STEP_MIN)
        after = farm.allocation(ir)
        ctx.check(
            after.hosts == (busy_host,) and after.gpu_count == 8 and after.phase is Phase.ALLOCATED,
            "later alerts for the returned host change nothing",
            f"{after.phase.value}, {after.gpu_count} GPUs",
        )
        _count_reclaimed_hours(ctx, lease, idle_host)
