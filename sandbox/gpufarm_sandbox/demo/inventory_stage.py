"""Demo stage "inventory": the scheduled sync reads AWS and Azure besides the agents; a cloud GPU instance without an
agent is reported with its instance id, a throttled source is skipped and reported (in the sync's report and as a
Datadog event) while the others still sync, and the ledger (inventory per environment and model, quota per cloud
region) is printed from the gauges it sent.

Then the measured ledger: Bob holds 8 H100 for an hour while his node's agent reports 6 of them busy, and the
ledger per team, environment and model (entitled, allocated, used, idle) and the team's GPU-hour budget burn are
printed from the gauges and checked against what he holds. The example farm file sets no budget, and earlier stages
may leave vision at its H100 limit, so the step runs on a copy of the farm file with a budget for vision (BUDGET
GPU-hours a month) and room in its H100 quota, on a host of its own (LEDGER_HOST), and puts the original back
afterwards.

The clouds are simulated (gpufarm_sandbox.clouds): EC2 is moto, answered in-process, Azure a stubbed azure-core
transport; gpufarm's own AWS and Azure sources read them through botocore and azure-mgmt-compute as they would
read the clouds, configured by the example farm file's `inventory:` section. The sync runs as the scheduled
function does (QuotaSyncFunction on the local host).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.azurestub import Vm
from gpufarm_sandbox.clouds import clouds_for
from gpufarm_sandbox.demo.farm_copy import changed_farm
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import BOB, HOSTS

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

SUBSCRIPTION = "00000000-0000-4000-8000-000000000001"  # the example farm file's
ENV_TAG = "gpufarm-environment"
# A registered simulated host (its agent's tags are in the sandbox) that is also an EC2 instance, and one that is
# only an instance: its agent was never installed.
REGISTERED = "aws-p5-01"
UNREGISTERED = "aws-p5-spare-01"
AZURE_VM = "nd-h100-eus-01"
# The stage syncs twice within a rollup bucket (every source, then Azure throttled and skipped): the bucket's max is
# what the sync that read every source saw, where the default avg would blend the two.
LEDGER_QUERIES = {
    "total": "max:gpufarm.inventory.gpus.total{*} by {environment,gpu_model}.rollup(max)",
    "free": "max:gpufarm.inventory.gpus.free{*} by {environment,gpu_model}.rollup(max)",
    "down": "max:gpufarm.inventory.gpus.down{*} by {environment,gpu_model}.rollup(max)",
    "no agent": "max:gpufarm.inventory.gpus.no_agent{*} by {environment,gpu_model}.rollup(max)",
}
QUOTA_QUERIES = {
    "limit": "max:gpufarm.cloud.quota.limit{*} by {source,region,family}",
    "used": "max:gpufarm.cloud.quota.used{*} by {source,region,family}",
    "held": "max:gpufarm.cloud.quota.held{*} by {source,region,family}",
}
# The measured ledger per team, environment and model (a team's projects summed), and the budgets' burn.
TEAM_QUERIES = {
    "entitled": "max:gpufarm.quota.entitled{*} by {team,environment,gpu_model}.rollup(max)",
    "allocated": "sum:gpufarm.ledger.gpus.allocated{*} by {team,environment,gpu_model}.rollup(max)",
    "used": "sum:gpufarm.ledger.gpus.used{*} by {team,environment,gpu_model}.rollup(max)",
    "idle": "sum:gpufarm.ledger.gpus.idle{*} by {team,environment,gpu_model}.rollup(max)",
    "unmeasured": "sum:gpufarm.ledger.gpus.unmeasured{*} by {team,environment,gpu_model}.rollup(max)",
}
BUDGET_QUERIES = {
    "budget": "max:gpufarm.budget.gpu_hours{*} by {team,project,period}.rollup(max)",
    "burned": "max:gpufarm.budget.burned{*} by {team,project,period}.rollup(max)",
    "remaining": "min:gpufarm.budget.remaining{*} by {team,project,period}.rollup(min)",
}
# The measured ledger's step: the lease, its own host, vision's budget and its H100 entitlement in the farm's copy.
BUDGET = 100_000
ENTITLED = 32
LEDGER_HOST = ("hpc-b-03", "H100", 8, "onprem-hpc", "hpc-b")
LEASE = "request 8 H100 project=ledger-demo team=vision env=onprem-hpc days=1 purpose=ledger"
PROJECT_QUERIES = {
    name: q.replace("by {team,", "by {team,project,") for name, q in TEAM_QUERIES.items() if name != "entitled"
}
BUSY = 6
# The lease is held a little over an hour (its GPU-hours accrue once an hour), in three steps of the sandbox clock.
STEP_S = 1300
STEPS = 3


def run(ctx: DemoContext) -> None:
    """Put instances in the simulated clouds, sync, throttle Azure, sync again, print the ledger."""
    if ctx.local is None:
        ctx.check(False, "the inventory stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    clouds = clouds_for(ctx.base_url)
    try:
        with ctx.step("GPU instances in AWS (moto) and Azure (stubbed), one registered, two without an agent"):
            farm.seed_hosts(tuple(h for h in HOSTS if h[0] == REGISTERED))
            ids = clouds.aws.launch("us-east-1", "p5.48xlarge", [REGISTERED, UNREGISTERED], {ENV_TAG: "cloud-aws"})
            clouds.aws.reservations["us-east-1"] = [
                {
                    "capacityReservationId": "cr-0demo000000000001",
                    "instanceType": "p5.48xlarge",
                    "totalInstanceCount": 4,
                    "availableInstanceCount": 2,
                    "reservationType": "capacity-block",
                }
            ]
            azure = clouds.azure_farm(SUBSCRIPTION)
            azure.vms = [Vm(AZURE_VM, "Standard_ND96isr_H100_v5", tags={ENV_TAG: "cloud-aws"})]
            azure.limits = {"standardNDSH100v5Family": 192}
            ctx.info(f"EC2 us-east-1: {REGISTERED} = {ids[0]} (registered), {UNREGISTERED} = {ids[1]} (no agent)")
            ctx.info(f"Azure eastus: {AZURE_VM} (ND96isr_H100_v5, no agent)")
        with ctx.step("the scheduled sync reads every source and reports what runs no agent"):
            report = sync(ctx)
            inventory = report.get("inventory", {})
            no_agent = inventory.get("no_agent", [])
            for line in no_agent:
                ctx.info(f"no agent: {line}")
            ctx.check(any(ids[1] in line for line in no_agent), "the EC2 instance without an agent is reported", ids[1])
            ctx.check(not any(ids[0] in line for line in no_agent), "the instance whose host registered is not")
            ctx.check(any("azure:eastus:" in line for line in no_agent), "the Azure VM without an agent is reported")
            ctx.check(
                any(line.startswith("static:hpc-c-01") for line in no_agent),
                "the farm file's static host is reported until it registers",
            )
            ctx.check(
                inventory.get("source_errors") == [], "every source answered", str(inventory.get("source_errors"))
            )
            ctx.info(f"calls per source: {inventory.get('source_calls')}")
        throttled(ctx, farm, azure, ids)
        with ctx.step("the ledger, from the gauges the sync sent"):
            sync(ctx)
            print_ledger(ctx)
        with budgeted_farm(), ctx.step(f"{BOB.name} holds 8 H100 for an hour, {BUSY} busy: the measured ledger"):
            measured_ledger(ctx, farm)
    finally:
        clouds.aws.reservations.clear()
        farm.close()


def throttled(ctx: DemoContext, farm: LocalFarm, azure: Any, ids: list[str]) -> None:
    """Azure answers 429 to everything for one sync: skipped and reported, AWS still read, nothing changed."""
    with ctx.step("Azure throttles every request: it is skipped and reported, AWS still syncs, nothing changes"):
        before = host_tags(farm)
        since = int(ctx.sandbox.clock.now())
        azure.throttle = 1.0
        try:
            report = sync(ctx)
        finally:
            azure.throttle = 0.0
        inventory = report.get("inventory", {})
        errors = inventory.get("source_errors", [])
        for line in errors:
            ctx.info(f"skipped: {line}")
        ctx.check(bool(errors) and all(e.startswith("azure ") for e in errors), "only Azure is skipped")
        ctx.check(any("429" in e for e in errors), "the error says it was throttled (429)")
        ctx.check(any(ids[1] in line for line in inventory.get("no_agent", [])), "AWS is still read")
        ctx.check(host_tags(farm) == before, "no host tag changed because a source was unreachable")
        ctx.check(inventory.get("down") == [], "no host marked down because a source was unreachable")
        events = source_events(ctx, since)
        for event in events[:1]:
            ctx.info(f"Datadog event: {event['title']} [{event['alert_type']}, {event['aggregation_key']}]")
        ctx.check(
            bool(events) and all(e["aggregation_key"] == "gpufarm-inventory-source-azure" for e in events),
            "the skipped source is a Datadog event, grouped by source",
            f"{len(events)} event(s)",
        )


def sync(ctx: DemoContext) -> dict[str, Any]:
    """One scheduled sync on the local host; its report."""
    report: dict[str, Any] = ctx.local.host.invoke("QuotaSyncFunction", {"job": "quota_sync"})
    return report


def host_tags(farm: LocalFarm) -> dict[str, Any]:
    """Every host's tags by source, as the sandbox holds them."""
    hosts: dict[str, Any] = farm.get("/_sandbox/state")["hosts"]["hosts"]
    return {name: h.get("tags_by_source") for name, h in hosts.items()}


def print_ledger(ctx: DemoContext) -> None:
    """Inventory per environment and model, quota per cloud region and family, as the gauges say."""
    pools = _print_pools(ctx)
    ctx.info("")
    quotas = _print_quotas(ctx)
    no_agent = pools["no agent"]
    ctx.check(
        any(
            dict(t.split(":", 1) for t in k).get("environment") == "cloud-aws" and v >= 16 for k, v in no_agent.items()
        ),
        "the ledger counts the cloud GPUs without an agent (8 on EC2, 8 on Azure)",
    )
    limits = quotas["limit"]
    ctx.check(
        any("region:us-east-1" in k and "family:p" in k for k in limits),
        "the EC2 P-family vCPU quota of us-east-1 is published",
    )
    ctx.check(any("source:azure" in k for k in limits), "the Azure family core quota is published")


def _print_pools(ctx: DemoContext) -> dict[str, dict[tuple[str, ...], float]]:
    """The inventory gauges per environment and model, one line each."""
    from gpufarm_sandbox.demo.metrics_stage import _query

    pools = {name: _query(ctx, q, window=600) for name, q in LEDGER_QUERIES.items()}
    keys = sorted({k for values in pools.values() for k in values})
    ctx.info(f"{'environment':<16}{'model':<8}" + "".join(f"{name:>10}" for name in LEDGER_QUERIES))
    for key in keys:
        tags = dict(t.split(":", 1) for t in key)
        cells = "".join(f"{pools[name].get(key, 0):>10.0f}" for name in LEDGER_QUERIES)
        ctx.info(f"{tags.get('environment', '?'):<16}{tags.get('gpu_model', '?'):<8}{cells}")
    return pools


def _print_quotas(ctx: DemoContext) -> dict[str, dict[tuple[str, ...], float]]:
    """The cloud quota gauges per source, region and family, one line each."""
    from gpufarm_sandbox.demo.metrics_stage import _query

    quotas = {name: _query(ctx, q, window=600) for name, q in QUOTA_QUERIES.items()}
    rows = sorted({k for values in quotas.values() for k in values})
    ctx.info(f"{'source':<8}{'region':<12}{'family':<28}" + "".join(f"{name:>8}" for name in QUOTA_QUERIES))
    for key in rows:
        tags = dict(t.split(":", 1) for t in key)
        cells = "".join(f"{quotas[name].get(key, 0):>8.0f}" for name in QUOTA_QUERIES)
        ctx.info(f"{tags.get('source', '?'):<8}{tags.get('region', '?'):<12}{tags.get('family', '?'):<28}{cells}")
    return quotas


def source_events(ctx: DemoContext, since: int) -> list[dict[str, Any]]:
    """The inventory source events in the sandbox's event stream from `since` on, newest first."""
    found: list[dict[str, Any]] = [
        e for e in ctx.sandbox.events.events() if "gpufarm:inventory" in e["tags"] and e["date_happened"] >= since
    ]
    return found[::-1]


def budgeted_farm() -> AbstractContextManager[None]:
    """The local functions read a copy of their farm file: vision with a month's GPU-hour budget and ENTITLED H100
    in onprem-hpc (the original is read again afterwards)."""

    def change(farm: dict[str, Any]) -> None:
        farm["budgets"] = [*farm.get("budgets", []), {"team": "vision", "period": "month", "gpu_hours": BUDGET}]
        quotas = farm["teams"]["vision"].setdefault("quotas", {}).setdefault("onprem-hpc", {})
        quotas["H100"] = {"gpus": ENTITLED, "hard_limit": ENTITLED}

    return changed_farm(change)


def _busy(ir: int, host: str, end: int) -> list[dict[str, Any]]:
    """BUSY busy GPUs of the lease over the STEP_S seconds to `end`, one point a minute, as gpufarm-node sends
    them (sent after the clock moved: the intake takes points up to an hour old)."""
    return [
        {
            "metric": "gpufarm.ir.gpus_busy",
            "type": 3,
            "points": [{"timestamp": t, "value": float(BUSY)} for t in range(end - STEP_S + 60, end + 1, 60)],
            "tags": [f"gpu_ir:ir-{ir}", f"ir:ir-{ir}", "environment:onprem-hpc"],
            "resources": [{"name": host, "type": "host"}],
        }
    ]


def measured_ledger(ctx: DemoContext, farm: LocalFarm) -> None:
    """Hold a lease with busy GPUs for an hour, print the ledger and the budget, check them, release."""
    farm.seed_hosts((LEDGER_HOST,))
    farm.slash(BOB, LEASE)
    farm.settle()
    answers = farm.messages(user=BOB.id, kind="response", contains="/ledger-demo`")
    ir = ir_in(answers[-1]["text"]) if answers else None
    said = farm.messages(user=BOB.id)
    if (
        not ctx.check(ir is not None, "the request has an IR", said[-1]["text"][:200] if said else "no answer")
        or ir is None
    ):
        return
    if not ctx.check(farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED), f"IR-{ir} is allocated"):
        return
    [host, *_] = farm.allocation(ir).hosts
    try:
        for _ in range(STEPS):
            farm.post("/_sandbox/clock", {"advance": STEP_S})
            agentcheck.push(farm.base_url, farm.host.env["DD_API_KEY"], _busy(ir, host, int(ctx.sandbox.clock.now())))
            farm.settle()
        report = sync(ctx)
        ctx.check(bool(report.get("measured")), "the sync measured the busy GPUs")
        print_measured(ctx, ir, host)
    finally:
        farm.slash(BOB, f"release IR-{ir} now")
        farm.settle()


def print_measured(ctx: DemoContext, ir: int, host: str) -> None:
    """Entitled / allocated / used / idle / unmeasured per team, environment and model (allocated is the sum of the
    other three: a lease whose host sent no busy-GPU metrics is unmeasured, never idle); each budget's burn."""
    ctx.info(f"IR-{ir} holds {host}: 8 H100, {BUSY} busy")
    lines = _print_team_lines(ctx)
    ctx.info("")
    budgets, rows = _print_budgets(ctx)
    vision = {"environment:onprem-hpc", "gpu_model:h100", "team:vision"}
    entitled = next((v for k, v in lines["entitled"].items() if set(k) == vision), None)
    ctx.check(entitled == ENTITLED, f"vision's H100 entitlement in onprem-hpc is the farm file's {ENTITLED}")
    _check_project_line(ctx, vision | {"project:ledger-demo"})
    _check_burn(ctx, budgets, rows)


def _check_project_line(ctx: DemoContext, lease: set[str]) -> None:
    from gpufarm_sandbox.demo.metrics_stage import _query

    got = {
        name: next((v for k, v in _query(ctx, q, window=120).items() if set(k) == lease), None)
        for name, q in PROJECT_QUERIES.items()
    }
    ctx.check(
        got == {"allocated": 8, "used": BUSY, "idle": 8 - BUSY, "unmeasured": 0},
        f"vision/ledger-demo's H100 line: allocated 8, used {BUSY}, idle {8 - BUSY}, none unmeasured",
        str(got),
    )


def _print_team_lines(ctx: DemoContext) -> dict[str, dict[tuple[str, ...], float]]:
    """Entitled / allocated / used / idle / unmeasured per team, environment and model, one line each."""
    from gpufarm_sandbox.demo.metrics_stage import _query

    lines = {name: _query(ctx, q, window=120) for name, q in TEAM_QUERIES.items()}
    keys = sorted({k for values in lines.values() for k in values})
    ctx.info(f"{'team':<10}{'environment':<16}{'model':<8}" + "".join(f"{name:>11}" for name in TEAM_QUERIES))
    for key in keys:
        tags = dict(t.split(":", 1) for t in key)
        cells = "".join(f"{lines[name].get(key, 0):>11.0f}" for name in TEAM_QUERIES)
        ctx.info(f"{tags.get('team', '?'):<10}{tags.get('environment', '?'):<16}{tags.get('gpu_model', '?'):<8}{cells}")
    return lines


def _print_budgets(ctx: DemoContext) -> tuple[dict[str, dict[tuple[str, ...], float]], list[tuple[str, ...]]]:
    """Each budget's burn, one line each; the gauges and their rows."""
    from gpufarm_sandbox.demo.metrics_stage import _query

    budgets = {name: _query(ctx, q, window=120) for name, q in BUDGET_QUERIES.items()}
    rows = sorted({k for values in budgets.values() for k in values})
    ctx.info(f"{'budget':<24}{'period':<10}" + "".join(f"{name:>11}" for name in BUDGET_QUERIES))
    for key in rows:
        tags = dict(t.split(":", 1) for t in key)
        label = tags.get("team", "?") + ("" if tags.get("project") == "all" else f"/{tags.get('project')}")
        cells = "".join(f"{budgets[name].get(key, 0):>11.1f}" for name in BUDGET_QUERIES)
        ctx.info(f"{label:<24}{tags.get('period', '?'):<10}{cells}")
    return budgets, rows


def _check_burn(
    ctx: DemoContext, budgets: dict[str, dict[tuple[str, ...], float]], rows: list[tuple[str, ...]]
) -> None:
    team = next((k for k in rows if "team:vision" in k and "project:all" in k), None)
    burned = budgets["burned"].get(team, 0.0) if team else 0.0
    remaining = budgets["remaining"].get(team, 0.0) if team else 0.0
    ctx.check(
        team is not None and burned >= 8 and abs(burned + remaining - BUDGET) < 0.01,
        "vision's month budget burned the hour's GPU-hours (8 GPUs x 1 h at least), the rest remains",
        f"burned {burned:.1f}, remaining {remaining:.1f} of {BUDGET:,}",
    )
