"""Demo stage "inventory": the scheduled sync reads AWS and Azure besides the agents; a cloud GPU instance without an
agent is reported with its instance id, a throttled source is skipped and reported while the others still sync,
and the ledger (inventory per environment and model, quota per cloud region) is printed from the gauges it sent.

The clouds are simulated (gpufarm_sandbox.clouds): EC2 is moto, answered in-process, Azure a stubbed azure-core
transport; gpufarm's own AWS and Azure sources read them through botocore and azure-mgmt-compute as they would
read the clouds, configured by the example farm file's `inventory:` section. The sync runs as the scheduled
function does (QuotaSyncFunction on the local host).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.azurestub import Vm
from gpufarm_sandbox.clouds import clouds_for
from gpufarm_sandbox.demo.lifecycle_stage import HOSTS, LocalFarm

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
        with ctx.step("Azure throttles every request: it is skipped and reported, AWS still syncs, nothing changes"):
            before = host_tags(farm)
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
        with ctx.step("the ledger, from the gauges the sync sent"):
            sync(ctx)
            print_ledger(ctx)
    finally:
        clouds.aws.reservations.clear()
        farm.close()


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
    from gpufarm_sandbox.demo.metrics_stage import _query

    pools = {name: _query(ctx, q, window=600) for name, q in LEDGER_QUERIES.items()}
    keys = sorted({k for values in pools.values() for k in values})
    ctx.info(f"{'environment':<16}{'model':<8}" + "".join(f"{name:>10}" for name in LEDGER_QUERIES))
    for key in keys:
        tags = dict(t.split(":", 1) for t in key)
        cells = "".join(f"{pools[name].get(key, 0):>10.0f}" for name in LEDGER_QUERIES)
        ctx.info(f"{tags.get('environment', '?'):<16}{tags.get('gpu_model', '?'):<8}{cells}")
    quotas = {name: _query(ctx, q, window=600) for name, q in QUOTA_QUERIES.items()}
    rows = sorted({k for values in quotas.values() for k in values})
    ctx.info("")
    ctx.info(f"{'source':<8}{'region':<12}{'family':<28}" + "".join(f"{name:>8}" for name in QUOTA_QUERIES))
    for key in rows:
        tags = dict(t.split(":", 1) for t in key)
        cells = "".join(f"{quotas[name].get(key, 0):>8.0f}" for name in QUOTA_QUERIES)
        ctx.info(f"{tags.get('source', '?'):<8}{tags.get('region', '?'):<12}{tags.get('family', '?'):<28}{cells}")
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
