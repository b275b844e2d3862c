"""Hand-edited host tags never reach the Kubernetes API as anything but a checked lease value, and never stop the
agent's cycle.

Anyone with tag rights in Datadog may set a host's `ir:` tag to anything; the agent reads it every cycle and hands it
to its Kubernetes step. A value that is not `ir-<n>` (a second key, a selector, a huge string) leaves the Node as it
is; the cycle's metrics go out as before (docs/operate.md, "Kubernetes enforcement")."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpufarm_node.enforce.kube import NodeMarker
from gpufarm_node.enforce.kube_plan import LABEL, TAINT
from gpufarm_node.fakenode import fake_node
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.sender import JsonLinesSender
from gpufarm_node.topology import load_topology

pytestmark = pytest.mark.security
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "node"
HOSTILE = ["ir-7 Users=root", "ir-7,ir-8", "ir-7\nspec", "../../nodes", "ir-" + "9" * 40, "ir-7:NoExecute", "x" * 190]


class Tags:
    def __init__(self) -> None:
        self.tags: list[str] = []

    def get(self) -> tuple[int, bytes, Mapping[str, str]]:
        return 200, json.dumps({"tags": self.tags}).encode(), {}


class Api:
    def __init__(self) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}}, "spec": {"taints": []}}
        self.bodies: list[Mapping[str, Any]] = []

    def get(self, name: str) -> dict[str, Any]:
        return self.node

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        self.bodies.append(body)
        labels = {**self.node["metadata"]["labels"], **body["metadata"].get("labels", {})}
        self.node["metadata"]["labels"] = {k: v for k, v in labels.items() if v is not None}
        self.node["spec"] = body.get("spec", self.node["spec"])


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_ir_tag_leaves_the_node_and_the_cycle_goes_on(tmp_path: Path, value: str) -> None:
    tags, api, out = Tags(), Api(), io.StringIO()
    node = fake_node(
        load_topology(FIXTURES / "tiny.yaml", seed="n1"),
        tmp_path,
        JsonLinesSender("n1", stream=out),
        hostname="n1",
        host_tags=HostTagWatch(tags, "n1"),
    )
    marker = NodeMarker(api, "n1")
    node.agent.lease_marks = marker
    node.agent.start()
    try:
        tags.tags = ["ir:ir-7"]
        node.agent.cycle()
        marker.step()
        tags.tags = [f"ir:{value}"]
        report = node.agent.cycle()
        assert report.series > 0 and out.getvalue().count("\n") == 2
        marker.step()
    finally:
        node.agent.close()
    assert api.node["metadata"]["labels"] == {LABEL: "ir-7"}
    assert api.node["spec"]["taints"] == [{"key": TAINT, "value": "ir-7", "effect": "NoSchedule"}]
    for body in api.bodies:
        assert set(body["metadata"].get("labels", {}).values()) <= {"ir-7", None}
