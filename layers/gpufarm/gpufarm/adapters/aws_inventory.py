"""AWS as an inventory source: EC2 GPU instances, capacity reservations and the On-Demand vCPU quotas, per region.

Per region and sync, every read is paged and none is made per instance:

1. `DescribeInstanceTypes` filtered by the configured GPU type patterns (p5.*, g6e.*): the region's GPU types with
   their GPU model, GPU count and vCPUs, kept for the adapter's life (types do not change under a running farm);
2. `DescribeInstances` filtered by those types (in chunks of filter values) and by state pending / running;
3. `DescribeCapacityReservations` (capacity reservations and capacity blocks) for those types, when enabled;
4. Service Quotas `GetServiceQuota` for the On-Demand vCPU quota of each GPU family seen (P; G and VT), the AWS
   default when no value was ever applied; usage is the vCPUs of the instances found.

Each step of a region that fails (an error, throttling past botocore's standard retries, an answer of the wrong
shape) is one SourceError and the rest of the reading stands: a region whose instances could not be listed
contributes no node, so nothing is reported missing, marked down or untagged because AWS did not answer.
An instance whose type has no GPU information is a node of unknown model, never counted as another model's GPU.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from gpufarm.core.config.inventory import AwsInventory
from gpufarm.core.kernel.ports import CapacityReservation, CloudQuota, SeenNode, SourceError, SourceReading

log = logging.getLogger(__name__)

SOURCE = "aws"
# Service Quotas codes of EC2's On-Demand vCPU limits for the GPU families (the family letter of the type).
QUOTA_CODES = {"P": "L-417A185B", "G": "L-DB2E81BA"}
_FAMILY_OF_PREFIX = {"p": "P", "g": "G", "vt": "G"}
_LETTERS = re.compile(r"^[a-z]+")
# Filter values per DescribeInstances call (EC2 accepts up to 200 per filter; fewer keep requests small).
TYPES_PER_CALL = 100
PAGE = 1000
_THROTTLING = frozenset(
    {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException", "SlowDown"}
)
_STATES = ("pending", "running")
# A client for (service, region): botocore's by default, a moto-backed or stubbed one in tests.
ClientFactory = Callable[[str, str], Any]
T = TypeVar("T")


class AnswerError(Exception):
    """An AWS answer without the fields gpufarm reads."""


def quota_family(instance_type: str) -> str:
    """The On-Demand quota family of an instance type (`P`, `G`), or "" for families that hold no GPU quota here."""
    letters = _LETTERS.match(instance_type)
    return _FAMILY_OF_PREFIX.get(letters.group(0), "") if letters else ""


class AwsInventorySource:
    """InventorySource over EC2 and Service Quotas (see the module docstring)."""

    name = SOURCE

    def __init__(
        self,
        settings: AwsInventory,
        environments: Collection[str],
        *,
        client_factory: ClientFactory | None = None,
        http_timeout: float = 20.0,
    ) -> None:
        self.settings = settings
        self.environments = frozenset(environments)
        # Built on the first read: a runtime that never syncs never loads botocore for this.
        self._factory = client_factory
        self._http_timeout = http_timeout
        self._clients: dict[tuple[str, str], Any] = {}
        # region -> instance type -> (model or None, GPU count, vCPUs); filled once per region.
        self._types: dict[str, dict[str, tuple[str | None, int, int]]] = {}
        self._lock = threading.Lock()
        self.calls = 0

    def read(self) -> SourceReading:
        """Every configured region once; a region's failed step is an error, the other regions still count."""
        self.calls = 0
        nodes: list[SeenNode] = []
        quotas: list[CloudQuota] = []
        reservations: list[CapacityReservation] = []
        errors: list[SourceError] = []
        for region in self.settings.regions:
            found = _step(region, "instances", partial(self._instances, region), errors)
            if found is None:
                continue  # this region is skipped and reported; the others still count
            nodes += found
            # Reservations and quotas are extra information: their failure leaves the instances counted.
            if self.settings.capacity_reservations:
                reserved = _step(region, "capacity reservations", partial(self._reservations, region), errors)
                reservations += reserved or []
            if self.settings.quotas:
                quotas += _step(region, "quotas", partial(self._quotas, region, found), errors) or []
        return SourceReading(SOURCE, tuple(nodes), tuple(quotas), tuple(reservations), tuple(errors), self.calls)

    # -- the steps of one region ---------------------------------------------------------------------------------

    def _instances(self, region: str) -> list[SeenNode]:
        types = self._gpu_types(region)
        ec2 = self._client("ec2", region)
        nodes: list[SeenNode] = []
        names = sorted(types)
        for start in range(0, len(names), TYPES_PER_CALL):
            filters = [
                {"Name": "instance-type", "Values": names[start : start + TYPES_PER_CALL]},
                {"Name": "instance-state-name", "Values": list(_STATES)},
            ]
            for page in self._pages(ec2.describe_instances, {"Filters": filters, "MaxResults": PAGE}):
                for reservation in _list(page, "Reservations"):
                    nodes.extend(self._node(region, i, types) for i in _list(reservation, "Instances"))
        return nodes

    def _gpu_types(self, region: str) -> dict[str, tuple[str | None, int, int]]:
        with self._lock:
            known = self._types.get(region)
        if known is not None:
            return known
        ec2 = self._client("ec2", region)
        filters = [{"Name": "instance-type", "Values": list(self.settings.instance_types)}]
        types: dict[str, tuple[str | None, int, int]] = {}
        for page in self._pages(ec2.describe_instance_types, {"Filters": filters, "MaxResults": 100}):
            for item in _list(page, "InstanceTypes"):
                name = item.get("InstanceType")
                if isinstance(name, str) and self._wanted(name):
                    types[name] = _gpu_info(item)
        with self._lock:
            self._types[region] = types
        return types

    def _reservations(self, region: str) -> list[CapacityReservation]:
        ec2 = self._client("ec2", region)
        types = self._gpu_types(region)
        args = {"Filters": [{"Name": "state", "Values": ["active"]}], "MaxResults": PAGE}
        out = []
        for page in self._pages(ec2.describe_capacity_reservations, args):
            for item in _list(page, "CapacityReservations"):
                itype = item.get("InstanceType")
                if not isinstance(itype, str) or not self._wanted(itype):
                    continue
                model, gpus, _ = types.get(itype, (None, 0, 0))
                out.append(
                    CapacityReservation(
                        source=SOURCE,
                        region=region,
                        id=str(item.get("CapacityReservationId", "")),
                        instance_type=itype,
                        kind="capacity-block" if item.get("ReservationType") == "capacity-block" else "reservation",
                        total=_count(item.get("TotalInstanceCount")),
                        available=_count(item.get("AvailableInstanceCount")),
                        gpu_model=model,
                        gpus_per_instance=gpus,
                    )
                )
        return out

    def _quotas(self, region: str, nodes: Sequence[SeenNode]) -> list[CloudQuota]:
        used: dict[str, int] = {}
        for node in nodes:
            if node.family:
                used[node.family] = used.get(node.family, 0) + node.vcpus
        families = {quota_family(t) for t in self._gpu_types(region)} | set(used)
        client = self._client("service-quotas", region)
        out = []
        for family in sorted(f for f in families if f in QUOTA_CODES):
            code = QUOTA_CODES[family]
            try:
                answer = self._call(client.get_service_quota, {"ServiceCode": "ec2", "QuotaCode": code})
            except Exception as exc:
                if _code(exc) != "NoSuchResourceException":
                    raise
                # Never changed from the AWS default: Service Quotas answers that through the default's call.
                answer = self._call(client.get_aws_default_service_quota, {"ServiceCode": "ec2", "QuotaCode": code})
            value = answer.get("Quota", {}).get("Value") if isinstance(answer.get("Quota"), Mapping) else None
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise AnswerError(f"quota {code} answered without a value")
            out.append(CloudQuota(SOURCE, region, family, float(value), float(used.get(family, 0)), "vcpu"))
        return out

    # -- one instance ----------------------------------------------------------------------------------------------

    def _node(self, region: str, item: Mapping[str, Any], types: Mapping[str, tuple[str | None, int, int]]) -> SeenNode:
        iid = item.get("InstanceId")
        itype = item.get("InstanceType")
        if not isinstance(iid, str) or not iid or not isinstance(itype, str):
            raise AnswerError("an instance without InstanceId or InstanceType")
        tags = {
            str(t.get("Key")): str(t.get("Value", ""))
            for t in item.get("Tags") or ()
            if isinstance(t, Mapping) and t.get("Key")
        }
        # A type the region's GPU types did not list (a new family, a malformed answer): its GPUs are unknown.
        model, gpus, vcpus = types.get(itype, (None, 0, 0))
        dns = item.get("PrivateDnsName")
        names = [iid]
        if isinstance(dns, str) and dns:
            names += [dns, dns.split(".", 1)[0]]
        if tags.get("Name"):
            names.append(tags["Name"])
        env = tags.get(self.settings.environment_tag)
        if env not in self.environments:
            env = self.settings.default_environment
        return SeenNode(
            source=SOURCE,
            id=iid,
            names=tuple(dict.fromkeys(names)),
            region=region,
            instance_type=itype,
            family=quota_family(itype),
            gpu_model=model,
            gpu_count=gpus if model else 0,
            vcpus=vcpus,
            environment=env,
            cluster=tags.get(self.settings.cluster_tag) or None,
        )

    # -- plumbing --------------------------------------------------------------------------------------------------

    def _wanted(self, instance_type: str) -> bool:
        return any(fnmatch.fnmatchcase(instance_type, p) for p in self.settings.instance_types)

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                if self._factory is None:
                    self._factory = _botocore_factory(self.settings.max_retries, self._http_timeout)
                client = self._clients[key] = self._factory(service, region)
        return client

    def _call(self, method: Callable[..., Any], kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls += 1
        answer = method(**kwargs)
        if not isinstance(answer, Mapping):
            raise AnswerError("an answer that is not an object")
        return answer

    def _pages(self, method: Callable[..., Any], kwargs: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
        token: str | None = None
        seen: set[str] = set()
        while True:
            page = self._call(method, {**kwargs, **({"NextToken": token} if token else {})})
            yield page
            token = page.get("NextToken") or None
            if token is None:
                return
            if not isinstance(token, str) or token in seen:
                raise AnswerError("a page token that repeats")  # never loop on a broken paginator
            seen.add(token)


def _step(region: str, what: str, read: Callable[[], list[T]], errors: list[SourceError]) -> list[T] | None:
    """One step of a region's reading; an SDK, network or answer error becomes a SourceError and None."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - whatever AWS or botocore raised, the step is skipped and reported
        errors.append(_error(region, what, exc))
        return None


def _gpu_info(item: Mapping[str, Any]) -> tuple[str | None, int, int]:
    """(model, GPU count, vCPUs) of an instance type; model None when the answer carries no usable GPU info."""
    vcpus = _count((item.get("VCpuInfo") or {}).get("DefaultVCpus"))
    gpus = (item.get("GpuInfo") or {}).get("Gpus")
    if not isinstance(gpus, list) or not gpus:
        return None, 0, vcpus
    names = {str(g.get("Name", "")).strip().upper() for g in gpus if isinstance(g, Mapping)}
    count = sum(_count(g.get("Count")) for g in gpus if isinstance(g, Mapping))
    if len(names) != 1 or "" in names or count < 1:
        return None, 0, vcpus  # mixed or nameless GPUs: say unknown rather than guess
    return names.pop(), count, vcpus


def _list(page: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = page.get(key, [])
    if not isinstance(value, list):
        raise AnswerError(f"{key} is not a list")
    return [v for v in value if isinstance(v, Mapping)]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1_000_000 else 0


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and isinstance(response.get("Error"), Mapping):
        return str(response["Error"].get("Code", ""))
    return ""


def _error(region: str, what: str, exc: BaseException) -> SourceError:
    code = _code(exc)
    text = str(exc).splitlines()[0] if str(exc) else ""
    message = f"{what}: {code or type(exc).__name__}: {text}"[:300]
    log.warning("aws %s %s skipped: %s", region, what, message)
    return SourceError(SOURCE, region, message, throttled=code in _THROTTLING)


def _botocore_factory(max_retries: int, http_timeout: float) -> ClientFactory:
    """Clients from one botocore session, with the standard retry mode (throttling backs off and retries)."""
    import botocore.session
    from botocore.config import Config

    session = botocore.session.get_session()
    config = Config(
        connect_timeout=5.0,
        read_timeout=http_timeout,
        retries={"max_attempts": max_retries, "mode": "standard"},  # retries after the first try
    )

    def make(service: str, region: str) -> Any:
        return session.create_client(service, region_name=region, config=config)

    return make
