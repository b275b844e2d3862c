"""Simulated clouds for the inventory sources: AWS through moto in-process, Azure through the stubbed transport.

`gpufarm local`, `gpufarm demo` and benchmarks/scale.py give gpufarm's real AWS and Azure inventory sources
(gpufarm.adapters.aws_inventory, azure_inventory) clients that answer from here instead of the clouds:

- AWS: botocore clients whose requests moto's own stubber answers in this process (EC2 instances with moto's GPU
  instance types); nothing is patched process-wide, so no other botocore client of the process is affected. moto
  has no Service Quotas for EC2, so the P and G On-Demand vCPU quotas are answered here in Service Quotas' own
  JSON shape (`quota_limits`). `faults` makes a region's calls fail with an error code (RequestLimitExceeded for
  throttling) as EC2 sends it, `throttle_share` a share of all calls. Not for use inside moto's `mock_aws`, whose
  process-wide stubber would answer each request a second time. moto takes seconds to render a page of a thousand
  instances (its serializer, and each instance's tags looked up among all tags: 5-20 s a page on a loaded machine,
  where EC2 answers in about one), so with `cache_reads` each EC2 Describe request is answered by moto once and
  then from its recorded answer, byte for byte, until any other EC2 action changes moto's state: `prime` a seeded
  farm's reads once and the reads measured cost gpufarm's own work (botocore sending and parsing EC2's XML) alone.
  A large farm's instances are better recorded than launched (`record`, gpufarm_sandbox.ec2_pages): a region's
  DescribeInstances pages are then answered in EC2's XML from that list, and moto never holds them;
- Azure: an AzureFarm (gpufarm_sandbox.azurestub) per subscription.

`clouds_for(base_url)` holds one LocalClouds per local environment, which the local seams hand the runtime as its
`inventory_sources` (gpufarm_sandbox.localhost.seams).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel.ports import InventorySource
from gpufarm_sandbox.azurestub import Answer, AzureFarm, StubCredential, StubTransport
from gpufarm_sandbox.ec2_pages import RecordedInstance, describe_instances, instances

ACCOUNT_KEY = "AKIAGPUFARMLOCAL0001"  # moto keys its accounts by access key; nothing here reaches AWS
SECRET_KEY = "gpufarm-local-not-a-secret"  # noqa: S105 - moto's stand-in credential
AMI = "ami-12c6146b"  # one of moto's stock images
# The AWS defaults of the P and G On-Demand vCPU quotas, as Service Quotas reports them for a new account.
DEFAULT_QUOTAS = {"L-417A185B": 384.0, "L-DB2E81BA": 768.0}
_QUOTA_NAMES = {
    "L-417A185B": "Running On-Demand P instances",
    "L-DB2E81BA": "Running On-Demand G and VT instances",
}
_LAUNCH_CHUNK = 250
_JSON = "application/x-amz-json-1.1"


def _fault(request: Any, fault: str, *, quotas: bool) -> Any:
    """A simulated error answer: Service Quotas' JSON, or EC2's XML (throttling as a 503)."""
    if quotas:
        body = json.dumps({"__type": fault, "message": f"{fault} (simulated)"}).encode()
        return _response(request.url, 400, _JSON, body)
    xml = (
        f"<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>{fault}</Code>"
        f"<Message>{fault} (simulated)</Message></Error></Errors><RequestID>gpufarm-sim</RequestID></Response>"
    )
    status = 503 if fault == "RequestLimitExceeded" else 400
    return _response(request.url, status, "text/xml", xml.encode())


def _response(url: str, status: int, content_type: str, body: bytes) -> Any:
    from botocore.awsrequest import AWSResponse
    from botocore.compat import HTTPHeaders

    headers = HTTPHeaders()
    headers["Content-Type"] = content_type
    return AWSResponse(url, status, headers, _Raw(body))


class _Raw:
    """A response body botocore reads through stream()."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **kwargs: Any) -> Iterable[bytes]:
        yield self._body


@dataclass
class SimulatedAws:
    """EC2 (moto) and EC2's Service Quotas for gpufarm's AWS inventory source, with fault injection per region."""

    quota_limits: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    # region -> the error code every EC2 and Service Quotas call of that region answers with.
    faults: dict[str, str] = field(default_factory=dict)
    # region -> capacity reservations (EC2's fields: capacityReservationId, instanceType, totalInstanceCount,
    # availableInstanceCount, reservationType default | capacity-block).
    reservations: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    # A moto server (`python -m moto.server`) to send EC2's calls to, so its work runs in another process (the
    # benchmark); None: moto's stubber answers them in this process.
    endpoint_url: str | None = None
    # A share of every call answered RequestLimitExceeded (throttling), whatever the region; seeded.
    throttle_share: float = 0.0
    seed: int = 12
    # botocore's standard-mode retries of the clients handed out.
    max_retries: int = 1
    # Answer a repeated EC2 Describe request from moto's recorded answer while no other EC2 action ran since.
    cache_reads: bool = False
    # region -> instances whose DescribeInstances pages are answered from this list, not moto (see `record`).
    recorded: dict[str, list[RecordedInstance]] = field(default_factory=dict)
    calls: int = 0
    # EC2 calls moto answered (not from the recorded answers), and the seconds they took.
    moto_calls: int = 0
    moto_s: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._random = random.Random(self.seed)  # noqa: S311 - fault injection, not security
        # Made on the first client: a local environment whose sync never reads AWS never loads moto.
        self._session: Any = None
        self._moto: Any = None
        # (region, URL, request body) -> (status, Content-Type, body) of moto's answer to an EC2 Describe request.
        self._answers: dict[tuple[str, str, bytes], tuple[int, str, bytes]] = {}
        # The request of this thread's call in flight that moto is answering, and when it was sent.
        self._pending = threading.local()

    def client(self, service: str, region: str) -> Any:
        """A botocore client for the inventory source (its client_factory), answered in this process."""
        from botocore.config import Config

        with self._lock:
            if self._session is None:
                import botocore.session
                from moto.core.botocore_stubber import BotocoreStubber

                self._moto = BotocoreStubber()
                self._moto.enabled = True
                self._session = botocore.session.get_session()
        # moto takes its time over a page of a thousand instances: the timeout is generous.
        retries = {"max_attempts": self.max_retries, "mode": "standard"}
        config = Config(retries=retries, connect_timeout=2, read_timeout=120)  # type: ignore[arg-type]
        client = self._session.create_client(
            service,
            region_name=region,
            aws_access_key_id=ACCOUNT_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=config,
            endpoint_url=self.endpoint_url if service == "ec2" else None,
        )
        client.meta.events.register_first("before-send", partial(self._answer, region))
        if service == "ec2":
            client.meta.events.register_first("before-parse", self._record)
        return client

    def prime(self, read: Callable[[], object]) -> float:
        """Run `read` (a seeded farm's AWS reading) once so its answers are recorded; returns the seconds it took."""
        started = time.perf_counter()
        read()
        return time.perf_counter() - started

    def launch(self, region: str, instance_type: str, names: Iterable[str], tags: Mapping[str, str]) -> list[str]:
        """Run instances (one per name, its Name tag) with these tags; returns their instance ids."""
        ec2 = self.client("ec2", region)
        ids: list[str] = []
        pending = list(names)
        with self._lock:
            faults, self.faults = self.faults, {}
        try:
            for start in range(0, len(pending), _LAUNCH_CHUNK):
                chunk = pending[start : start + _LAUNCH_CHUNK]
                answer = ec2.run_instances(
                    ImageId=AMI, InstanceType=instance_type, MinCount=len(chunk), MaxCount=len(chunk)
                )
                created = [i["InstanceId"] for i in answer["Instances"]]
                for iid, name in zip(created, chunk, strict=True):
                    ec2.create_tags(Resources=[iid], Tags=[{"Key": "Name", "Value": name}, *_tag_list(tags)])
                ids += created
        finally:
            with self._lock:
                self.faults = faults
        return ids

    def record(self, region: str, instance_type: str, names: Iterable[str], tags: Mapping[str, str]) -> list[str]:
        """Running instances (one per name, its Name tag) with these tags, answered from a recorded list
        (gpufarm_sandbox.ec2_pages) instead of launched in moto: seconds for thousands. The region's DescribeInstances
        then answers these only; returns their instance ids."""
        with self._lock:
            first = sum(len(found) for found in self.recorded.values())
            added = instances(region, instance_type, list(names), tags, first=first)
            self.recorded.setdefault(region, []).extend(added)
        return [i.instance_id for i in added]

    def _answer(self, region: str, request: Any, **kwargs: Any) -> Any:
        self._pending.request = None  # a try that never got an answer (a connection error) records nothing
        with self._lock:
            self.calls += 1
            fault = self.faults.get(region)
            if fault is None and self.throttle_share and self._random.random() < self.throttle_share:
                fault = "RequestLimitExceeded"
        target = str(request.headers.get("X-Amz-Target", b"") or "")
        if fault is not None:
            return _fault(request, fault, quotas="ServiceQuotas" in target)
        if "ServiceQuotas" in target:
            return self._quota(request)
        body = _body(request)
        here = self._answered_here(region, request, body)
        if here is not None:
            return here
        key = (region, str(request.url), body)
        with self._lock:
            if not body.startswith(b"Action=Describe"):
                self._answers.clear()  # moto's state may change: no recorded answer stands
            recorded = self._answers.get(key) if self.cache_reads else None
        if recorded is not None:
            return _response(request.url, recorded[0], recorded[1], recorded[2])
        self._pending.request = (key, time.perf_counter())
        if self.endpoint_url is not None:
            return None  # sent to the moto server
        return self._moto(kwargs.get("event_name", "before-send"), request)

    def _answered_here(self, region: str, request: Any, body: bytes) -> Any:
        """What the sandbox answers itself, not moto: a recorded instance list, capacity reservations; else None."""
        listed = self.recorded.get(region)
        if listed is not None and body.startswith(b"Action=DescribeInstances&"):
            return _response(request.url, 200, "text/xml;charset=UTF-8", describe_instances(listed, body))
        if b"Action=DescribeCapacityReservations" in body:
            return self._reservations(region, request)
        return None

    def _record(self, response_dict: Mapping[str, Any], **kwargs: Any) -> None:
        # before-parse: moto's answer to this thread's request (none when a recorded answer was given).
        pending = getattr(self._pending, "request", None)
        if pending is None:
            return
        self._pending.request = None
        key, sent = pending
        status = int(response_dict.get("status_code", 0))
        headers = response_dict.get("headers") or {}
        body = response_dict.get("body")
        with self._lock:
            self.moto_calls += 1
            self.moto_s += time.perf_counter() - sent
            if self.cache_reads and status == 200 and isinstance(body, bytes) and key[2].startswith(b"Action=Describe"):
                self._answers[key] = (status, str(headers.get("Content-Type", "text/xml")), body)

    def _reservations(self, region: str, request: Any) -> Any:
        # moto has no capacity reservations: answered here, in EC2's XML, from `reservations`.
        items = "".join(
            "<item>"
            + "".join(f"<{key}>{value}</{key}>" for key, value in item.items())
            + "<state>active</state></item>"
            for item in self.reservations.get(region, [])
        )
        xml = (
            "<?xml version='1.0' encoding='UTF-8'?><DescribeCapacityReservationsResponse "
            "xmlns='http://ec2.amazonaws.com/doc/2016-11-15/'><requestId>gpufarm-sim</requestId>"
            f"<capacityReservationSet>{items}</capacityReservationSet></DescribeCapacityReservationsResponse>"
        )
        return _response(request.url, 200, "text/xml", xml.encode())

    def _quota(self, request: Any) -> Any:
        body = json.loads(request.body or b"{}")
        code = str(body.get("QuotaCode", ""))
        if body.get("ServiceCode") != "ec2" or code not in self.quota_limits:
            error = {"__type": "NoSuchResourceException", "message": f"no quota {code}"}
            return _response(request.url, 400, _JSON, json.dumps(error).encode())
        quota = {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaCode": code,
            "QuotaName": _QUOTA_NAMES.get(code, code),
            "Value": self.quota_limits[code],
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
        }
        return _response(request.url, 200, _JSON, json.dumps({"Quota": quota}).encode())


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


@dataclass
class LocalClouds:
    """The simulated clouds of one local environment, and the inventory sources on them."""

    aws: SimulatedAws = field(default_factory=SimulatedAws)
    azure: dict[str, AzureFarm] = field(default_factory=dict)

    def azure_farm(self, subscription: str) -> AzureFarm:
        """The stubbed subscription (made on first use)."""
        farm = self.azure.get(subscription)
        if farm is None:
            farm = self.azure[subscription] = AzureFarm(subscription)
        return farm

    def sources(self, farm: FarmConfig) -> list[InventorySource]:
        """gpufarm's AWS and Azure sources as the farm file configures them, on these clouds."""
        from gpufarm.adapters.aws_inventory import AwsInventorySource
        from gpufarm.adapters.azure_inventory import AzureInventorySource

        settings = farm.inventory
        out: list[InventorySource] = []
        if settings.aws is not None and settings.aws.enabled:
            out.append(AwsInventorySource(settings.aws, farm.environments, client_factory=self.aws.client))
        if settings.azure is not None and settings.azure.enabled:
            subs = settings.azure.subscriptions
            transport = _routed_transport({s: self.azure_farm(s) for s in subs})
            out.append(
                AzureInventorySource(
                    settings.azure,
                    farm.environments,
                    credential=StubCredential(),
                    client_options={"transport": transport, "retry_backoff_factor": 0.0},
                )
            )
        return out


def _routed_transport(farms: Mapping[str, AzureFarm]) -> StubTransport:
    """One transport for several stubbed subscriptions: each request goes to its subscription's AzureFarm."""

    def answer(method: str, path: str, query: Mapping[str, str]) -> Answer:
        parts = path.split("/")
        farm = farms.get(parts[2]) if len(parts) > 2 else None
        if farm is None:
            return 404, {"error": {"code": "SubscriptionNotFound", "message": path}}, {}
        return farm.answer(method, path, query)

    return StubTransport(answer)


_clouds: dict[str, LocalClouds] = {}
_clouds_lock = threading.Lock()


def clouds_for(base_url: str) -> LocalClouds:
    """The simulated clouds of the local environment whose sandbox is at base_url (made on first use)."""
    with _clouds_lock:
        clouds = _clouds.get(base_url)
        if clouds is None:
            clouds = _clouds[base_url] = LocalClouds()
        return clouds


def _body(request: Any) -> bytes:
    raw = request.body or b""
    return raw.encode() if isinstance(raw, str) else bytes(raw)
