"""A stubbed Azure for the Azure inventory source: an azure-core transport answering the Compute REST API.

gpufarm.adapters.azure_inventory talks to Azure through azure-mgmt-compute; giving its client this transport
(`client_options={"transport": ...}`) keeps the SDK's whole pipeline (request building, bearer-token policy,
RetryPolicy, paging by nextLink, deserialisation) and replaces only the HTTP exchange. The answers follow the
Compute REST API's shapes (virtualMachines list, resource SKUs, usages):

- `StubTransport(answer)`: answers each request through `answer(method, path, query) -> (status, body, headers)`;
  `recorded(files)` answers from recorded JSON files (tests/fixtures/azure/);
- `AzureFarm`: a generated subscription (VMs, GPU sizes, family quotas) with fault injection (throttling or
  failing a share of requests), for `gpufarm demo`, the local host and benchmarks/scale.py.

Nothing here reaches a network; `calls` counts the requests answered.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import requests
from azure.core.credentials import AccessToken
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest._requests_basic import RestRequestsTransportResponse

ARM = "https://management.azure.com"
# (status, JSON body, extra headers)
Answer = tuple[int, Any, Mapping[str, str]]
Answerer = Callable[[str, str, Mapping[str, str]], Answer]
_PAGE = 200
_VM_TYPE = "Microsoft.Compute/virtualMachines"


class StubCredential:
    """A TokenCredential that hands out a fixed token (the stub checks none)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        """A token valid for an hour."""
        return AccessToken("stub-token", int((datetime.now(UTC) + timedelta(hours=1)).timestamp()))


class StubTransport(HttpTransport):  # type: ignore[type-arg]
    """An azure-core transport answering from a function instead of the network."""

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.calls = 0
        self._lock = threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:
        """Answer one request."""
        parts = urlsplit(request.url)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        with self._lock:
            self.calls += 1
        status, body, headers = self.answer(request.method, parts.path, query)
        response = requests.Response()
        response.status_code = status
        response._content = json.dumps(body).encode()
        response._content_consumed = True  # the body is all here: closing has no stream to release
        response.headers.update({"Content-Type": "application/json", **headers})
        response.url = request.url
        response.reason = "OK" if status < 400 else "Error"
        answer = RestRequestsTransportResponse(request=request, internal_response=response)  # type: ignore[no-untyped-call]
        answer._content = response._content
        return answer

    def open(self) -> None:
        """Nothing to open."""

    def close(self) -> None:
        """Nothing to close."""

    def __enter__(self) -> StubTransport:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()

    def sleep(self, duration: float) -> None:
        """RetryPolicy's backoff: no real sleep against a stub."""


def recorded(files: Mapping[tuple[str, str], Sequence[Path]]) -> Answerer:
    """Answers from recorded JSON files: (path, $filter or $skiptoken or "") -> the files answered in turn."""
    served: dict[tuple[str, str], int] = {}

    def answer(method: str, path: str, query: Mapping[str, str]) -> Answer:
        key = (path, query.get("$skiptoken") or query.get("$filter") or "")
        bodies = files.get(key)
        if bodies is None:
            return 404, {"error": {"code": "NotFound", "message": f"no recording for {key}"}}, {}
        n = served.get(key, 0)
        served[key] = n + 1
        data = json.loads(bodies[min(n, len(bodies) - 1)].read_text())
        return int(data.get("status", 200)), data["body"], data.get("headers", {})

    return answer


# -- a generated subscription ---------------------------------------------------------------------------------

# Size -> (GPUs, vCPUs, quota family), as resource SKUs report them.
SIZES = {
    "Standard_ND96isr_H100_v5": (8, 96, "standardNDSH100v5Family"),
    "Standard_NC40ads_H100_v5": (1, 40, "standardNCadsH100v5Family"),
    "Standard_ND96amsr_A100_v4": (8, 96, "standardNDAMSv4_A100Family"),
    "Standard_NC24ads_A100_v4": (1, 24, "standardNCADSA100v4Family"),
    "Standard_NV36ads_A10_v5": (1, 36, "StandardNVADSA10v5Family"),
}


@dataclass
class Vm:
    """One VM of the stubbed subscription."""

    name: str
    size: str
    location: str = "eastus"
    tags: dict[str, str] = field(default_factory=dict)
    vm_id: str = ""


@dataclass
class AzureFarm:
    """A subscription's GPU VMs, sizes and quotas, answered through StubTransport; faults by share of requests."""

    subscription: str
    vms: list[Vm] = field(default_factory=list)
    # family -> core limit per location
    limits: dict[str, int] = field(default_factory=dict)
    # Share of requests answered 429 (Retry-After 0) or 500.
    throttle: float = 0.0
    fail: float = 0.0
    seed: int = 12
    _random: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)  # noqa: S311 - fault injection, not security
        self.transport = StubTransport(self.answer)

    def answer(self, method: str, path: str, query: Mapping[str, str]) -> Answer:
        """The Compute REST API's answer to one request."""
        roll = self._random.random()
        if roll < self.throttle:
            return 429, {"error": {"code": "TooManyRequests", "message": "throttled (stub)"}}, {"Retry-After": "0"}
        if roll < self.throttle + self.fail:
            return 500, {"error": {"code": "InternalServerError", "message": "failed (stub)"}}, {}
        base = f"/subscriptions/{self.subscription}/providers/Microsoft.Compute"
        if path == f"{base}/virtualMachines":
            return self._vm_page(int(query.get("$skiptoken") or 0))
        if path == f"{base}/skus":
            location = query.get("$filter", "").split("'")[1] if "'" in query.get("$filter", "") else ""
            return 200, {"value": [_sku(size, location) for size in SIZES]}, {}
        if path.startswith(f"{base}/locations/") and path.endswith("/usages"):
            location = path.split("/")[-2]
            return 200, {"value": self._usages(location)}, {}
        return 404, {"error": {"code": "NotFound", "message": path}}, {}

    def _vm_page(self, start: int) -> Answer:
        page = self.vms[start : start + _PAGE]
        body: dict[str, Any] = {"value": [self._vm_json(vm) for vm in page]}
        if start + _PAGE < len(self.vms):
            query = urlencode({"api-version": "2026-04-01", "$skiptoken": str(start + _PAGE)})
            body["nextLink"] = (
                f"{ARM}/subscriptions/{self.subscription}/providers/Microsoft.Compute/virtualMachines?{query}"
            )
        return 200, body, {}

    def _vm_json(self, vm: Vm) -> dict[str, Any]:
        # A stable vmId per name (the same in every run), shaped as Azure's.
        vm_id = vm.vm_id or str(uuid.UUID(bytes=hashlib.blake2b(vm.name.encode(), digest_size=16).digest(), version=4))
        return {
            "id": f"/subscriptions/{self.subscription}/resourceGroups/gpu/providers/{_VM_TYPE}/{vm.name}",
            "name": vm.name,
            "type": "Microsoft.Compute/virtualMachines",
            "location": vm.location,
            "tags": vm.tags,
            "properties": {
                "vmId": vm_id,
                "hardwareProfile": {"vmSize": vm.size},
                "osProfile": {"computerName": vm.name},
                "provisioningState": "Succeeded",
            },
        }

    def _usages(self, location: str) -> list[dict[str, Any]]:
        used: dict[str, int] = {}
        for vm in self.vms:
            if vm.location == location and vm.size in SIZES:
                _, cores, family = SIZES[vm.size]
                used[family] = used.get(family, 0) + cores
        families = sorted({f for _, _, f in SIZES.values()})
        return [
            {
                "unit": "Count",
                "currentValue": used.get(family, 0),
                "limit": self.limits.get(family, 0),
                "name": {"value": family, "localizedValue": f"{family} vCPUs"},
            }
            for family in [*families, "cores"]
        ]


def _sku(size: str, location: str) -> dict[str, Any]:
    gpus, vcpus, family = SIZES[size]
    return {
        "resourceType": "virtualMachines",
        "name": size,
        "tier": "Standard",
        "size": size.removeprefix("Standard_"),
        "family": family,
        "locations": [location],
        "capabilities": [{"name": "vCPUs", "value": str(vcpus)}, {"name": "GPUs", "value": str(gpus)}],
        "restrictions": [],
    }
