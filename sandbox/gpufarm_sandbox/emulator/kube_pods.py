"""Sandbox module: the Kubernetes API's pods as far as the node agent's evictions need them.

Served under `/_sandbox/kubernetes` (the client's `host`), beside the Node endpoints (kube_nodes):

- `POST /api/v1/namespaces/{namespace}/pods` creates a pod (its `metadata.name` and labels; answered as a `Pod`);
- `GET /api/v1/namespaces/{namespace}/pods/{name}` reads one;
- `POST /api/v1/namespaces/{namespace}/pods/{name}/eviction` with a policy/v1 `Eviction` body naming the pod evicts
  it: 201 with the eviction's `Status` (`Success`), as the API server answers, and the pod is gone (the sandbox
  has no kubelet to wait on its grace period). An unknown pod is 404; a body that is not an Eviction of that pod
  400; a pod marked protected 429 `TooManyRequests` with the `DisruptionBudget` cause, as a PodDisruptionBudget
  allowing no disruption answers.

Requests need `Authorization: Bearer <token>` (401 otherwise). `tests/contract/test_sandbox_kube_nodes.py` checks the
answers against the kubernetes client's models.

`POST /_sandbox/kubernetes/protect` `{"namespace": "ml", "name": "p", "count": 2, "status": 429}` makes the pod's
next evictions answer that status (429 by default: a disruption budget; a 5xx: the API server failing).
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.kube_nodes import MAX_BODY, PREFIX, TOKEN, status
from gpufarm_sandbox.emulator.web import Auth, Route, json_response, raw_body

MAX_PODS = 10_000
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."


class KubePodsModule(BaseModule):
    """Pods by (namespace, name), the evictions done, and the refusals armed per pod."""

    name = "kubernetes-pods"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.evicted: list[tuple[str, str]] = []
        self.evictions = 0
        self._protect: dict[tuple[str, str], list[int]] = {}

    def routes(self) -> list[Route]:
        pods = f"{PREFIX}/api/v1/namespaces/<namespace>/pods"
        return [
            Route(pods, ("POST",), self._create, Auth.NONE),
            Route(f"{pods}/<name>", ("GET",), self._get, Auth.NONE),
            Route(f"{pods}/<name>/eviction", ("POST",), self._evict, Auth.NONE),
            Route(f"{PREFIX}/protect", ("POST",), self._protect_pod, Auth.NONE),
        ]

    def reset(self) -> None:
        with self.ctx.lock:
            self.pods.clear()
            self.evicted.clear()
            self._protect.clear()
            self.evictions = 0

    def dump(self) -> dict[str, Any]:
        with self.ctx.lock:
            return {"pods": [f"{ns}/{name}" for ns, name in sorted(self.pods)], "evicted": len(self.evicted)}

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("Authorization", "") == f"Bearer {TOKEN}"

    def _body(self, request: Request) -> Any:
        data = raw_body(request)
        if len(data) > MAX_BODY:
            return None
        try:
            return json.loads(data or b"null")
        except ValueError:
            return None

    def _create(self, request: Request, namespace: str) -> Response:
        if not self._authorized(request):
            return status(401, "Unauthorized")
        body = self._body(request)
        meta = body.get("metadata") if isinstance(body, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        name = meta.get("name")
        if not _NAME.match(namespace) or not isinstance(name, str) or not _NAME.match(name):
            return status(422, "Pod is invalid: metadata.name: a lowercase RFC 1123 subdomain is required")
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            return status(422, "Pod is invalid: metadata.labels: values must be strings")
        with self.ctx.lock:
            if (namespace, name) in self.pods:
                return status(409, f'pods "{name}" already exists')
            if len(self.pods) >= MAX_PODS:
                return status(403, "too many pods")
            created = datetime.fromtimestamp(self.ctx.clock.now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "labels": dict(labels),
                    "creationTimestamp": created,
                    "resourceVersion": "1",
                },
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Running"},
            }
            self.pods[(namespace, name)] = pod
            return json_response(copy.deepcopy(pod), 201)

    def _get(self, request: Request, namespace: str, name: str) -> Response:
        if not self._authorized(request):
            return status(401, "Unauthorized")
        with self.ctx.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return status(404, f'pods "{name}" not found')
            return json_response(copy.deepcopy(pod))

    def _evict(self, request: Request, namespace: str, name: str) -> Response:
        if not self._authorized(request):
            return status(401, "Unauthorized")
        body = self._body(request)
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction" or not isinstance(meta, dict):
            return status(400, "the body of the request is not an Eviction")
        if meta.get("name") != name:
            return status(400, "name in URL does not match name in Eviction object")
        with self.ctx.lock:
            self.evictions += 1
            key = (namespace, name)
            if key not in self.pods:
                return status(404, f'pods "{name}" not found')
            armed = self._protect.get(key)
            if armed:
                code = armed.pop(0)
                return _budget_refusal(name) if code == 429 else status(code, "eviction refused by the sandbox")
            del self.pods[key]
            self.evicted.append(key)
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        return json_response(body, 201)

    def _protect_pod(self, request: Request) -> Response:
        body = self._body(request)
        body = body if isinstance(body, dict) else {}
        namespace, name = body.get("namespace"), body.get("name")
        code, count = body.get("status", 429), body.get("count", 1)
        if (
            not isinstance(namespace, str)
            or not isinstance(name, str)
            or not isinstance(code, int)
            or code not in (429, 500, 503)
            or not isinstance(count, int)
            or not 0 <= count <= 100
        ):
            return status(400, "expected {namespace, name, count: 0..100, status: 429|500|503}")
        with self.ctx.lock:
            self._protect[(namespace, name)] = [code] * count
        return json_response({"refusing": count})


def _budget_refusal(name: str) -> Response:
    """What the API server answers when a PodDisruptionBudget allows no disruption now."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": PDB_MESSAGE,
        "reason": "TooManyRequests",
        "details": {
            "name": name,
            "kind": "pods",
            "causes": [{"reason": "DisruptionBudget", "message": "The disruption budget needs 1 healthy pods"}],
        },
        "code": 429,
    }
    return json_response(body, 429)
