"""Demo stage "slicing": two leases on one sliced host, one idle: only that one is warned and reclaimed.

The host is the node package's `a100-mig-slicing` shape (2 x A100, each in MIG 7 x 1g.10gb) running the real
gpufarm-node on fake NVML; its registration publishes the 14 slices as `gpu_unit` tags. The pool's plain A100 host
is taken first (a lease an operator approves), so both of Bob's leases land on the sliced host, each on its own
slice: the allocator records the slice in the incident, tags `gpu_assign:ir-<N>/<mig uuid>` on the host and tells
Bob the MIG UUID and the Kubernetes resource. Bob's serving job runs on one slice with nothing in its environment
(no GPUFARM_IR, no pod): the agent attributes each slice from the host's `gpu_assign` tags alone. The other slice
stays idle. On the sandbox clock the monitors `gpufarm datadog apply` made from the farm's idle policy (per device
on a shared pool) alert for the idle slice only; the idle webhook warns Bob about that lease, nobody keeps it, and
after the grace it is reclaimed: its slice's tag goes and the slice is handed to the next request, while the busy
lease is never warned. No alert is posted by hand. Then a real process squats the busy lease's slice: it is
reported once and, the pool being under stop-after, stopped after its grace (gpufarm_sandbox.demo.squatter_step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm_sandbox.demo import squatter_step
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, actions, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB, DANA, OPERATORS_CHANNEL, SLICED_HOST

if TYPE_CHECKING:
    from gpufarm.core.kernel.model import Allocation
    from gpufarm_sandbox.demo.context import DemoContext
    from gpufarm_sandbox.simfarm import SimulatedFarm

# hostname, environment, cluster, model, GPUs, MIG profile, slices per GPU: the a100-mig-slicing topology.
HOST = SLICED_HOST
SLICES = 14
POOL = "shared-slices"
# Simulated minutes to wait for the warning (start-up grace + window + slack) and for the reclaim (grace + slack).
WARN_LIMIT_MIN = 240
RECLAIM_LIMIT_MIN = 180


def run(ctx: DemoContext) -> None:
    """Two leases on one sliced host, one busy and one idle, followed through the monitors to the reclaim."""
    if ctx.local is None:
        ctx.check(False, "the slicing stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    nodes: SimulatedFarm | None = None
    leases: list[int] = []
    try:
        if not _setup(ctx):
            return
        nodes = _simulate(ctx)
        if not _registered(ctx, farm, nodes):
            return
        filler = _fill_plain_hosts(ctx, farm)
        leases += filler
        pair = _two_leases(ctx, farm, nodes)
        if pair is None:
            return
        leases += pair
        busy, idle = pair
        if not _only_the_idle_one_warned(ctx, farm, nodes, busy, idle):
            return
        leases += _reclaimed(ctx, farm, nodes, busy, idle)
        slot = ctx.shared["slicing_devices"][busy]
        squatter_step.run(ctx, farm, nodes, host=HOST[0], slot=slot, ir=busy)
    finally:
        _release(farm, leases)
        if nodes is not None:
            nodes.stop()
        farm.close()


def _setup(ctx: DemoContext) -> bool:
    from gpufarm_sandbox.localhost.setup import apply_local_setup

    with ctx.step("gpufarm datadog apply: idle monitors judged per device on the shared pool"):
        apply_local_setup(ctx.local)
        listed = ctx.sandbox.monitors.dump()["monitors"]
        ours = [m for m in listed if m["name"].startswith("[gpufarm]") and POOL in m["name"]]
        per_device = [m["name"] for m in ours if "gpu_uuid" in m["query"]]
        return ctx.check(bool(per_device), "monitors grouped by lease, host and device", "; ".join(per_device))


def _simulate(ctx: DemoContext) -> SimulatedFarm:
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
    from gpufarm_sandbox.simfarm import HostSpec, simulate_hosts

    return simulate_hosts(
        [HostSpec(*HOST)],
        ctx.base_url,
        DEFAULT_DD_API_KEY,
        DEFAULT_DD_APP_KEY,
        clock=ctx.sandbox.clock.now,
        background=False,
    )


def _registered(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm) -> bool:
    with ctx.step(f"{HOST[0]} (2 x A100 in MIG 7 x 1g.10gb) runs gpufarm-node, which registers its slices"):
        nodes.step_all()
        units = [t for t in farm.user_tags(HOST[0]) if t.startswith("gpu_unit:")]
        return ctx.check(len(units) == SLICES, f"{SLICES} gpu_unit host tags", units[0] if units else "none")


def _fill_plain_hosts(ctx: DemoContext, farm: LocalFarm) -> list[int]:
    """The pool's A100 hosts without MIG are taken, so Bob's leases must share the sliced one."""
    plain = [h for h in _pool_a100(farm) if h.name != HOST[0]]
    if not plain:
        return []
    irs: list[int] = []
    noun = "host" if len(plain) == 1 else "hosts"
    with ctx.step(f"{ALICE.name} holds the pool's plain A100 {noun} (an operator approves)"):
        for host in plain:
            ir = _hold(ctx, farm, host)
            if ir is not None:
                irs.append(ir)
    return irs


def _hold(ctx: DemoContext, farm: LocalFarm, host: Any) -> int | None:
    """Alice requests the whole host; an operator approves when asked."""
    ir = farm.request_ir(ALICE, f"request {host.gpu_count} A100 project=llm-ko team=nlp env={POOL} days=2")
    asks = [m for m in farm.messages(channel=OPERATORS_CHANNEL) if ir is not None and ir_in(m["text"]) == ir]
    if asks and any(b.get("type") == "actions" for b in asks[-1].get("blocks", [])):
        farm.click(DANA, asks[-1], "gpu_approve")
        farm.settle()
    lease = farm.allocation(ir) if ir is not None else None
    ctx.check(
        lease is not None and lease.phase is Phase.ALLOCATED and lease.hosts == (host.name,),
        f"IR-{ir} holds {host.name}",
        lease.phase.value if lease is not None else "no IR",
    )
    return ir


def _pool_a100(farm: LocalFarm) -> list[Any]:
    from gpufarm.core.context.reads import host_filter
    from gpufarm.core.kernel.hosts import GpuHost

    hosts = [GpuHost.from_tags(i.name, i.tags) for i in farm.gateway.list_hosts(host_filter(POOL))]
    return [h for h in hosts if h is not None and h.gpu_model == "A100"]


def _two_leases(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm) -> tuple[int, int] | None:
    with ctx.step(f"{BOB.name} gets two leases of one slice each; both land on {HOST[0]}, each on its own slice"):
        leases = _request_slices(ctx, farm)
        if leases is None:
            return None
        uuids = _check_slices(ctx, farm, leases)
    if not all(uuids):
        return None
    ctx.shared["slicing_devices"] = {a.ir: nodes_slot(nodes, u) for a, u in zip(leases, uuids, strict=True) if u}
    return leases[0].ir, leases[1].ir


def _request_slices(ctx: DemoContext, farm: LocalFarm) -> list[Allocation] | None:
    """Two one-slice requests, each checked to be allocated on the sliced host; None if one was not."""
    leases: list[Allocation] = []
    for project in ("serving", "notebook"):
        ir = farm.request_ir(BOB, f"request 1 A100 project={project} team=vision env={POOL} days=3")
        lease = farm.allocation(ir) if ir is not None else None
        ctx.check(
            lease is not None and lease.phase is Phase.ALLOCATED and lease.hosts == (HOST[0],),
            f"IR-{ir} ({project}) allocated on {HOST[0]}",
            lease.phase.value if lease is not None else "no IR",
        )
        if lease is None:
            return None
        leases.append(lease)
    return leases


def _check_slices(ctx: DemoContext, farm: LocalFarm, leases: list[Allocation]) -> list[str | None]:
    """Each lease's slice in its incident, its gpu_assign tag and its requester's DM; the slices' uuids."""
    from gpufarm.core.kernel.units import lease_devices

    slices = [lease_devices(a).get(HOST[0], ()) for a in leases]
    uuids = [s[0].uuid if len(s) == 1 else None for s in slices]
    ctx.check(
        all(uuids) and uuids[0] != uuids[1],
        "each lease records its own MIG slice in the incident",
        "; ".join(f"IR-{a.ir}: {', '.join(a.devices)}" for a in leases),
    )
    _check_assign_tags(ctx, farm, leases, uuids)
    _check_slice_dms(ctx, farm, leases, uuids)
    return uuids


def _check_assign_tags(ctx: DemoContext, farm: LocalFarm, leases: list[Allocation], uuids: list[str | None]) -> None:
    tags = farm.user_tags(HOST[0])
    wanted = [f"gpu_assign:ir-{a.ir}/{u}" for a, u in zip(leases, uuids, strict=True)]
    ctx.check(
        all(t in tags for t in wanted) and len([t for t in tags if t.startswith("gpu_assign:")]) == 2,
        f"one gpu_assign tag per lease on {HOST[0]}, next to its ir: tag",
        " ".join(t for t in tags if t.startswith(("gpu_assign:", "ir:"))),
    )


def _check_slice_dms(ctx: DemoContext, farm: LocalFarm, leases: list[Allocation], uuids: list[str | None]) -> None:
    told = [farm.messages(user=BOB.id, kind="dm", contains=f"GPUFARM_IR=IR-{a.ir}") for a in leases]
    texts = [_text(m[-1]) if m else "" for m in told]
    ctx.check(
        all(_dm_names_slice(u, t) for u, t in zip(uuids, texts, strict=True)),
        f"{BOB.name}'s DMs give each slice's MIG UUID (CUDA_VISIBLE_DEVICES) and Kubernetes resource",
        next((line for line in texts[0].splitlines() if "CUDA_VISIBLE_DEVICES" in line), "")[:110].strip(),
    )


def _dm_names_slice(uuid: str | None, text: str) -> bool:
    return uuid is not None and f"MIG-{uuid.removeprefix('mig-')}" in text and "nvidia.com/mig-1g.10gb: 1" in text


def nodes_slot(nodes: SimulatedFarm, uuid: str) -> str:
    """The simulated node's `gpu/slot` of a MIG uuid (as gpufarm's tags spell it)."""
    node = nodes.node(HOST[0])
    for device in node.devices():
        if node.device_uuid(device).lower() == uuid:
            return f"{device[0]}/{device[1]}"
    raise ValueError(f"{uuid} is not a slice of {HOST[0]}")


def _text(message: dict[str, Any]) -> str:
    """A Slack message's text and the text of its sections."""
    parts = [str(message.get("text", ""))]
    parts += [str(b.get("text", {}).get("text", "")) for b in message.get("blocks", []) if b.get("type") == "section"]
    return "\n".join(parts)


def _attributed(nodes: SimulatedFarm, uuid_slot: str) -> set[str]:
    """The gpu_ir values of the agent's last series for one slice."""
    node = nodes.node(HOST[0])
    gpu, slot = (int(x) for x in uuid_slot.split("/"))
    uuid = node.device_uuid((gpu, slot)).lower()
    return {
        t.removeprefix("gpu_ir:")
        for s in node.agent.last_series
        if f"gpu_uuid:{uuid}" in s.tags
        for t in s.tags
        if t.startswith("gpu_ir:")
    }


def _only_the_idle_one_warned(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, busy: int, idle: int) -> bool:
    slots: dict[int, str] = ctx.shared["slicing_devices"]
    warned = False
    with ctx.step(f"IR-{busy}'s job runs with no GPUFARM_IR; IR-{idle}'s slice stays idle until the monitors alert"):
        nodes.set_profile(HOST[0], "busy", gpus=[slots[busy]])
        started = ctx.sandbox.clock.now()
        pushed = farm.minute(nodes)
        _check_attribution(ctx, nodes, slots, busy, idle)
        minutes = 1
        while minutes < WARN_LIMIT_MIN and farm.allocation(idle).phase is not Phase.IDLE_WARNED:
            pushed = farm.minute(nodes) and pushed
            minutes += 1
        farm.wait_for(lambda: farm.allocation(idle).phase is Phase.IDLE_WARNED, timeout=10)
        ctx.check(pushed, "every agent cycle reached the sandbox", f"{minutes} cycles")
        lease = farm.allocation(idle)
        ctx.check(
            lease.phase is Phase.IDLE_WARNED,
            f"the per-device monitor alerted for IR-{idle}'s slice and the idle webhook warned",
            f"{(ctx.sandbox.clock.now() - started) / 60:.0f} min after the allocation",
        )
        _check_idle_alerts(ctx, farm, busy, idle)
        ctx.check(farm.allocation(busy).phase is Phase.ALLOCATED, f"IR-{busy} stays allocated")
        ctx.info("nobody clicks Keep")
        warned = lease.phase is Phase.IDLE_WARNED
    return warned


def _check_attribution(ctx: DemoContext, nodes: SimulatedFarm, slots: dict[int, str], busy: int, idle: int) -> None:
    ctx.check(
        _attributed(nodes, slots[busy]) == {f"ir-{busy}"} and _attributed(nodes, slots[idle]) == {f"ir-{idle}"},
        "the agent attributes each slice from the host's gpu_assign tags",
        f"IR-{busy}'s slice -> gpu_ir:ir-{busy}, IR-{idle}'s -> gpu_ir:ir-{idle}",
    )
    env = [p.env for p in nodes.node(HOST[0]).fake.alive() if (p.gpu, p.mig) == _device(slots[busy])]
    ctx.check(bool(env) and not any("GPUFARM_IR" in e for e in env), "its processes carry no GPUFARM_IR", "")


def _check_idle_alerts(ctx: DemoContext, farm: LocalFarm, busy: int, idle: int) -> None:
    events = farm.get("/_sandbox/monitors/events")["events"]
    fired = [e for e in events if e["notified"] and e["transition"] == "Triggered"]
    ctx.check(
        any(f"ir-{idle}," in e["group"] for e in fired) and not any(f"ir-{busy}," in e["group"] for e in fired),
        "alerts came from gpufarm's own monitors, for the idle slice only",
        "; ".join(sorted({e["group"] for e in fired if HOST[0] in e["group"]}))[:110],
    )
    warnings = [m for m in farm.messages(user=BOB.id, kind="dm") if "gpu_keep" in actions(m)]
    ctx.check(
        bool(warnings) and all(ir_in(m["text"]) == idle for m in warnings),
        f"{BOB.name} is warned about IR-{idle} only, with Keep / Release",
        warnings[-1]["text"][:110] if warnings else "no DM",
    )


def _device(slot: str) -> tuple[int, int]:
    gpu, mig = slot.split("/")
    return int(gpu), int(mig)


def _reclaimed(ctx: DemoContext, farm: LocalFarm, nodes: SimulatedFarm, busy: int, idle: int) -> list[int]:
    from gpufarm.core.kernel.units import lease_devices

    slots: dict[int, str] = ctx.shared["slicing_devices"]
    idle_uuid = nodes.node(HOST[0]).device_uuid(_device(slots[idle])).lower()
    busy_uuid = nodes.node(HOST[0]).device_uuid(_device(slots[busy])).lower()
    again: list[int] = []
    with ctx.step(f"Past the grace: IR-{idle} is reclaimed, its slice back in the pool; IR-{busy} untouched"):
        minutes = 0
        while minutes < RECLAIM_LIMIT_MIN and farm.allocation(idle).phase is not Phase.RECLAIMED:
            farm.minute(nodes)
            minutes += 1
        lease = farm.allocation(idle)
        ctx.check(
            lease.phase is Phase.RECLAIMED and lease.reclaim_reason is ReclaimReason.IDLE,
            "phase reclaimed, reason idle",
            f"{minutes} min after the warning",
        )
        ctx.check(not lease.devices and not lease.hosts, "its incident no longer records the slice", "")
        tags = farm.user_tags(HOST[0])
        ctx.check(
            f"gpu_assign:ir-{idle}/{idle_uuid}" not in tags
            and f"ir:ir-{idle}" not in tags
            and f"gpu_assign:ir-{busy}/{busy_uuid}" in tags,
            f"its gpu_assign and ir: tags are gone from {HOST[0]}; IR-{busy}'s stay",
            " ".join(t for t in tags if t.startswith(("gpu_assign:", "ir:"))),
        )
        kept = farm.allocation(busy)
        ctx.check(
            kept.phase is Phase.ALLOCATED and kept.idle_warned_at is None,
            f"IR-{busy} was never warned and still holds its slice",
            ", ".join(kept.devices),
        )
        ir = farm.request_ir(BOB, f"request 1 A100 project=notebook team=vision env={POOL} days=1")
        if ir is not None:
            again.append(ir)
        fresh = farm.allocation(ir) if ir is not None else None
        got = [u.uuid for u in lease_devices(fresh).get(HOST[0], ())] if fresh is not None else []
        ctx.check(got == [idle_uuid], f"the next request (IR-{ir}) gets the freed slice", ", ".join(map(str, got)))
        hours = _slice_hours(lease)
        ctx.shared["slicing_gpu_hours_reclaimed"] = hours
        ctx.info(f"the idle slice came back {hours:.0f} slice-hours before IR-{idle}'s expiry")
    return again


def _slice_hours(lease: Allocation) -> float:
    """Slice-hours from the reclaim to the lease's expiry (what the idle slice would have held)."""
    if lease.expires_at is None or lease.modified is None:
        return 0.0
    return max(0.0, (lease.expires_at - lease.modified).total_seconds() / 3600) * max(1, lease.gpu_count)


def _release(farm: LocalFarm, irs: list[int]) -> None:
    """The stage's leases go back, so later stages find the pool as it was."""
    owners = {ALICE.id: ALICE, BOB.id: BOB}
    live = (Phase.ALLOCATED, Phase.IDLE_WARNED, Phase.WAITING, Phase.APPROVED, Phase.REQUESTED)
    for lease in farm.incidents():
        person = owners.get(lease.requester or "")
        if lease.ir in irs and person is not None and lease.phase in live:
            farm.slash(person, f"release IR-{lease.ir} now")
    farm.settle()
