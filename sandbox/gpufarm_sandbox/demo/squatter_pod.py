"""The squatter step's pod: a pod labelled for another lease holds the busy lease's slice beside the squatting
process, and the sliced host's agent runs its Kubernetes step (`--enforce kubernetes`: pod squatters from the
device owners, their eviction in the step's own thread) against the sandbox's Kubernetes endpoints.

kubelet's pod-resources answer is the simulated node's device owners; the pod itself lives on the sandbox's API
(`/_sandbox/kubernetes`), where the step evicts it through the official client once gpufarm publishes the stop. The
sandbox has no kubelet: `gone()` takes the evicted pod off the slice, as kubelet would once it terminated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufarm_node.attribution import DeviceOwner
from gpufarm_node.enforce.kube import KubernetesNodeApi, NodeMarker
from gpufarm_node.enforce.kube_evict import PodEvictor
from gpufarm_node.squatters import pod_squatters
from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext
    from gpufarm_sandbox.simfarm import SimulatedFarm

NAMESPACE = "team-b"
NAME = "intruder-0"
CLAIMS = "ir-999"


class SquattingPod:
    """The pod on the slice and the agent's Kubernetes step that evicts it (see the module docstring)."""

    def __init__(self, ctx: DemoContext, nodes: SimulatedFarm, *, host: str, uuid: str) -> None:
        self.ctx, self.host, self.uuid = ctx, host, uuid
        self.node = nodes.node(host)
        server = ctx.base_url.rstrip("/") + PREFIX
        self._register(server)
        api = KubernetesNodeApi(host=server, token=TOKEN)
        self.evictor = PodEvictor(api, host, cluster_tag=self.node.spec.cluster, backoff_first=0.2, backoff_max=2.0)
        self.marker = NodeMarker(api, host, cluster_tag=self.node.spec.cluster, evictions=self.evictor)
        # The NVML uuid as the simulated kubelet names the device it gave the pod.
        device = next(d for d in self.node.devices() if self.node.device_uuid(d).lower() == uuid.lower())
        self._device_uuid = self.node.device_uuid(device)
        self._before = self.node.owners.owners().get(self._device_uuid)
        self.node.owners.set(self._device_uuid, DeviceOwner(NAMESPACE, NAME, "main", None, CLAIMS))
        agent = self.node.agent
        assert agent.host_tags is not None and agent.squatter_stops is not None
        attributor = agent.attributor
        agent.squatter_source = pod_squatters(lambda: attributor.device_owners, agent.host_tags)
        agent.squatter_stops.evict = self.evictor
        agent.lease_marks = self.marker
        self.marker.start()

    def _register(self, server: str) -> None:
        """The sliced host's Node and the pod, as the cluster would have them (a rerun finds them)."""
        from kubernetes import client

        configuration = client.Configuration(host=server)
        configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
        with client.ApiClient(configuration) as http:
            core = client.CoreV1Api(http)
            node = client.V1Node(metadata=client.V1ObjectMeta(name=self.host))
            pod = client.V1Pod(metadata=client.V1ObjectMeta(name=NAME, labels={"gpufarm.io/ir": CLAIMS}))
            for kind, body in (("node", node), ("pod", pod)):
                try:
                    if kind == "node":
                        core.create_node(body)
                    else:
                        core.create_namespaced_pod(NAMESPACE, body)
                except client.ApiException as exc:
                    if exc.status != 409:
                        raise

    def evicted(self) -> bool:
        """Whether the sandbox's API evicted the pod."""
        return (NAMESPACE, NAME) in self.ctx.sandbox.kube_pods.evicted

    def gone(self) -> None:
        """The evicted pod terminated: kubelet no longer gives it the slice."""
        self.node.owners.set(self._device_uuid, self._before)

    def close(self) -> None:
        """Stop the step's thread and put the agent back as it was."""
        self.marker.close()
        agent = self.node.agent
        agent.squatter_source = None
        agent.lease_marks = None
        if agent.squatter_stops is not None:
            agent.squatter_stops.evict = None
        self.gone()
