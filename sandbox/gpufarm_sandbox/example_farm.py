"""The example farm's people and hosts (config/farm.example.yaml), the same everywhere: the demo, `gpufarm local`
and the tests that drive them.

People: alice (nlp), bob (vision) and carol (speech) are researchers, members of their teams' user groups
(gpufarm_sandbox.emulator.slack_workspace); dana is the GPU operator, the one member of the operators' user group.
Hosts: two dedicated pools (onprem-hpc, cloud-aws) and a shared one (shared-slices), the last with a host whose two
A100 are each in MIG 7 x 1g.10gb.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Person:
    """A Slack user of the example workspace."""

    id: str
    name: str
    real_name: str


ALICE = Person("U0000000001", "alice", "Alice Kim (NLP)")
BOB = Person("U0000000003", "bob", "Bob Lee (Vision)")
CAROL = Person("U0000000004", "carol", "Carol Park (Speech)")
DANA = Person("U0000000005", "dana", "Dana Choi (GPU operator)")
PEOPLE = (ALICE, BOB, CAROL, DANA)
OPERATORS = (DANA,)

OPERATORS_GROUP = "S0000000001"
OPERATORS_CHANNEL = "C0000000001"
RESEARCH_CHANNEL = "C0000000002"

# (name, model, GPUs, environment, cluster): two dedicated pools and a sliced one.
HOSTS: tuple[tuple[str, str, int, str, str], ...] = (
    ("hpc-a-01", "H100", 8, "onprem-hpc", "hpc-a"),
    ("hpc-a-02", "H100", 8, "onprem-hpc", "hpc-a"),
    ("hpc-b-01", "H100", 8, "onprem-hpc", "hpc-b"),
    ("hpc-b-02", "H100", 8, "onprem-hpc", "hpc-b"),
    ("aws-p5-01", "H100", 8, "cloud-aws", "aws-use1"),
    ("aws-p4d-01", "A100", 8, "cloud-aws", "aws-use1"),
    ("k8s-a100-01", "A100", 8, "shared-slices", "k8s-shared"),
    ("k8s-l4-01", "L4", 8, "shared-slices", "k8s-shared"),
)
# The shared pool's sliced host: (name, environment, cluster, model, GPUs, MIG profile, slices per GPU).
SLICED_HOST = ("k8s-mig-01", "shared-slices", "k8s-shared", "A100", 2, "1g.10gb", 7)


def workspace_seed() -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The sandbox's Slack seed endpoints (path -> body): the people, the two channels, the operators' group."""
    return {
        "/_sandbox/slack/users": {"users": [{"id": p.id, "name": p.name, "real_name": p.real_name} for p in PEOPLE]},
        "/_sandbox/slack/channels": {
            "channels": [{"id": OPERATORS_CHANNEL, "name": "gpu-ops"}, {"id": RESEARCH_CHANNEL, "name": "ml-research"}]
        },
        "/_sandbox/slack/usergroups": {
            "usergroups": [
                {
                    "id": OPERATORS_GROUP,
                    "handle": "gpu-operators",
                    "name": "GPU operators",
                    "users": [p.id for p in OPERATORS],
                }
            ]
        },
    }


def seed_workspace(base_url: str, *, timeout: float = 30.0) -> None:
    """Seed the sandbox at base_url with the example workspace; RuntimeError if it refuses."""
    for path, body in workspace_seed().items():
        request = urllib.request.Request(  # noqa: S310 - the local sandbox's own http URL
            base_url.rstrip("/") + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        if status != 200:
            raise RuntimeError(f"sandbox refused the seed data at {path}: {raw[:200].decode('utf-8', 'replace')}")


def host_specs(profiles: dict[str, str] | None = None) -> list[Any]:
    """The example farm's hosts as simulated nodes (gpufarm_sandbox.simfarm.HostSpec), each with its workload
    profile (`idle` unless `profiles` names another)."""
    from gpufarm_sandbox.simfarm import HostSpec

    profiles = profiles or {}
    specs = [
        HostSpec(name, env, cluster, model, gpus, profile=profiles.get(name, "idle"))
        for name, model, gpus, env, cluster in HOSTS
    ]
    name, env, cluster, model, gpus, mig_profile, slices = SLICED_HOST
    specs.append(HostSpec(name, env, cluster, model, gpus, mig_profile, slices, profiles.get(name, "idle")))
    return specs
