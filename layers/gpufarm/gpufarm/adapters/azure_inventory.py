"""Azure as an inventory source: NC / ND / NV virtual machines and the regional family core quotas.

Per sync, through azure-mgmt-compute, every read paged and none made per VM:

1. per subscription, `virtual_machines.list_all()`: every VM; those in a configured location whose size starts
   with a configured prefix (Standard_NC, Standard_ND, Standard_NV) are GPU nodes;
2. per location, `resource_skus.list(filter="location eq '<location>'")`: each GPU size's GPU count, vCPUs and
   quota family, kept for the adapter's life (sizes do not change under a running farm);
3. per subscription and location, `usage.list(location)`: the core limit and usage of each GPU family.

The GPU model comes from the size's name (Standard_ND96isr_H100_v5 -> H100; the older series that name no GPU
by a table). A size whose model or GPU count cannot be told is a node of unknown model, never another model's
GPUs. A part that fails (an error, throttling past azure-core's RetryPolicy, an answer of the wrong shape) is one
SourceError; a subscription whose VMs could not be listed contributes no node.

Credentials: azure-identity's DefaultAzureCredential (environment variables of a service principal or a federated
token, or a managed identity), unless one is passed in.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar

from gpufarm.core.config.inventory import AzureInventory
from gpufarm.core.kernel.ports import CloudQuota, SeenNode, SourceError, SourceReading

log = logging.getLogger(__name__)

SOURCE = "azure"
T = TypeVar("T")
# GPU names that appear as a token of a size's name (Standard_NC40ads_H100_v5, Standard_NV36ads_A10_v5).
GPU_TOKENS = frozenset({"H100", "H200", "A100", "A10", "T4", "V100", "L4", "L40S", "MI300X", "GB200", "GB300"})
# Sizes of series whose names carry no GPU token.
LEGACY_SIZES = (
    (re.compile(r"^Standard_ND96as?r_v4$"), "A100"),
    (re.compile(r"^Standard_ND40rs_v2$"), "V100"),
    (re.compile(r"^Standard_NC(6|12|24|24r)s_v3$"), "V100"),
    (re.compile(r"^Standard_NC(6|12|24|24r)s_v2$"), "P100"),
    (re.compile(r"^Standard_NV(12|24|48)s_v3$"), "M60"),
)
_THROTTLED = 429
# The most VMs or SKUs read from one list (a guard against an answer that never ends).
MAX_ITEMS = 200_000


class AnswerError(Exception):
    """An Azure answer without the fields gpufarm reads."""


def gpu_model_of(size: str) -> str | None:
    """The GPU model a VM size holds, from its name; None when the name does not say."""
    tokens = {t.upper() for t in size.split("_")[1:]}
    found = tokens & GPU_TOKENS
    if len(found) == 1:
        return found.pop()
    for pattern, model in LEGACY_SIZES:
        if pattern.match(size):
            return model
    return None


class AzureInventorySource:
    """InventorySource over the Azure Compute API (see the module docstring)."""

    name = SOURCE

    def __init__(
        self,
        settings: AzureInventory,
        environments: Collection[str],
        *,
        credential: Any = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.environments = frozenset(environments)
        self._credential = credential
        # Passed to ComputeManagementClient: a transport in tests, timeouts; the retry policy is set here.
        self._options = dict(client_options or {})
        self._clients: dict[str, Any] = {}
        # location -> size -> (GPU count, vCPUs, family); filled once per location.
        self._sizes: dict[str, dict[str, tuple[int, int, str]]] = {}
        self.calls = 0

    def read(self) -> SourceReading:
        """Every subscription and location once; a failed part is an error, the rest still counts."""
        self.calls = 0
        nodes: list[SeenNode] = []
        quotas: list[CloudQuota] = []
        errors: list[SourceError] = []
        sizes = {
            loc: _step(f"*/{loc}", "sizes", partial(self._gpu_sizes, loc), errors) for loc in self.settings.locations
        }
        for sub in self.settings.subscriptions:
            vms = _step(sub, "virtual machines", partial(self._vms, sub), errors)
            if vms is None:
                continue
            for vm in vms:
                loc = _location(vm)
                known = sizes.get(loc)
                if known is None:
                    continue  # the location's sizes failed: its VMs are left out rather than counted wrong
                nodes.append(self._node(sub, vm, known))
            if not self.settings.quotas:
                continue
            for loc in self.settings.locations:
                known = sizes.get(loc)
                if known is None:
                    continue
                quotas += _step(f"{sub}/{loc}", "usage", partial(self._usage, sub, loc, known), errors) or []
        return SourceReading(SOURCE, tuple(nodes), tuple(quotas), (), tuple(errors), self.calls)

    # -- the reads -----------------------------------------------------------------------------------------------

    def _vms(self, subscription: str) -> list[Mapping[str, Any]]:
        client = self._client(subscription)
        wanted = set(self.settings.locations)
        out = []
        for vm in self._paged(client.virtual_machines.list_all()):
            size = _size(vm)
            if _location(vm) in wanted and size.startswith(tuple(self.settings.size_prefixes)):
                out.append(vm)
        return out

    def _gpu_sizes(self, location: str) -> dict[str, tuple[int, int, str]]:
        known = self._sizes.get(location)
        if known is not None:
            return known
        client = self._client(self.settings.subscriptions[0])
        sizes: dict[str, tuple[int, int, str]] = {}
        for sku in self._paged(client.resource_skus.list(filter=f"location eq '{location}'")):
            name = sku.get("name")
            if sku.get("resourceType") != "virtualMachines" or not isinstance(name, str):
                continue
            if not name.startswith(tuple(self.settings.size_prefixes)):
                continue
            caps = {
                str(c.get("name")): str(c.get("value")) for c in sku.get("capabilities") or () if isinstance(c, Mapping)
            }
            sizes[name] = (_int(caps.get("GPUs")), _int(caps.get("vCPUs")), str(sku.get("family") or ""))
        self._sizes[location] = sizes
        return sizes

    def _usage(self, subscription: str, location: str, sizes: Mapping[str, tuple[int, int, str]]) -> list[CloudQuota]:
        families = {family for _, _, family in sizes.values() if family}
        client = self._client(subscription)
        out = []
        for usage in self._paged(client.usage.list(location)):
            family = _obj(usage.get("name")).get("value")
            if family not in families:
                continue
            limit, current = _number(usage.get("limit")), _number(usage.get("currentValue"))
            if limit is None or current is None:
                raise AnswerError(f"usage of {family} without limit or currentValue")
            out.append(CloudQuota(SOURCE, location, str(family), limit, current, "core"))
        return out

    # -- one VM ----------------------------------------------------------------------------------------------------

    def _node(self, subscription: str, vm: Mapping[str, Any], sizes: Mapping[str, tuple[int, int, str]]) -> SeenNode:
        props = _obj(vm.get("properties"))
        vm_id = str(props.get("vmId") or vm.get("id") or "")
        name = str(vm.get("name") or "")
        if not vm_id or not name:
            raise AnswerError("a virtual machine without vmId or name")
        size = _size(vm)
        gpus, vcpus, family = sizes.get(size, (0, 0, ""))
        model = gpu_model_of(size) if gpus > 0 else None  # no GPU count: unknown, whatever the name says
        tags = _obj(vm.get("tags"))
        computer = _obj(props.get("osProfile")).get("computerName")
        names = [vm_id, name] + ([str(computer)] if computer else [])
        env = tags.get(self.settings.environment_tag)
        if env not in self.environments:
            env = self.settings.default_environment
        cluster = tags.get(self.settings.cluster_tag)
        return SeenNode(
            source=SOURCE,
            id=vm_id,
            names=tuple(dict.fromkeys(names)),
            region=_location(vm),
            instance_type=size,
            family=family,
            gpu_model=model,
            gpu_count=gpus if model else 0,
            vcpus=vcpus,
            environment=env,
            cluster=str(cluster) if cluster else None,
        )

    # -- plumbing --------------------------------------------------------------------------------------------------

    def _client(self, subscription: str) -> Any:
        client = self._clients.get(subscription)
        if client is None:
            from azure.mgmt.compute import ComputeManagementClient

            if self._credential is None:
                from azure.identity import DefaultAzureCredential

                self._credential = DefaultAzureCredential()
            options = {"retry_total": self.settings.max_retries, "retry_backoff_factor": 0.8} | self._options
            client = ComputeManagementClient(self._credential, subscription, **options)
            self._clients[subscription] = client
        return client

    def _paged(self, pager: Any) -> Iterable[Mapping[str, Any]]:
        """Items of a pager as JSON mappings, counting one call per page."""
        count = 0
        for page in pager.by_page():
            self.calls += 1
            for item in page:
                count += 1
                if count > MAX_ITEMS:
                    raise AnswerError(f"more than {MAX_ITEMS} items in one list")
                yield _plain(item)


def _plain(item: Any) -> Mapping[str, Any]:
    # azure-mgmt-compute's models are mappings over the REST names (vmId, hardwareProfile): read as JSON.
    if isinstance(item, Mapping):
        return item
    raise AnswerError(f"an item of type {type(item).__name__}")


def _size(vm: Mapping[str, Any]) -> str:
    size = _obj(_obj(vm.get("properties")).get("hardwareProfile")).get("vmSize")
    return size if isinstance(size, str) else ""


def _location(vm: Mapping[str, Any]) -> str:
    location = vm.get("location")
    return location.lower().replace(" ", "") if isinstance(location, str) else ""


def _int(text: str | None) -> int:
    try:
        value = int(text or "0")
    except ValueError:
        return 0
    return value if 0 <= value < 1_000_000 else 0


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e12
    return float(value) if ok else None


def _obj(value: Any) -> Mapping[str, Any]:
    """A JSON object of an answer, or an empty one where the answer has none (or something else)."""
    return value if isinstance(value, Mapping) else {}


def _step(where: str, what: str, read: Callable[[], T], errors: list[SourceError]) -> T | None:
    """One part of the reading; an SDK, network or answer error becomes a SourceError and None."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - whatever azure-core raised, the part is skipped and reported
        status = getattr(getattr(exc, "response", None), "status_code", None) or getattr(exc, "status_code", None)
        text = str(exc).splitlines()[0] if str(exc) else ""
        message = f"{what}: {type(exc).__name__}{f' {status}' if status else ''}: {text}"[:300]
        log.warning("azure %s %s skipped: %s", where, what, message)
        errors.append(SourceError(SOURCE, where, message, throttled=status == _THROTTLED))
        return None
