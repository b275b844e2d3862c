"""AWS as an inventory source: EC2 through moto, Service Quotas and malformed answers through botocore's Stubber."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws

from gpufarm.adapters.aws_inventory import AwsInventorySource, _botocore_factory, quota_family
from gpufarm.core.config.inventory import AwsInventory

ENVS = ("cloud", "hpc")
AMI = "ami-12c6146b"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


def launch(region: str, itype: str, count: int, **tags: str) -> list[str]:
    ec2 = boto3.client("ec2", region_name=region)
    spec: dict[str, Any] = {}
    if tags:
        spec["TagSpecifications"] = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
    answer = ec2.run_instances(ImageId=AMI, InstanceType=itype, MinCount=count, MaxCount=count, **spec)
    return [i["InstanceId"] for i in answer["Instances"]]


def settings(**values: Any) -> AwsInventory:
    base: dict[str, Any] = {"regions": ["us-east-1"], "capacity_reservations": False, "quotas": False}
    return AwsInventory.model_validate(base | values)


def env_tag(env: str) -> dict[str, str]:
    return {"gpufarm-environment": env}


class Counting:
    """A client that counts calls per operation and can fail some of them."""

    def __init__(self, client: Any, fail: dict[str, str] | None = None) -> None:
        self.client, self.fail, self.counts = client, fail or {}, {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def call(**kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            if name in self.fail:
                code = self.fail[name]
                raise ClientError({"Error": {"Code": code, "Message": f"{code} (test)"}}, name)
            return method(**kwargs)

        return call


def test_gpu_instances_of_every_region_with_model_count_and_environment(aws: None) -> None:
    p5 = launch("us-east-1", "p5.48xlarge", 2, **env_tag("cloud"), Name="trainer-1")
    untagged = launch("us-east-1", "g5.xlarge", 1)
    launch("us-east-1", "m5.large", 3)  # no GPU: not listed
    p4d = launch("us-west-2", "p4d.24xlarge", 1, **env_tag("hpc"), **{"gpufarm-cluster": "usw2"})
    launch("us-west-2", "p5.48xlarge", 1, **env_tag("somewhere-else"))
    source = AwsInventorySource(settings(regions=["us-east-1", "us-west-2"], default_environment="cloud"), ENVS)
    reading = source.read()
    assert reading.errors == ()
    nodes = {n.id: n for n in reading.nodes}
    assert len(nodes) == 5
    first = nodes[p5[0]]
    assert (first.gpu_model, first.gpu_count, first.vcpus, first.family) == ("H100", 8, 192, "P")
    assert first.environment == "cloud" and first.region == "us-east-1" and not first.agent
    assert "trainer-1" in first.names and any(n.startswith("ip-") for n in first.names)
    assert (nodes[untagged[0]].gpu_model, nodes[untagged[0]].gpu_count) == ("A10G", 1)
    assert nodes[untagged[0]].environment == "cloud"  # the default: no tag
    assert (nodes[p4d[0]].environment, nodes[p4d[0]].cluster, nodes[p4d[0]].gpu_model) == ("hpc", "usw2", "A100")
    # An environment the farm does not define falls back to the default too.
    assert sorted(n.environment or "" for n in reading.nodes).count("cloud") == 4
    # Paged reads, none per instance: the types and the instances of each region.
    assert reading.calls == 4


def test_instance_types_are_read_once_and_the_calls_do_not_grow_with_instances(aws: None) -> None:
    launch("us-east-1", "p5.48xlarge", 12)
    clients: dict[str, Counting] = {}

    def factory(service: str, region: str) -> Any:
        clients[service] = Counting(boto3.client(service, region_name=region))
        return clients[service]

    source = AwsInventorySource(settings(), ENVS, client_factory=factory)
    assert len(source.read().nodes) == 12
    assert len(source.read().nodes) == 12
    assert clients["ec2"].counts == {"describe_instance_types": 1, "describe_instances": 2}


def test_a_throttled_region_is_skipped_and_reported_and_the_others_still_count(aws: None) -> None:
    launch("us-east-1", "p5.48xlarge", 1)
    launch("us-west-2", "p5.48xlarge", 1)

    def factory(service: str, region: str) -> Any:
        fail = {"describe_instances": "RequestLimitExceeded"} if region == "us-west-2" else {}
        return Counting(boto3.client(service, region_name=region), fail)

    reading = AwsInventorySource(settings(regions=["us-east-1", "us-west-2"]), ENVS, client_factory=factory).read()
    assert [n.region for n in reading.nodes] == ["us-east-1"]
    (error,) = reading.errors
    assert (error.where, error.throttled) == ("us-west-2", True)
    assert "RequestLimitExceeded" in error.message


def test_the_clients_retry_throttling_in_botocores_standard_mode(aws: None) -> None:
    client = _botocore_factory(4, 7.0)("ec2", "eu-west-1")
    # botocore keeps max_attempts as total_max_attempts (the first try included).
    assert client.meta.config.retries == {"total_max_attempts": 5, "mode": "standard"}
    assert client.meta.config.read_timeout == 7.0
    assert client.meta.region_name == "eu-west-1"


def test_quota_families() -> None:
    assert [quota_family(t) for t in ("p5.48xlarge", "p6-b200.48xlarge", "g6e.xlarge", "vt1.3xlarge", "m5.large")] == [
        "P",
        "P",
        "G",
        "G",
        "",
    ]


# -- through botocore's Stubber: shapes checked against the service models --------------------------------------


def stubbed(service: str) -> tuple[Any, Stubber]:
    client = boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


TYPES = {
    "InstanceTypes": [
        {
            "InstanceType": "p5.48xlarge",
            "VCpuInfo": {"DefaultVCpus": 192},
            "GpuInfo": {"Gpus": [{"Name": "H100", "Manufacturer": "NVIDIA", "Count": 8}]},
        },
        # GPU information missing from the answer: its instances are unknown, never another model's GPUs.
        {"InstanceType": "p5e.48xlarge", "VCpuInfo": {"DefaultVCpus": 192}},
    ]
}


def instances(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "Reservations": [
            {"Instances": [{"InstanceId": iid, "InstanceType": itype, "PrivateDnsName": f"ip-{iid}.ec2.internal"}]}
            for iid, itype in pairs
        ]
    }


def test_malformed_answers_make_unknown_nodes_quotas_and_reservations_are_read() -> None:
    ec2, ec2_stub = stubbed("ec2")
    sq, sq_stub = stubbed("service-quotas")
    ec2_stub.add_response("describe_instance_types", TYPES)
    # p5en is not among the types the region listed (a family gpufarm does not know yet).
    ec2_stub.add_response(
        "describe_instances",
        instances(("i-0001", "p5.48xlarge"), ("i-0002", "p5e.48xlarge")) | {"NextToken": "page-2"},
    )
    ec2_stub.add_response("describe_instances", instances(("i-0003", "p5en.48xlarge")))
    ec2_stub.add_response(
        "describe_capacity_reservations",
        {
            "CapacityReservations": [
                {
                    "CapacityReservationId": "cr-0001",
                    "InstanceType": "p5.48xlarge",
                    "TotalInstanceCount": 4,
                    "AvailableInstanceCount": 3,
                    "ReservationType": "capacity-block",
                },
                {"CapacityReservationId": "cr-0002", "InstanceType": "m5.large", "TotalInstanceCount": 9},
            ]
        },
    )
    sq_stub.add_client_error("get_service_quota", "NoSuchResourceException", "never applied")
    sq_stub.add_response("get_aws_default_service_quota", {"Quota": {"QuotaCode": "L-417A185B", "Value": 384.0}})
    clients = {"ec2": ec2, "service-quotas": sq}
    source = AwsInventorySource(
        settings(capacity_reservations=True, quotas=True, instance_types=["p5.*", "p5e.*", "p5en.*"]),
        ENVS,
        client_factory=lambda service, region: clients[service],
    )
    with ec2_stub, sq_stub:
        reading = source.read()
    assert reading.errors == ()
    models = {n.id: (n.gpu_model, n.gpu_count) for n in reading.nodes}
    assert models == {"i-0001": ("H100", 8), "i-0002": (None, 0), "i-0003": (None, 0)}
    (quota,) = reading.quotas
    assert (quota.family, quota.limit, quota.used, quota.unit) == ("P", 384.0, 384.0, "vcpu")
    (block,) = reading.reservations
    assert (block.kind, block.total, block.available, block.gpu_model) == ("capacity-block", 4, 3, "H100")
    assert reading.calls == 6


def test_a_quota_that_cannot_be_read_leaves_the_instances_counted() -> None:
    ec2, ec2_stub = stubbed("ec2")
    sq, sq_stub = stubbed("service-quotas")
    ec2_stub.add_response("describe_instance_types", TYPES)
    ec2_stub.add_response("describe_instances", instances(("i-0001", "p5.48xlarge")))
    sq_stub.add_client_error("get_service_quota", "AccessDeniedException", "not allowed")
    clients = {"ec2": ec2, "service-quotas": sq}
    source = AwsInventorySource(settings(quotas=True), ENVS, client_factory=lambda s, r: clients[s])
    with ec2_stub, sq_stub:
        reading = source.read()
    assert [n.id for n in reading.nodes] == ["i-0001"] and reading.quotas == ()
    (error,) = reading.errors
    assert error.message.startswith("quotas: AccessDeniedException") and not error.throttled


def test_a_page_token_that_repeats_fails_the_region_instead_of_looping() -> None:
    ec2, stub = stubbed("ec2")
    stub.add_response("describe_instance_types", TYPES)
    for _ in range(2):
        stub.add_response("describe_instances", instances(("i-1", "p5.48xlarge")) | {"NextToken": "same"})
    source = AwsInventorySource(settings(), ENVS, client_factory=lambda s, r: ec2)
    with stub:
        reading = source.read()
    assert reading.nodes == () and "repeats" in reading.errors[0].message


def test_a_fifth_of_calls_throttled_is_absorbed_by_the_retries() -> None:
    # SimulatedAws answers through moto's stubber on its own clients: no mock_aws around it (both would answer).
    from gpufarm_sandbox.clouds import SimulatedAws

    clouds = SimulatedAws(throttle_share=0.2, max_retries=4, seed=3)
    ids = clouds.launch("us-east-1", "p5.48xlarge", ["a", "b", "c"], {"gpufarm-environment": "cloud"})
    clouds.calls = 0
    reading = AwsInventorySource(settings(quotas=True), ENVS, client_factory=clouds.client).read()
    assert sorted(n.id for n in reading.nodes) == sorted(ids) and reading.errors == ()
    assert clouds.calls > reading.calls  # throttled calls were retried
    (p_quota,) = [q for q in reading.quotas if q.family == "P"]
    assert (p_quota.limit, p_quota.used) == (384.0, 576.0)
