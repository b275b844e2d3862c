"""A simulated node on a pool Kubernetes enforces: its agent reads the host's `ir:` tag each cycle (as the allocator
writes it, on the sandbox's Datadog) and its Kubernetes step, in its own thread and through the official client,
labels and taints the host's Node on the sandbox's Node endpoints on allocation and cleans both on release. The API
refusing the patches: retried with backoff, reported (lag, failed operations, one event each way), and the agent's
cycles go on at their pace meanwhile."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence

import pytest

from gpufarm_node.enforce.kube import KubernetesNodeApi, NodeMarker
from gpufarm_node.enforce.kube_plan import LABEL, TAINT
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN
from gpufarm_sandbox.simfarm import HostSpec, SimulatedFarm, simulate_hosts

pytestmark = pytest.mark.integration
HOST = "aws-p5-91"
OTHER = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


class Operators:
    def __init__(self) -> None:
        self.lag: list[float] = []
        self.failed: list[float] = []
        self.events: list[str] = []

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None:
        self.lag.append(values["gpufarm.enforce.lag_seconds"])
        self.failed.append(values["gpufarm.enforce.failed_ops"])

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        self.events.append(title)


@pytest.fixture
def farm(sandbox: Sandbox, sandbox_url: str) -> Iterator[SimulatedFarm]:
    built = simulate_hosts(
        [HostSpec(HOST, "cloud-aws", "aws-use1", "H100", 8, profile="busy")],
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


def _request(url: str, body: object, method: str = "POST", headers: dict[str, str] | None = None) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert 200 <= response.status < 300


def _tag_host(sandbox_url: str, tags: list[str]) -> None:
    """The host's user tags as the allocator leaves them (a dedicated lease: its one `ir:` tag)."""
    keys = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
    _request(f"{sandbox_url}/api/v1/tags/hosts/{HOST}?source=user", {"host": HOST, "tags": tags}, "PUT", keys)


def _node(sandbox: Sandbox) -> tuple[dict[str, str], list[dict[str, str]]]:
    node = sandbox.kube_nodes.nodes[HOST]
    return dict(node["metadata"]["labels"]), list(node["spec"]["taints"])


def _until(check: Callable[[], bool], farm: SimulatedFarm, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        farm.step_all()
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def marker(farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str) -> Iterator[tuple[NodeMarker, Operators]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    node = {"metadata": {"name": HOST, "labels": {"zone": "use1-az1"}}, "spec": {"taints": [OTHER]}}
    _request(f"{sandbox_url}{PREFIX}/api/v1/nodes", node, headers=headers)
    ops = Operators()
    built = NodeMarker(
        KubernetesNodeApi(host=sandbox_url + PREFIX, token=TOKEN), HOST, ops, backoff_first=0.05, backoff_max=0.2
    )
    farm.node(HOST).agent.lease_marks = built
    built.start()
    try:
        yield built, ops
    finally:
        built.close()


def test_a_lease_labels_and_taints_the_node_and_its_end_cleans_both(
    farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str, marker: tuple[NodeMarker, Operators]
) -> None:
    _, ops = marker
    _tag_host(sandbox_url, ["ir:ir-21"])
    ours = {"key": TAINT, "value": "ir-21", "effect": "NoSchedule"}
    assert _until(lambda: _node(sandbox) == ({"zone": "use1-az1", LABEL: "ir-21"}, [OTHER, ours]), farm)
    _tag_host(sandbox_url, [])
    assert _until(lambda: _node(sandbox) == ({"zone": "use1-az1"}, [OTHER]), farm)
    assert ops.events == [] and set(ops.failed) == {0.0}


def test_a_refused_patch_is_retried_reported_and_the_cycles_go_on(
    farm: SimulatedFarm, sandbox: Sandbox, sandbox_url: str, marker: tuple[NodeMarker, Operators]
) -> None:
    built, ops = marker
    _request(f"{sandbox_url}{PREFIX}/refuse", {"status": 403, "count": 4})
    _tag_host(sandbox_url, ["ir:ir-22"])
    cycles = []
    deadline = time.monotonic() + 10
    while _node(sandbox)[0].get(LABEL) != "ir-22" and time.monotonic() < deadline:
        started = time.perf_counter()
        reports = farm.step_all()
        cycles.append(time.perf_counter() - started)
        assert all(r.series > 0 and r.flushed for r in reports)  # each cycle's metrics reached Datadog
        time.sleep(0.02)
    assert _node(sandbox)[0].get(LABEL) == "ir-22"
    assert sandbox.kube_nodes.patches >= 5  # four refused, then the one that took
    assert ops.failed.count(1.0) == 4 and ops.failed[-1] == 0.0 and max(ops.lag) > 0 and ops.lag[-1] == 0.0
    assert ops.events == ["gpufarm enforcement is lagging", "gpufarm enforcement caught up"]
    # The agent's cycles never waited on the API: each took what a cycle takes.
    assert len(cycles) >= 2 and max(cycles) < 2.0
    assert built.lag_seconds == 0.0
