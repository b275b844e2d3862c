"""The Kubernetes step's pure parts: the Node a lease calls for and the patch that gets it there (only gpufarm's
label and taint, idempotent, the read resourceVersion named), the marker's backoff, reporting and thread (the
agent's cycle never waits on it), and the pod-label mismatches a shared pool's squatter report is built from."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpufarm_node.attribution import DeviceOwner
from gpufarm_node.enforce.kube import KubeApiError, NodeMarker, _api_error
from gpufarm_node.enforce.kube_plan import LABEL, TAINT, PlanError, describe, marks, node_patch
from gpufarm_node.enforce.pod_leases import PodMismatch, pod_mismatches

OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _node(labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "gpu-1", "resourceVersion": "41", "labels": {"zone": "a", **(labels or {})}}
    return {"metadata": meta, "spec": {"taints": taints if taints is not None else [OTHER_TAINT]}}


def _apply(node: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """What the API server makes of the merge patch (maps merge, null deletes, lists replaced)."""
    labels = {**node["metadata"].get("labels", {}), **patch["metadata"].get("labels", {})}
    out = {"metadata": {**node["metadata"], "labels": {k: v for k, v in labels.items() if v is not None}}}
    out["spec"] = {"taints": patch["spec"]["taints"]} if "spec" in patch else node["spec"]
    return out


def test_a_lease_adds_its_label_and_taint_beside_the_nodes_own() -> None:
    patch = node_patch(_node(), "ir-7")
    assert patch == {
        "metadata": {"resourceVersion": "41", "labels": {LABEL: "ir-7"}},
        "spec": {"taints": [OTHER_TAINT, {"key": TAINT, "value": "ir-7", "effect": "NoSchedule"}]},
    }
    after = _apply(_node(), patch)
    assert after["metadata"]["labels"] == {"zone": "a", LABEL: "ir-7"}
    assert node_patch(after, "ir-7") is None  # idempotent: a Node that holds it is left alone
    assert describe(patch) == f"label {LABEL}=ir-7, taint {TAINT}=ir-7:NoSchedule"


def test_the_end_of_the_lease_removes_both_and_nothing_else() -> None:
    node = _node({LABEL: "ir-7"}, [OTHER_TAINT, {"key": TAINT, "value": "ir-7", "effect": "NoSchedule"}])
    patch = node_patch(node, None)
    assert patch is not None
    assert patch["metadata"]["labels"] == {LABEL: None}
    assert patch["spec"]["taints"] == [OTHER_TAINT]
    after = _apply(node, patch)
    assert after["metadata"]["labels"] == {"zone": "a"} and node_patch(after, None) is None
    assert node_patch(_node(), None) is None  # never leased: nothing to do


def test_a_lease_changing_hands_and_a_hand_edit_are_put_right() -> None:
    held = _node({LABEL: "ir-7"}, [{"key": TAINT, "value": "ir-7", "effect": "NoSchedule"}])
    patch = node_patch(held, "ir-8")
    assert patch is not None and patch["metadata"]["labels"] == {LABEL: "ir-8"}
    assert patch["spec"]["taints"] == [{"key": TAINT, "value": "ir-8", "effect": "NoSchedule"}]
    # Someone changed the taint's effect by hand, or added a second gpufarm taint: put back to the one taint.
    edited = _node({LABEL: "ir-8"}, [{"key": TAINT, "value": "ir-8", "effect": "NoExecute"}, OTHER_TAINT])
    fixed = node_patch(edited, "ir-8")
    assert fixed is not None and "labels" not in fixed["metadata"]
    assert fixed["spec"]["taints"] == [OTHER_TAINT, {"key": TAINT, "value": "ir-8", "effect": "NoSchedule"}]


def test_a_bad_lease_value_or_node_shape_is_refused() -> None:
    for bad in ("ir-0", "IR-7", "ir-7;x", "ir-" + "9" * 12, "7"):
        with pytest.raises(PlanError):
            node_patch(_node(), bad)
    with pytest.raises(PlanError):
        marks({"spec": {}})
    with pytest.raises(PlanError):
        marks({"metadata": {"labels": ["x"]}})
    assert marks({"metadata": {}}) == (None, [])


class Api:
    """A Node in memory; `fail` makes the next calls raise."""

    def __init__(self) -> None:
        self.node = _node()
        self.fail: list[str] = []
        self.patches = 0
        self.block: threading.Event | None = None

    def get(self, name: str) -> dict[str, Any]:
        assert name == "gpu-1"
        if self.block is not None:
            self.block.wait(5)
        if self.fail:
            raise KubeApiError(self.fail.pop(0))
        return self.node

    def patch(self, name: str, body: Mapping[str, Any]) -> None:
        self.patches += 1
        self.node = _apply(self.node, body)


class Operators:
    def __init__(self) -> None:
        self.gauges_sent: list[dict[str, float]] = []
        self.events: list[tuple[str, str]] = []
        self.tags: Sequence[str] = ()

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None:
        self.gauges_sent.append(values)
        self.tags = tags

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        self.events.append((title, alert))


def test_a_refused_patch_is_retried_with_backoff_and_reported_once_per_episode() -> None:
    now = [1000.0]
    api, ops = Api(), Operators()
    marker = NodeMarker(api, "gpu-1", ops, clock=lambda: now[0], backoff_first=2, backoff_max=8)
    assert marker.step() is None  # nothing known yet: nothing touched
    api.fail = ["HTTP 403 Forbidden: nodes is forbidden"] * 4
    marker.want("ir-7")
    assert marker.due_in() == 0.0
    waits = []
    for _ in range(4):
        result = marker.step()
        assert result is not None and result.error is not None and "403" in result.error
        waits.append(marker.due_in())
        now[0] += marker.due_in()
    assert waits == [2, 4, 8, 8]
    assert (
        ops.gauges_sent[-1]["gpufarm.enforce.lag_seconds"] == 14
        and ops.gauges_sent[-1]["gpufarm.enforce.failed_ops"] == 1
    )
    assert ops.events == [("gpufarm enforcement is lagging", "error")]
    result = marker.step()
    assert result is not None and result.error is None and result.patched
    assert api.node["metadata"]["labels"][LABEL] == "ir-7"
    assert ops.events[-1] == ("gpufarm enforcement caught up", "success")
    assert ops.gauges_sent[-1] == {
        "gpufarm.enforce.lag_seconds": 0.0,
        "gpufarm.enforce.failed_ops": 0.0,
        "gpufarm.enforce.applied_ops": 1.0,
    }
    assert set(ops.tags) == {"enforcer:kubernetes", "kube_node:gpu-1", "cluster:default"}
    # Held: the next read is the resync, and a new lease is due at once.
    assert marker.due_in() == pytest.approx(300.0)
    marker.want(None)
    assert marker.due_in() == 0.0


def test_a_hand_edit_is_put_back_at_the_resync() -> None:
    now = [0.0]
    api = Api()
    marker = NodeMarker(api, "gpu-1", clock=lambda: now[0], resync=30)
    marker.want("ir-7")
    marker.step()
    api.node["metadata"]["labels"].pop(LABEL)
    now[0] += 30
    assert marker.due_in() == 0.0
    result = marker.step()
    assert result is not None and result.patched == f"label {LABEL}=ir-7"


def test_the_agents_call_does_no_io_and_the_thread_applies() -> None:
    api = Api()
    api.block = threading.Event()  # the API server hangs
    marker = NodeMarker(api, "gpu-1")
    marker.start()
    try:
        started = time.perf_counter()
        for ir in ("ir-7", "ir-8", "ir-7"):
            marker.want(ir)
        assert time.perf_counter() - started < 0.05
        api.block.set()
        deadline = time.monotonic() + 5
        while api.node["metadata"]["labels"].get(LABEL) != "ir-7" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.node["metadata"]["labels"][LABEL] == "ir-7"
    finally:
        marker.close()


def test_an_ir_tag_that_is_no_lease_leaves_the_node_and_never_raises_into_the_cycle() -> None:
    api = Api()
    marker = NodeMarker(api, "gpu-1")
    marker.want("ir-7")
    marker.step()
    for bad in ("ir-x", "ir-7 Users=root", "x" * 300, "ir-0"):
        marker.want(bad)
        assert marker.due_in() > 0
    assert api.node["metadata"]["labels"][LABEL] == "ir-7"


def test_an_api_error_names_the_status_and_the_servers_message_only() -> None:
    body = '{"kind":"Status","message":"nodes \\"gpu-1\\" is forbidden: User cannot patch","code":403}'
    assert _api_error(403, "Forbidden", body) == 'HTTP 403 Forbidden: nodes "gpu-1" is forbidden: User cannot patch'
    assert _api_error(500, None, "<html>") == "HTTP 500"


def test_a_pod_on_another_leases_device_is_a_mismatch() -> None:
    owners = {
        "MIG-aaa": DeviceOwner("ml", "train-0", "main", None, "ir-7"),  # its own lease's slice
        "MIG-bbb": DeviceOwner("ml", "train-1", "main", None, "ir-7"),  # ir-8's slice
        "MIG-ccc": DeviceOwner("ml", "sneaky", "main", None, None),  # no label on ir-8's slice
        "MIG-ddd": DeviceOwner("ml", "lost", "main", None, "ir-9"),  # a slice no lease holds
        "MIG-eee": DeviceOwner("ml", "free", "main", None, None),  # unlabelled on a free slice: not one here
        "MIG-fff": DeviceOwner(),  # no pod
    }
    assigned = {"mig-aaa": "ir-7", "mig-bbb": "ir-8", "mig-ccc": "ir-8"}
    assert pod_mismatches(owners, assigned) == [
        PodMismatch("mig-bbb", "ml", "train-1", "ir-7", "ir-8"),
        PodMismatch("mig-ccc", "ml", "sneaky", None, "ir-8"),
        PodMismatch("mig-ddd", "ml", "lost", "ir-9", None),
    ]


def test_on_a_host_a_lease_holds_whole_every_device_is_that_leases() -> None:
    owners = {
        "GPU-1": DeviceOwner("a", "mine", "c", None, "ir-7"),
        "GPU-2": DeviceOwner("b", "theirs", "c", None, "ir-3"),
    }
    assert pod_mismatches(owners, {}, "ir-7") == [PodMismatch("gpu-2", "b", "theirs", "ir-3", "ir-7")]


def test_the_steps_gauges_and_tags_are_declared() -> None:
    import re
    from pathlib import Path

    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "spec" / "metrics.yaml").read_text())
    ops = Operators()
    marker = NodeMarker(Api(), "gpu-1", ops, cluster_tag="aws-use1")
    marker.want("ir-7")
    marker.step()
    declared = spec["enforce_metrics"]
    assert set(ops.gauges_sent[-1]) <= set(declared)
    for name in ops.gauges_sent[-1]:
        tags = declared[name]["tags"]
        # Every declared key but kube_op, which marks the step's evictions (test_enforce_kube_evict.py).
        declared_keys = set(tags["required"]) | set(tags.get("optional", []))
        assert {t.partition(":")[0] for t in ops.tags} == declared_keys - {"kube_op"}
    for tag in ops.tags:
        key, _, value = tag.partition(":")
        assert re.match(spec["tags"][key]["value"], value), tag
