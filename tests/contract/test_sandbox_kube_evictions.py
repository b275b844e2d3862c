"""The sandbox's pod eviction endpoint, driven by the official kubernetes client as the node agent's evictions drive it.

Its answers are held to the client's models as the Node endpoints' are (kube_schema.conforms): a `Pod` on create, a
`Status` on every eviction answer (201 Success, 429 with the DisruptionBudget cause, 404, 400, 401), and the client
deserialises the 201 into the `V1Eviction` the OpenAPI spec declares. The agent's `KubernetesNodeApi.evict` reads
201 as evicted, 404 as gone, and raises the refusal with its status.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kube_schema import conforms
from kubernetes import client

from gpufarm_node.enforce.kube import KubeApiError, KubernetesNodeApi
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.kube_nodes import PREFIX, TOKEN

NS, POD = "team-b", "intruder-0"


@pytest.fixture
def api(sandbox_url: str) -> client.CoreV1Api:
    configuration = client.Configuration(host=sandbox_url + PREFIX)
    configuration.api_key = {"authorization": f"Bearer {TOKEN}"}
    return client.CoreV1Api(client.ApiClient(configuration))


def _pod(api: client.CoreV1Api, name: str = POD) -> client.V1Pod:
    body = client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"gpufarm.io/ir": "ir-9"}))
    created: client.V1Pod = api.create_namespaced_pod(NS, body)
    return created


def _eviction(name: str = POD) -> client.V1Eviction:
    return client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=NS))


def _protect(sandbox_url: str, count: int, status: int = 429) -> None:
    body = json.dumps({"namespace": NS, "name": POD, "count": count, "status": status})
    answer = urllib3.PoolManager().request("POST", f"{sandbox_url}{PREFIX}/protect", body=body)
    assert answer.status == 200


def test_a_pod_answers_as_the_pod_schema(api: client.CoreV1Api) -> None:
    pod = _pod(api)
    assert isinstance(pod, client.V1Pod) and pod.metadata.labels == {"gpufarm.io/ir": "ir-9"}
    raw = json.loads(api.read_namespaced_pod(POD, NS, _preload_content=False).data)
    assert conforms(raw, "V1Pod") == [] and raw["metadata"]["namespace"] == NS


def test_an_eviction_is_201_with_a_success_status_and_the_pod_is_gone(api: client.CoreV1Api, sandbox: Sandbox) -> None:
    _pod(api)
    response = api.create_namespaced_pod_eviction(POD, NS, _eviction(), _preload_content=False)
    assert response.status == 201
    body: dict[str, Any] = json.loads(response.data)
    assert conforms(body, "V1Status") == [] and body["status"] == "Success"
    assert sandbox.kube_pods.evicted == [(NS, POD)]
    with pytest.raises(client.ApiException) as gone:
        api.read_namespaced_pod(POD, NS)
    assert gone.value.status == 404
    # The client reads the answer as the V1Eviction its OpenAPI spec declares (a Status shares its kind and
    # apiVersion; the rest it leaves).
    _pod(api)
    model = api.create_namespaced_pod_eviction(POD, NS, _eviction())
    assert isinstance(model, client.V1Eviction) and model.kind == "Status"


def test_a_protected_pod_is_refused_with_429_and_the_disruption_budget_cause(
    api: client.CoreV1Api, sandbox_url: str
) -> None:
    _pod(api)
    _protect(sandbox_url, 1)
    with pytest.raises(client.ApiException) as refused:
        api.create_namespaced_pod_eviction(POD, NS, _eviction())
    assert refused.value.status == 429
    body = json.loads(refused.value.body)
    assert conforms(body, "V1Status") == [] and body["reason"] == "TooManyRequests"
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert api.create_namespaced_pod_eviction(POD, NS, _eviction(), _preload_content=False).status == 201


def test_unknown_pods_bad_bodies_and_no_token_are_status_errors(api: client.CoreV1Api, sandbox_url: str) -> None:
    with pytest.raises(client.ApiException) as missing:
        api.create_namespaced_pod_eviction("nobody", NS, _eviction("nobody"))
    assert missing.value.status == 404 and conforms(json.loads(missing.value.body), "V1Status") == []
    _pod(api)
    with pytest.raises(client.ApiException) as mismatch:
        api.create_namespaced_pod_eviction(POD, NS, _eviction("someone-else"))
    assert mismatch.value.status == 400
    url = f"{sandbox_url}{PREFIX}/api/v1/namespaces/{NS}/pods/{POD}/eviction"
    assert urllib3.PoolManager().request("POST", url, body=b"{}").status == 401


def test_the_agents_evict_call_reads_evicted_gone_and_refused(api: client.CoreV1Api, sandbox_url: str) -> None:
    agent_api = KubernetesNodeApi(host=sandbox_url + PREFIX, token=TOKEN)
    _pod(api)
    _protect(sandbox_url, 1, status=503)
    with pytest.raises(KubeApiError, match="HTTP 503") as failing:
        agent_api.evict(NS, POD)
    assert failing.value.status == 503
    _protect(sandbox_url, 1)
    with pytest.raises(KubeApiError, match="disruption budget") as refused:
        agent_api.evict(NS, POD)
    assert refused.value.status == 429 and TOKEN not in str(refused.value)
    assert agent_api.evict(NS, POD) is True
    assert agent_api.evict(NS, POD) is False  # gone: done
