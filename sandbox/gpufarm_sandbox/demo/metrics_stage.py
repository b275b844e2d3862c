"""Demo stage: simulated GPU nodes run the real node agent over the fake NVML and push to the sandbox; the
metrics are read back through datadog-api-client and checked per IR, including two IRs sharing one node.

It uses the allocations an earlier stage left in `ctx.shared["allocations"]` (IR number -> {"hosts": [...],
"host_gpus": {host: GPUs}, ...}) and the hosts' inventory tags in the sandbox; run alone, it makes its own:
a whole H100 node for one IR and an H100 in MIG 7 x 1g.10gb sliced between two IRs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm_sandbox.demo.context import DemoContext

if TYPE_CHECKING:
    from gpufarm_sandbox.simfarm import HostSpec

CYCLES = 3
CYCLE_S = 15.0


@dataclass
class _Plan:
    """Simulated hosts, who gets which devices, and what each IR should show."""

    hosts: list[Any] = field(default_factory=list)
    # (host, IR number, devices, workload profile)
    assignments: list[tuple[str, int, list[int | str], str]] = field(default_factory=list)
    # IR number -> (hosts, devices, profile)
    expected: dict[int, tuple[set[str], int, str]] = field(default_factory=dict)
    # Allocated hosts that could not be simulated (no inventory tags in the sandbox).
    unknown: list[str] = field(default_factory=list)


def run(ctx: DemoContext) -> None:
    """Simulate nodes, assign IRs, run a few agent cycles and check what arrived per IR."""
    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY
    from gpufarm_sandbox.simfarm import simulate_hosts

    plan = _plan(ctx)
    if plan.unknown:
        ctx.check(False, "allocated hosts carry inventory tags", "missing on " + ", ".join(sorted(plan.unknown)))
    clock = ctx.sandbox.clock
    farm = simulate_hosts(
        plan.hosts, ctx.base_url, DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, clock=clock.now, background=False
    )
    try:
        with ctx.step(f"{len(plan.hosts)} simulated nodes run gpufarm-node on fake NVML"):
            for host, ir, devices, profile in plan.assignments:
                farm.assign(host, ir, gpus=devices)
                farm.set_profile(host, profile, gpus=devices)
                ctx.info(f"IR-{ir}: {profile} on {host} devices {', '.join(map(str, devices))}")
            reports = []
            for _ in range(CYCLES):
                reports += farm.step_all()
                clock.advance(CYCLE_S)
            flushed = sum(1 for r in reports if r.flushed)
            ctx.check(flushed == len(reports), "every cycle of every node reached the sandbox", f"{flushed} pushes")
        with ctx.step("Metrics read back per IR through datadog-api-client"):
            _check_irs(ctx, plan)
        _check_shared(ctx, plan)
    finally:
        farm.stop()


def _plan(ctx: DemoContext) -> _Plan:
    plan = _Plan()
    allocations: Mapping[int, Mapping[str, Any]] = ctx.shared.get("allocations") or {}
    next_gpu: dict[str, int] = {}
    specs: dict[str, HostSpec] = {}
    for ir, alloc in sorted(allocations.items()):
        hosts = [str(h) for h in alloc.get("hosts") or []]
        host_gpus: Mapping[str, int] = alloc.get("host_gpus") or {}
        total = sum(
            _assign(ctx, plan, ir=int(ir), host=host, host_gpus=host_gpus, next_gpu=next_gpu, specs=specs)
            for host in hosts
        )
        if total:
            expected_hosts = {h for h, i, _, _ in plan.assignments if i == int(ir)}
            profiles = {p for _, i, _, p in plan.assignments if i == int(ir)}
            plan.expected[int(ir)] = (expected_hosts, total, profiles.pop() if len(profiles) == 1 else "busy")
    plan.hosts = list(specs.values())
    if not plan.expected:
        _standalone(plan)
    return plan


def _assign(
    ctx: DemoContext,
    plan: _Plan,
    *,
    ir: int,
    host: str,
    host_gpus: Mapping[str, int],
    next_gpu: dict[str, int],
    specs: dict[str, HostSpec],
) -> int:
    """The next free GPUs of a host for one lease (as many as it holds there); how many were assigned."""
    from gpufarm_sandbox.simfarm import HostSpec

    inventory = GpuHost.from_tags(host, ctx.sandbox.hosts.tags_for(host))
    if inventory is None:
        plan.unknown.append(host)
        return 0
    specs.setdefault(
        host, HostSpec(host, inventory.environment, inventory.cluster, inventory.gpu_model, inventory.gpu_count)
    )
    first = next_gpu.get(host, 0)
    count = min(int(host_gpus.get(host, inventory.gpu_count) or inventory.gpu_count), inventory.gpu_count - first)
    if count <= 0:
        return 0
    next_gpu[host] = first + count
    # On a shared host the second tenant sits idle with its memory held: the taxonomy tells them apart.
    profile = "busy" if first == 0 else "idle-held"
    plan.assignments.append((host, ir, list(range(first, first + count)), profile))
    return count


def _standalone(plan: _Plan) -> None:
    """The stage's own farm when no earlier stage allocated anything."""
    from gpufarm_sandbox.simfarm import HostSpec

    plan.hosts = [
        HostSpec("gpu-aws-901", "aws-cloud", "aws-us-east-1", "H100", 8),
        # H100 rather than the slicing pool's A100: GPM (Hopper and later) measures a slice's activity, so an
        # idle slice that holds memory shows as idle-held; on A100 it would stay "busy" (not measurable).
        HostSpec("gpu-slc-902", "onprem-slicing", "slicing-a", "H100", 1, "1g.10gb", 7),
    ]
    plan.assignments = [
        ("gpu-aws-901", 9001, list(range(8)), "busy"),
        ("gpu-slc-902", 9002, ["0/0", "0/1", "0/2"], "busy"),
        ("gpu-slc-902", 9003, ["0/3", "0/4"], "idle-held"),
    ]
    plan.expected = {
        9001: ({"gpu-aws-901"}, 8, "busy"),
        9002: ({"gpu-slc-902"}, 3, "busy"),
        9003: ({"gpu-slc-902"}, 2, "idle-held"),
    }


def _query(ctx: DemoContext, query: str, window: float = 2 * CYCLE_S) -> dict[tuple[str, ...], float]:
    """Last value per group of a metrics query over the latest cycle, through the real client (API v1)."""
    from datadog_api_client import ApiClient, Configuration
    from datadog_api_client.v1.api.metrics_api import MetricsApi

    from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY

    configuration: Any = Configuration
    cfg = configuration(host=ctx.base_url)
    cfg.api_key["apiKeyAuth"] = DEFAULT_DD_API_KEY
    cfg.api_key["appKeyAuth"] = DEFAULT_DD_APP_KEY
    now = ctx.sandbox.clock.now()
    metrics_api: Any = MetricsApi  # untyped constructor
    with ApiClient(cfg) as client:
        answer = metrics_api(client).query_metrics(_from=int(now - window), to=int(now), query=query)
    out: dict[tuple[str, ...], float] = {}
    for series in answer.series:
        points = [p.value for p in series.pointlist if p.value[1] is not None]
        if points:
            out[tuple(series.tag_set)] = float(points[-1][1])
    return out


def _check_irs(ctx: DemoContext, plan: _Plan) -> None:
    devices = _query(ctx, "sum:gpufarm.ir.gpus{*} by {gpu_ir}")
    hosts = _query(ctx, "avg:gpufarm.gpu.memory.used{*} by {gpu_ir,host}")
    containers = _query(ctx, "sum:gpufarm.container.memory.used{*} by {gpu_ir,container_id}")
    for ir, (want_hosts, count, profile) in sorted(plan.expected.items()):
        tag = f"gpu_ir:{ir_tag_value(ir)}"
        got = devices.get((tag,))
        ctx.check(got == count, f"IR-{ir}: {count} devices attributed", f"got {got}")
        seen = {h.removeprefix("host:") for g in hosts for h in g if g[0] == tag and h.startswith("host:")}
        ctx.check(seen == want_hosts, f"IR-{ir}: metrics come from its hosts", ", ".join(sorted(seen)))
        held = [v for g, v in containers.items() if g[0] == tag]
        ctx.check(bool(held) and all(v > 0 for v in held), f"IR-{ir}: per-container memory rollup", f"{len(held)} rows")
        state = "idle_held" if profile == "idle-held" else "busy"
        states = _query(ctx, f"sum:gpufarm.ir.gpus_{state}{{{tag}}}")
        ctx.check(states.get(()) == count, f"IR-{ir}: {count} devices {state}", f"got {states.get(())}")


def _check_shared(ctx: DemoContext, plan: _Plan) -> None:
    by_host: dict[str, set[int]] = {}
    for host, ir, _, _ in plan.assignments:
        by_host.setdefault(host, set()).add(ir)
    shared = {h: irs for h, irs in by_host.items() if len(irs) > 1}
    with ctx.step("Two IRs on one shared node, told apart per device"):
        if not shared:
            ctx.check(False, "a node shared by two IRs", "none was allocated")
            return
        for host, irs in sorted(shared.items()):
            groups = _query(ctx, f"sum:gpufarm.ir.gpus{{host:{host}}} by {{gpu_ir}}")
            for ir in sorted(irs):
                want = sum(len(d) for h, i, d, _ in plan.assignments if (h, i) == (host, ir))
                got = groups.get((f"gpu_ir:{ir_tag_value(ir)}",))
                ctx.check(got == want, f"{host}: IR-{ir} holds {want} of its devices", f"got {got}")
            ctx.info(
                "host tags put every IR of a shared host on all its series, so `by {ir}` mixes them there; "
                "`by {gpu_ir}` is the agent's own per-device attribution"
            )
