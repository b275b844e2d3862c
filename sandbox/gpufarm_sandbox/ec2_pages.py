"""EC2's DescribeInstances answered from a recorded list of instances, as EC2 pages it (seeding a large farm fast).

Launching a farm's instances in moto one tag call at a time, then letting moto render pages of a thousand, took
benchmarks/scale.py 16 minutes for 2,000 instances. A farm seeded here instead is a list of instances recorded per
region; a DescribeInstances request is answered in EC2's own XML with the request's filters (`instance-type`,
`instance-state-name`), `MaxResults` and `NextToken` applied, so gpufarm's AWS source and botocore's parser read it
exactly as they read EC2. Every other EC2 call (the instance types, the quotas, the reservations) is answered as
before (gpufarm_sandbox.clouds.SimulatedAws).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

NAMESPACE = "http://ec2.amazonaws.com/doc/2016-11-15/"
OWNER = "123456789012"
LAUNCHED = "2026-11-01T00:00:00.000Z"
MAX_RESULTS = 1000  # EC2's bound on MaxResults


@dataclass(frozen=True)
class RecordedInstance:
    """One running instance as DescribeInstances shows it."""

    instance_id: str
    instance_type: str
    private_ip: str
    zone: str
    tags: tuple[tuple[str, str], ...] = field(default=())
    state: str = "running"

    @property
    def private_dns(self) -> str:
        """`ip-10-0-0-1.ec2.internal` (us-east-1) or `ip-10-0-0-1.us-west-2.compute.internal`, as EC2 names it."""
        host = "ip-" + self.private_ip.replace(".", "-")
        region = self.zone[:-1]
        return f"{host}.ec2.internal" if region == "us-east-1" else f"{host}.{region}.compute.internal"


def instances(
    region: str, instance_type: str, names: Sequence[str], tags: Mapping[str, str], *, first: int = 0
) -> list[RecordedInstance]:
    """Running instances of one type, one per name (its Name tag) with these tags; ids and addresses from `first`."""
    out = []
    for k, name in enumerate(names, start=first):
        out.append(
            RecordedInstance(
                instance_id=f"i-{0x5EED0000000 + k:017x}",
                instance_type=instance_type,
                private_ip=f"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}",
                zone=f"{region}a",
                tags=(("Name", name), *sorted(tags.items())),
            )
        )
    return out


def describe_instances(recorded: Sequence[RecordedInstance], body: bytes) -> bytes:
    """EC2's XML answer to the DescribeInstances request `body` (its form-encoded query) over `recorded`."""
    query = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
    filters = _filters(query)
    wanted = [i for i in recorded if _matches(i, filters)]
    size = min(MAX_RESULTS, int(query.get("MaxResults", [str(MAX_RESULTS)])[0]))
    start = int(query.get("NextToken", ["0"])[0] or 0)
    page = wanted[start : start + size]
    following = start + size
    token = f"<nextToken>{following}</nextToken>" if following < len(wanted) else ""
    reservations = "".join(_reservation(i) for i in page)
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="{NAMESPACE}">'
        f"<requestId>gpufarm-recorded</requestId><reservationSet>{reservations}</reservationSet>{token}"
        "</DescribeInstancesResponse>"
    ).encode()


def _filters(query: Mapping[str, list[str]]) -> dict[str, set[str]]:
    """`Filter.N.Name` / `Filter.N.Value.M` as name -> values."""
    out: dict[str, set[str]] = {}
    for key, values in query.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "Filter" and parts[2] == "Name":
            prefix = f"Filter.{parts[1]}.Value."
            out[values[0]] = {v for k, vs in query.items() if k.startswith(prefix) for v in vs}
    return out


def _matches(instance: RecordedInstance, filters: Mapping[str, set[str]]) -> bool:
    fields = {"instance-type": instance.instance_type, "instance-state-name": instance.state}
    for name, values in filters.items():
        if name not in fields:
            raise ValueError(f"the recorded instances answer no filter {name!r}")
        if fields[name] not in values:
            return False
    return True


def _reservation(instance: RecordedInstance) -> str:
    state_code = {"pending": 0, "running": 16, "stopping": 64, "stopped": 80}.get(instance.state, 16)
    return (
        f"<item><reservationId>r-{instance.instance_id[2:]}</reservationId><ownerId>{OWNER}</ownerId><groupSet/>"
        "<instancesSet><item>"
        f"<instanceId>{instance.instance_id}</instanceId><imageId>ami-12c6146b</imageId>"
        f"<instanceState><code>{state_code}</code><name>{instance.state}</name></instanceState>"
        f"<privateDnsName>{instance.private_dns}</privateDnsName>"
        f"<instanceType>{escape(instance.instance_type)}</instanceType><launchTime>{LAUNCHED}</launchTime>"
        f"<placement><availabilityZone>{instance.zone}</availabilityZone><tenancy>default</tenancy></placement>"
        f"<privateIpAddress>{instance.private_ip}</privateIpAddress>"
        f"<tagSet>{_tags(instance.tags)}</tagSet>"
        "</item></instancesSet></item>"
    )


def _tags(tags: Iterable[tuple[str, str]]) -> str:
    return "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in tags)
