"""The sandbox's Kubernetes Node endpoints, driven by the official kubernetes client as the node agent drives them.

Every answer is held to the Kubernetes OpenAPI schema as the client carries it: its generated models (V1Node,
V1ObjectMeta, V1Taint...; generated from the upstream OpenAPI v2 spec) name each field and its type, and every field
of an answer must be one of them, of that type (`conforms`); the client then deserialises it into its model (which
refuses a required field missing). Patches behave as the API server's: maps merge, null deletes, lists are
replaced, a stale resourceVersion is a 409, a token missing a 401, a content type other than a merge patch a 415.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kube_schema import conforms
from kubernetes import client

from gpufarm_node.enforce.kube import KubeApiError, KubernetesNodeApi, NodeMarker
from gpufarm_node.enforce.kube_plan import LABEL, TAINT
from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN


@pytest.fixture
def api(sandbox_url: str) -> client.CoreV1Api:
    configuration = client.Configuration(host=sandbox_url + PREFIX)
    configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
    return client.CoreV1Api(client.ApiClient(configuration))


def _raw(api: client.CoreV1Api, name: str) -> dict[str, Any]:
    response = api.read_node(name, _preload_content=False)
    data: dict[str, Any] = json.loads(response.data)
    return data


def _create(api: client.CoreV1Api, name: str = "gpu-1") -> None:
    taint = client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels={"zone": "a"}), spec=client.V1NodeSpec(taints=[taint])
    )
    api.create_node(node)


def test_answers_conform_to_the_node_schema_and_deserialise(api: client.CoreV1Api) -> None:
    _create(api)
    raw = _raw(api, "gpu-1")
    assert conforms(raw, "V1Node") == []
    assert raw["kind"] == "Node" and raw["apiVersion"] == "v1" and raw["metadata"]["resourceVersion"]
    node = api.read_node("gpu-1")
    assert isinstance(node, client.V1Node) and node.metadata.labels == {"zone": "a"}
    assert isinstance(node.spec.taints[0], client.V1Taint) and node.spec.taints[0].key == "nvidia.com/gpu"
    patched = api.patch_node("gpu-1", {"metadata": {"labels": {LABEL: "ir-3"}}})
    assert isinstance(patched, client.V1Node) and patched.metadata.labels == {"zone": "a", LABEL: "ir-3"}
    assert conforms(_raw(api, "gpu-1"), "V1Node") == []
    # The checker itself refuses a field the schema does not have and a wrong type.
    assert conforms({"metadata": {"labels": {"a": 1}}, "spek": {}}, "V1Node") == [
        ".spek: not a field of V1Node",
        ".metadata.labels.a: int is not str",
    ]


def test_errors_are_status_objects_the_client_raises(api: client.CoreV1Api, sandbox_url: str) -> None:
    with pytest.raises(client.ApiException) as missing:
        api.read_node("nowhere")
    assert missing.value.status == 404
    body = json.loads(missing.value.body)
    assert conforms(body, "V1Status") == [] and body["reason"] == "NotFound" and body["code"] == 404
    http = urllib3.PoolManager()
    assert http.request("GET", f"{sandbox_url}{PREFIX}/api/v1/nodes/x").status == 401
    _create(api)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json-patch+json"}
    body_patch = json.dumps([{"op": "add", "path": "/metadata/labels/x", "value": "y"}])
    assert (
        http.request("PATCH", f"{sandbox_url}{PREFIX}/api/v1/nodes/gpu-1", body=body_patch, headers=headers).status
        == 415
    )


def test_patches_merge_maps_replace_lists_and_refuse_a_stale_version(api: client.CoreV1Api) -> None:
    _create(api)
    version = _raw(api, "gpu-1")["metadata"]["resourceVersion"]
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    ours = {"key": TAINT, "value": "ir-3", "effect": "NoSchedule"}
    api.patch_node(
        "gpu-1",
        {"metadata": {"resourceVersion": version, "labels": {LABEL: "ir-3"}}, "spec": {"taints": [*taints, ours]}},
    )
    with pytest.raises(client.ApiException) as stale:
        api.patch_node("gpu-1", {"metadata": {"resourceVersion": version, "labels": {LABEL: None}}})
    assert stale.value.status == 409
    api.patch_node("gpu-1", {"metadata": {"labels": {LABEL: None}}, "spec": {"taints": taints}})
    raw = _raw(api, "gpu-1")
    assert raw["metadata"]["labels"] == {"zone": "a"} and raw["spec"]["taints"] == taints
    with pytest.raises(client.ApiException) as invalid:
        api.patch_node("gpu-1", {"spec": {"taints": [ours, ours]}})
    assert invalid.value.status == 422


def test_the_marker_through_the_client_labels_taints_and_cleans_only_its_own(
    sandbox_url: str, api: client.CoreV1Api
) -> None:
    _create(api)
    marker = NodeMarker(KubernetesNodeApi(host=sandbox_url + PREFIX, token=TOKEN), "gpu-1")
    marker.want("ir-12")
    first = marker.step()
    assert first is not None and first.error is None and first.patched
    raw = _raw(api, "gpu-1")
    assert raw["metadata"]["labels"] == {"zone": "a", LABEL: "ir-12"}
    assert raw["spec"]["taints"][-1] == {"key": TAINT, "value": "ir-12", "effect": "NoSchedule"}
    again = marker.step()
    assert again is not None and again.patched is None  # idempotent: one GET, no PATCH
    marker.want(None)
    marker.step()
    raw = _raw(api, "gpu-1")
    assert raw["metadata"]["labels"] == {"zone": "a"}
    assert raw["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def test_a_wrong_token_and_an_absent_server_are_errors_without_the_token(sandbox_url: str) -> None:
    with pytest.raises(KubeApiError, match="HTTP 401") as denied:
        KubernetesNodeApi(host=sandbox_url + PREFIX, token="not-the-token").get("gpu-1")
    assert "not-the-token" not in str(denied.value)
    with pytest.raises(KubeApiError, match="unreachable"):
        KubernetesNodeApi(host="http://127.0.0.1:9", token="t", timeout=(0.5, 0.5)).get("gpu-1")
