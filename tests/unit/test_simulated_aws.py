"""The simulated AWS of benchmarks and local runs: moto's answers to EC2 Describe requests recorded and replayed.

benchmarks/scale.py primes a seeded farm's EC2 reads once so the syncs it measures pay gpufarm's work (botocore
sending and parsing) and not moto's rendering; a recorded answer must never outlive a change to moto's state, nor
hide a fault. A farm's instances may also be recorded instead of launched (SimulatedAws.record): the AWS source
must read them exactly as it reads moto's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufarm.adapters.aws_inventory import AwsInventorySource
from gpufarm.core.config.inventory import AwsInventory
from gpufarm_sandbox.clouds import SimulatedAws

pytestmark = pytest.mark.unit

ENVS = ("cloud",)
SETTINGS = AwsInventory.model_validate({"regions": ["us-east-1"], "capacity_reservations": False, "quotas": False})


def _read(clouds: SimulatedAws) -> list[str]:
    reading = AwsInventorySource(SETTINGS, ENVS, client_factory=clouds.client).read()
    assert reading.errors == ()
    return sorted(n.id for n in reading.nodes)


def test_a_primed_read_is_answered_from_moto_s_recorded_answers_until_moto_s_state_changes() -> None:
    clouds = SimulatedAws(cache_reads=True)
    ids = clouds.launch("us-east-1", "p5.48xlarge", ["a", "b", "c"], {"gpufarm-environment": "cloud"})
    assert clouds.prime(lambda: _read(clouds)) >= 0
    answered = clouds.moto_calls
    # moto's backend is one per process: other tests in this worker may have left instances in the region too.
    assert set(ids) <= set(_read(clouds))
    assert clouds.moto_calls == answered  # a fresh source (a new container) replayed every answer
    clouds.client("ec2", "us-east-1").terminate_instances(InstanceIds=[ids[0]])
    after = set(_read(clouds))
    assert ids[0] not in after and set(ids[1:]) <= after  # the termination dropped every recorded answer
    assert clouds.moto_calls > answered + 1


def test_faults_still_answer_when_a_recorded_answer_exists() -> None:
    clouds = SimulatedAws(cache_reads=True)
    clouds.launch("us-east-1", "p5.48xlarge", ["a"], {"gpufarm-environment": "cloud"})
    _read(clouds)
    clouds.faults["us-east-1"] = "UnauthorizedOperation"
    reading = AwsInventorySource(SETTINGS, ENVS, client_factory=clouds.client).read()
    assert reading.nodes == () and "UnauthorizedOperation" in reading.errors[0].message


def test_without_cache_reads_moto_answers_every_request() -> None:
    clouds = SimulatedAws()
    clouds.launch("us-east-1", "p5.48xlarge", ["a"], {"gpufarm-environment": "cloud"})
    before = clouds.moto_calls
    _read(clouds)
    _read(clouds)
    assert clouds.moto_calls - before == 4  # DescribeInstanceTypes and DescribeInstances, twice


def _nodes(clouds: SimulatedAws, region: str) -> list[tuple[object, ...]]:
    settings = AwsInventory.model_validate({"regions": [region], "capacity_reservations": False, "quotas": False})
    reading = AwsInventorySource(settings, ENVS, client_factory=clouds.client).read()
    assert reading.errors == ()
    # Everything but the ids and addresses, which moto and the recorded list each choose.
    return sorted(
        (n.names[-1], n.region, n.instance_type, n.family, n.gpu_model, n.gpu_count, n.vcpus, n.environment, n.cluster)
        for n in reading.nodes
    )


def test_recorded_instances_read_as_moto_s_launched_ones() -> None:
    names = [f"node-{i:04d}" for i in range(1_100)]  # two pages of 1,000
    tags = {"gpufarm-environment": "cloud", "gpufarm-cluster": "c1"}
    launched = SimulatedAws()
    launched.launch("ap-south-1", "p5.48xlarge", names, tags)
    launched.launch("ap-south-1", "p4d.24xlarge", ["other"], {})
    recorded = SimulatedAws()
    ids = recorded.record("ap-south-1", "p5.48xlarge", names, tags)
    recorded.record("ap-south-1", "p4d.24xlarge", ["other"], {})
    assert len(set(ids)) == len(names)
    assert _nodes(recorded, "ap-south-1") == _nodes(launched, "ap-south-1")
    reading = AwsInventorySource(
        AwsInventory.model_validate({"regions": ["ap-south-1"], "capacity_reservations": False, "quotas": False}),
        ENVS,
        client_factory=recorded.client,
    ).read()
    node = next(n for n in reading.nodes if n.id == ids[0])
    assert node.names == (ids[0], "ip-10-0-0-0.ap-south-1.compute.internal", "ip-10-0-0-0", "node-0000")
    assert recorded.moto_calls == 2  # the instance types, once per reading: every page came from the list


def test_recorded_instances_answer_the_state_filter() -> None:
    clouds = SimulatedAws()
    clouds.record("ca-central-1", "p5.48xlarge", ["a"], {"gpufarm-environment": "cloud"})
    clouds.recorded["ca-central-1"][0] = replace(clouds.recorded["ca-central-1"][0], state="stopped")
    assert _nodes(clouds, "ca-central-1") == []
