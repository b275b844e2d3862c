"""Sandbox module: the few Kubernetes API endpoints the node agent's Kubernetes step uses, on Nodes.

Served under `/_sandbox/kubernetes` (the client's `host`), as the API server serves them under `/`:

- `POST /api/v1/nodes` creates a Node (its `metadata.name`, labels and `spec.taints`);
- `GET /api/v1/nodes/{name}` reads one;
- `PATCH /api/v1/nodes/{name}` with `application/merge-patch+json` or `application/strategic-merge-patch+json`
  (the kubernetes client sends a dict body as the latter): maps merge and a null deletes a key; lists are replaced,
  as both patch types treat lists without a merge key (`spec.taints` has none); a `metadata.resourceVersion` in the
  patch that is not the Node's is refused with 409 Conflict, as the API server does. Any other content type is 415.

Requests need `Authorization: Bearer <token>` (401 otherwise). Errors are `Status` objects. Answers carry the
fields the client's V1Node model reads (apiVersion, kind, metadata with uid, resourceVersion, creationTimestamp);
`tests/contract/test_sandbox_kube_nodes.py` checks them against the client's models.

`POST /_sandbox/kubernetes/refuse` `{"status": 403, "count": 2}` makes the next PATCHes answer that status (the
API refusing a patch: RBAC, an admission webhook).
"""

from __future__ import annotations

import copy
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import Auth, Route, json_response, raw_body

PREFIX = "/_sandbox/kubernetes"
TOKEN = "sandbox-kube-token"
MERGE_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
MAX_NODES = 10_000
MAX_BODY = 1 << 20
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status(code: int, message: str) -> Response:
    """A Kubernetes `Status` answer."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "Unknown"),
        "code": code,
    }
    return json_response(body, code)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also what a strategic merge patch does on maps and on lists without a merge key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class KubeNodesModule(BaseModule):
    """Nodes by name, each with a resource version bumped on every change."""

    name = "kubernetes"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self.nodes: dict[str, dict[str, Any]] = {}
        self._version = 1000
        self._refuse: list[int] = []
        self.patches = 0

    def routes(self) -> list[Route]:
        nodes = f"{PREFIX}/api/v1/nodes"
        return [
            Route(nodes, ("POST",), self._create, Auth.NONE),
            Route(f"{nodes}/<name>", ("GET",), self._get, Auth.NONE),
            Route(f"{nodes}/<name>", ("PATCH",), self._patch, Auth.NONE),
            Route(f"{PREFIX}/refuse", ("POST",), self._refuse_next, Auth.NONE),
        ]

    def reset(self) -> None:
        with self.ctx.lock:
            self.nodes.clear()
            self._refuse.clear()
            self.patches = 0

    def dump(self) -> dict[str, Any]:
        with self.ctx.lock:
            return {"nodes": sorted(self.nodes)}

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("Authorization", "") == f"Bearer {TOKEN}"

    def _body(self, request: Request) -> Any:
        import json

        data = raw_body(request)
        if len(data) > MAX_BODY:
            return None
        try:
            return json.loads(data or b"null")
        except ValueError:
            return None

    def _stamp(self, node: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        node["metadata"]["resourceVersion"] = str(self._version)
        return node

    def _create(self, request: Request) -> Response:
        if not self._authorized(request):
            return status(401, "Unauthorized")
        body = self._body(request)
        body = body if isinstance(body, dict) else {}
        meta = body.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        name = meta.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            return status(422, "Node is invalid: metadata.name: a lowercase RFC 1123 subdomain is required")
        with self.ctx.lock:
            if name in self.nodes:
                return status(409, f'nodes "{name}" already exists')
            if len(self.nodes) >= MAX_NODES:
                return status(403, "too many nodes")
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "labels": dict(meta.get("labels") or {}),
                    "creationTimestamp": datetime.fromtimestamp(self.ctx.clock.now(), UTC).strftime(
                        "%Y-%m-%dT%H:%M:%SZ"
                    ),
                },
                "spec": {"taints": list((body.get("spec") or {}).get("taints") or [])},
                "status": {},
            }
            self.nodes[name] = self._stamp(node)
            return json_response(copy.deepcopy(node), 201)

    def _get(self, request: Request, name: str) -> Response:
        if not self._authorized(request):
            return status(401, "Unauthorized")
        with self.ctx.lock:
            node = self.nodes.get(name)
            if node is None:
                return status(404, f'nodes "{name}" not found')
            return json_response(copy.deepcopy(node))

    def _patch(self, request: Request, name: str) -> Response:
        if not self._authorized(request):
            return status(401, "Unauthorized")
        kind = (request.content_type or "").split(";")[0].strip().lower()
        if kind not in MERGE_TYPES:
            accepted = ", ".join(MERGE_TYPES)
            return status(415, f"the body of the request was in an unknown format - accepted media types: {accepted}")
        patch = self._body(request)
        if not isinstance(patch, dict):
            return status(400, "the patch is not a JSON object")
        with self.ctx.lock:
            self.patches += 1
            if self._refuse:
                code = self._refuse.pop(0)
                return status(code, f'nodes "{name}" is forbidden: patch refused by the sandbox')
            node = self.nodes.get(name)
            if node is None:
                return status(404, f'nodes "{name}" not found')
            meta = patch.get("metadata")
            version = meta.get("resourceVersion") if isinstance(meta, dict) else None
            if version is not None and version != node["metadata"]["resourceVersion"]:
                return status(409, f'Operation cannot be fulfilled on nodes "{name}": the object has been modified')
            updated = merge(node, patch)
            problem = _invalid(updated, name)
            if problem:
                return status(422, f'Node "{name}" is invalid: {problem}')
            self.nodes[name] = self._stamp(updated)
            return json_response(copy.deepcopy(updated))

    def _refuse_next(self, request: Request) -> Response:
        body = self._body(request)
        code = body.get("status") if isinstance(body, dict) else None
        count = body.get("count", 1) if isinstance(body, dict) else 1
        if not isinstance(code, int) or not 400 <= code <= 599 or not isinstance(count, int) or not 0 <= count <= 100:
            return status(400, "expected {status: 4xx|5xx, count: 0..100}")
        with self.ctx.lock:
            self._refuse = [code] * count
        return json_response({"refusing": count})


def _invalid(node: dict[str, Any], name: str) -> str | None:
    """What the API server's validation would refuse in a patched Node (the fields gpufarm writes)."""
    meta = node.get("metadata")
    if not isinstance(meta, dict) or meta.get("name") != name:
        return "metadata.name may not change"
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) and len(v) <= 63 for v in labels.values()):
        return "metadata.labels: values must be strings of at most 63 characters"
    taints = (node.get("spec") or {}).get("taints") or []
    if not isinstance(taints, list):
        return "spec.taints must be a list"
    return _taints_invalid(taints)


def _taints_invalid(taints: list[Any]) -> str | None:
    seen = set()
    for taint in taints:
        if not isinstance(taint, dict) or not isinstance(taint.get("key"), str):
            return "spec.taints: a taint needs a key"
        if taint.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            return f"spec.taints: effect {str(taint.get('effect'))[:20]!r} is not supported"
        if (taint["key"], taint["effect"]) in seen:
            return "spec.taints: taints must be unique by key and effect"
        seen.add((taint["key"], taint["effect"]))
    return None
