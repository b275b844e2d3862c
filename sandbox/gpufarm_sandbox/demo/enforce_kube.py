"""The enforcement stage's Kubernetes half: a lease on cloud-aws (`enforce: kubernetes`, an EKS node group) labels and
taints its host's Node, and its end cleans both.

The Node is served by the sandbox (`/_sandbox/kubernetes`, the few Node endpoints, its answers held to the kubernetes
client's OpenAPI models by the contract tests); the node agent's own Kubernetes step (gpufarm_node.enforce.kube)
drives the official client against it, fed by the host's tags read from the local Datadog as the agent reads them
every cycle. alice asks for 8 H100 on cloud-aws; her DM gives the toleration and node selector; the step labels the
Node `gpufarm.io/ir=ir-<n>` and taints it `gpufarm.io/lease=ir-<n>:NoSchedule` beside the node's own taint; she
releases the lease and the step removes both, leaving the node's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_node.datadog import DatadogTarget, api_client
from gpufarm_node.enforce.kube import KubernetesNodeApi, NodeMarker
from gpufarm_node.enforce.kube_plan import LABEL, TAINT
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN
from gpufarm_sandbox.example_farm import ALICE

if TYPE_CHECKING:
    from gpufarm.config import Settings
    from gpufarm_sandbox.demo.context import DemoContext

POOL = "cloud-aws"
# The node's own taint, which gpufarm leaves alone.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def play(ctx: DemoContext, farm: LocalFarm, settings: Settings) -> None:
    """Allocate on the Kubernetes pool, mark the Node, release, clean it."""
    ir = _allocate(ctx, farm)
    if ir is None:
        return
    host = farm.allocation(ir).hosts[0]
    server = ctx.base_url.rstrip("/") + PREFIX
    api = KubernetesNodeApi(host=server, token=TOKEN)
    _register(server, host)
    api_key = settings.datadog_api_key.get_secret_value() if settings.datadog_api_key else ""
    app_key = settings.datadog_app_key.get_secret_value() if settings.datadog_app_key else None
    client = api_client(DatadogTarget(settings.datadog_base_url(), api_key, app_key))
    watch = HostTagWatch.from_client(client, host)
    marker = NodeMarker(api, host, cluster_tag="aws-use1")
    try:
        with ctx.step(f"gpufarm-node on {host} (--enforce kubernetes): one cycle's tags, one Kubernetes step"):
            _cycle(ctx, watch, marker)
            labels, taints = _show(ctx, api, host)
            ours = {"key": TAINT, "value": f"ir-{ir}", "effect": "NoSchedule"}
            ctx.check(labels.get(LABEL) == f"ir-{ir}", f"Node {host} is labelled {LABEL}=ir-{ir}")
            ctx.check(taints == [GPU_TAINT, ours], f"Node {host} is tainted {TAINT}=ir-{ir}:NoSchedule beside its own")
        with ctx.step(f"alice releases IR-{ir}; the next step cleans {host}"):
            farm.slash(ALICE, f"release IR-{ir} now")
            farm.settle()
            ended = farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED)
            ctx.check(ended, f"IR-{ir} is reclaimed in Datadog")
            _cycle(ctx, watch, marker)
            labels, taints = _show(ctx, api, host)
            ctx.check(
                LABEL not in labels and taints == [GPU_TAINT], f"label and taint are gone; {host}'s own taint stays"
            )
    finally:
        watch.close()
        client.close()


def _allocate(ctx: DemoContext, farm: LocalFarm) -> int | None:
    allocated: int | None = None
    with ctx.step(f"alice: /gpu request 8 H100 env={POOL} (a pool with enforce: kubernetes)"):
        farm.slash(ALICE, f"request 8 H100 project=k8s-demo team=nlp env={POOL} days=3")
        farm.settle()
        ir = ir_in(shown(farm.answer(ALICE, "/k8s-demo`")))
        if ir is None:
            ctx.check(False, "alice's request got an IR")
            return None
        lease: int = ir
        ok = farm.wait_for(lambda: farm.allocation(lease).phase is Phase.ALLOCATED)
        if not ctx.check(ok, f"IR-{ir} is allocated in Datadog", ", ".join(farm.allocation(ir).hosts)):
            return None
        dm = farm.messages(user=ALICE.id, kind="dm", contains=f"value: ir-{ir}")
        ctx.check(bool(dm), "the allocation DM gives the toleration and node selector", f"{TAINT}=ir-{ir}")
        allocated = ir
    return allocated


def _register(server: str, host: str) -> None:
    """The host's Node as the cluster registered it, with its GPU taint (once: a rerun finds it)."""
    from kubernetes import client

    configuration = client.Configuration(host=server)
    configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
    with client.ApiClient(configuration) as http:
        core = client.CoreV1Api(http)
        node = client.V1Node(
            metadata=client.V1ObjectMeta(name=host, labels={"node.kubernetes.io/instance-type": "p5.48xlarge"}),
            spec=client.V1NodeSpec(taints=[client.V1Taint(**GPU_TAINT)]),
        )
        try:
            core.create_node(node)
        except client.ApiException as exc:
            if exc.status != 409:
                raise


def _cycle(ctx: DemoContext, watch: HostTagWatch, marker: NodeMarker) -> None:
    """What the agent does each cycle (read the host's tags, hand the lease to the step) and one step."""
    watch.poll()
    ctx.info(f"host tags: {', '.join(t for t in watch.tags if t.startswith('ir:')) or '(no ir: tag)'}")
    marker.want(watch.host_ir)
    result = marker.step()
    ok = result is not None and result.error is None
    ctx.check(ok, "the Kubernetes step applied", (result.patched or "nothing to change") if ok and result else "")


def _show(ctx: DemoContext, api: KubernetesNodeApi, host: str) -> tuple[dict[str, Any], list[Any]]:
    node = api.get(host)
    labels = node["metadata"].get("labels") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    ctx.info(f"$ kubectl get node {host} -o jsonpath='{{.metadata.labels}} {{.spec.taints}}'")
    ctx.info(f"  labels: {labels}")
    ctx.info(f"  taints: {taints}")
    return labels, taints
