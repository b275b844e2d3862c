"""A simulated node of a sliced (MIG) pool Kubernetes enforces, against the sandbox's Datadog and Kubernetes API: a pod
labelled for another lease runs on a slice lease IR-31 holds (`gpu_assign` host tag); the agent reports it as a
squatter every cycle (the pod-resources mismatch, its namespace and name in the series); nothing is evicted while
gpufarm has published no stop (the grace); once the host carries the stop gpufarm publishes past the grace
(`gpufarm_stop:<uuid>/<episode start>`) the Kubernetes step evicts the pod through the Eviction API, once, in its own
thread. A PodDisruptionBudget refusing (429) is retried with backoff and reported (failed operations, lag, one event
each way) while the agent's cycles go on flushing; an exempt host's pod is never evicted."""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence

import pytest

from gpufarm_node.attribution import DeviceOwner
from gpufarm_node.enforce.kube import KubernetesNodeApi, NodeMarker
from gpufarm_node.enforce.kube_evict import PodEvictor
from gpufarm_node.squatters import SQUATTER_METRIC, pod_squatters
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN
from gpufarm_sandbox.simfarm import HostSpec, SimulatedFarm, simulate_hosts

pytestmark = pytest.mark.integration
HOST = "k8s-mig-31"
NS, POD = "team-b", "intruder-0"
KUBE = {"Authorization": f"Bearer {TOKEN}"}
DD = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}


class Operators:
    def __init__(self) -> None:
        self.evict_gauges: list[dict[str, float]] = []
        self.events: list[str] = []

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None:
        if "kube_op:evict" in tags:
            self.evict_gauges.append(dict(values))

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        self.events.append(title)


def _request(url: str, body: object, method: str = "POST", headers: dict[str, str] | None = None) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert 200 <= response.status < 300


def _tag_host(sandbox_url: str, tags: list[str]) -> None:
    """The host's user tags as gpufarm leaves them (the allocator's gpu_assign, the squatter alert's stop)."""
    _request(f"{sandbox_url}/api/v1/tags/hosts/{HOST}?source=user", {"host": HOST, "tags": tags}, "PUT", DD)


@pytest.fixture
def farm(sandbox: Sandbox, sandbox_url: str) -> Iterator[SimulatedFarm]:
    built = simulate_hosts(
        [HostSpec(HOST, "shared-slices", "k8s-shared", "A100", 1, "1g.10gb", 7)],
        sandbox_url,
        DEFAULT_DD_API_KEY,
        DEFAULT_DD_APP_KEY,
        clock=sandbox.clock.now,
        background=False,
    )
    try:
        yield built
    finally:
        built.stop()


@pytest.fixture
def step(farm: SimulatedFarm, sandbox_url: str) -> Iterator[tuple[str, PodEvictor, Operators]]:
    """The agent wired as `--enforce kubernetes` wires it; the pod squats IR-31's slice. Yields the slice's uuid."""
    node = farm.node(HOST)
    uuid = node.device_uuid((0, 0))
    _request(f"{sandbox_url}{PREFIX}/api/v1/nodes", {"metadata": {"name": HOST}}, headers=KUBE)
    pod = {"metadata": {"name": POD, "labels": {"gpufarm.io/ir": "ir-99"}}}
    _request(f"{sandbox_url}{PREFIX}/api/v1/namespaces/{NS}/pods", pod, headers=KUBE)
    node.owners.set(uuid, DeviceOwner(NS, POD, "main", None, "ir-99"))
    ops = Operators()
    api = KubernetesNodeApi(host=sandbox_url + PREFIX, token=TOKEN)
    evictor = PodEvictor(api, HOST, ops, backoff_first=0.05, backoff_max=0.2)
    marker = NodeMarker(api, HOST, ops, backoff_first=0.05, backoff_max=0.2, evictions=evictor)
    agent = node.agent
    assert agent.squatter_stops is not None and agent.host_tags is not None
    agent.lease_marks = marker
    agent.squatter_source = pod_squatters(lambda: agent.attributor.device_owners, agent.host_tags)
    agent.squatter_stops.evict = evictor
    marker.start()
    try:
        yield uuid.lower(), evictor, ops
    finally:
        marker.close()


def _until(check: Callable[[], bool], farm: SimulatedFarm, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reports = farm.step_all()
        assert all(r.series > 0 and r.flushed for r in reports)  # each cycle's metrics reached Datadog
        if check():
            return True
        time.sleep(0.05)
    return False


def _reported(farm: SimulatedFarm) -> list[str]:
    """The pods the last cycle reported as squatters."""
    rows = farm.node(HOST).agent.last_rows
    return [t for metric, _, tags in rows if metric == SQUATTER_METRIC for t in tags if t.startswith("pod_name:")]


def test_the_squatting_pod_is_evicted_once_gpufarm_publishes_its_stop(
    farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str, step: tuple[str, PodEvictor, Operators]
) -> None:
    uuid, _, ops = step
    since = int(sandbox.clock.now())
    _tag_host(sandbox_url, [f"gpu_assign:ir-31/{uuid}"])
    assert _until(lambda: _reported(farm) == [f"pod_name:{POD}"], farm)
    for _ in range(5):  # the grace: reported every cycle, never evicted without gpufarm's stop
        farm.step_all()
    assert sandbox.kube_pods.evictions == 0 and _reported(farm) == [f"pod_name:{POD}"]
    _tag_host(sandbox_url, [f"gpu_assign:ir-31/{uuid}", f"gpufarm_stop:{uuid}/{since}"])
    assert _until(lambda: sandbox.kube_pods.evicted == [(NS, POD)], farm)
    for _ in range(5):  # the pod still shows in pod-resources while it terminates: not evicted again
        farm.step_all()
        time.sleep(0.02)
    assert sandbox.kube_pods.evictions == 1
    assert ops.evict_gauges[-1]["gpufarm.enforce.applied_ops"] == 1.0 and ops.events == []


def test_a_disruption_budget_refusal_is_retried_and_reported_while_the_cycles_flush(
    farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str, step: tuple[str, PodEvictor, Operators]
) -> None:
    uuid, evictor, ops = step
    _request(f"{sandbox_url}{PREFIX}/protect", {"namespace": NS, "name": POD, "count": 3})
    since = int(sandbox.clock.now())
    _tag_host(sandbox_url, [f"gpu_assign:ir-31/{uuid}", f"gpufarm_stop:{uuid}/{since}"])
    cycles: list[float] = []

    def timed() -> bool:
        cycles.append(time.perf_counter())
        return sandbox.kube_pods.evicted == [(NS, POD)]

    assert _until(timed, farm)
    assert sandbox.kube_pods.evictions == 4  # three refused by the budget, then the one that took
    failed = [g["gpufarm.enforce.failed_ops"] for g in ops.evict_gauges]
    assert failed.count(1.0) == 3 and failed[-1] == 0.0
    assert max(g["gpufarm.enforce.lag_seconds"] for g in ops.evict_gauges) > 0
    assert ops.evict_gauges[-1]["gpufarm.enforce.lag_seconds"] == 0.0 and evictor.lag_seconds == 0.0
    assert ops.events == ["gpufarm could not evict a squatting pod", "gpufarm evicted a squatting pod"]
    # The agent's cycles never waited on the API: each took what a cycle takes.
    assert len(cycles) >= 2 and max(b - a for a, b in itertools.pairwise(cycles)) < 2.0


def test_an_exempt_hosts_pod_is_never_evicted(
    farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str, step: tuple[str, PodEvictor, Operators]
) -> None:
    uuid, _, _ = step
    since = int(sandbox.clock.now())
    tags = [f"gpu_assign:ir-31/{uuid}", f"gpufarm_stop:{uuid}/{since}", "gpufarm_exempt:squatters"]
    _tag_host(sandbox_url, tags)
    assert _until(lambda: _reported(farm) == [f"pod_name:{POD}"], farm)  # still reported
    for _ in range(5):
        farm.step_all()
        time.sleep(0.02)
    assert sandbox.kube_pods.evictions == 0
