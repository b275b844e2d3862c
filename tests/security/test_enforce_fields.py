"""Hand-edited incident fields never reach scontrol as anything but the names gpufarm checked.

The Slurm enforcer turns a lease's fields into `scontrol` arguments (no shell). Anyone with edit rights on incidents
may set hosts, team, requester or expiry to anything; an argument like `Nodes=ALL`, `Users=root`, a second
`key=value` in one value, a newline, or a reservation name outside gpufarm's prefix would reach the cluster's
scheduler. Each such lease is skipped (said once) or its value dropped; every argument of every operation is one
`Key=value` of checked characters (docs/security.md, "Hand-edited fields and the Slurm enforcer")."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest

from gpufarm_node.enforce.config import SlurmNames
from gpufarm_node.enforce.run import SlurmEnforcer

pytestmark = pytest.mark.security

NAMES = SlurmNames(frozenset({"onprem-hpc"}), {"U0000000001": "alice"}, {"nlp": "nlp"})
KEYWORDS = {"create", "reservation", "update", "delete"}
ARG = re.compile(r"^(ReservationName|Nodes|Users|Accounts|StartTime|EndTime|Duration|Flags)[-]?=[A-Za-z0-9_.,:-]+$")
HOSTILE = [
    {"hosts": ["hpc-a-01 Users=root"]},
    {"hosts": ["ALL"]},
    {"hosts": ["hpc-a-01\nNodes=ALL"]},
    {"hosts": ["hpc-a-[01-99]"]},
    {"hosts": "hpc-a-01,hpc-a-02"},
    {"team": "nlp Accounts=root"},
    {"team": "nlp,root"},
    {"requester": "U0000000001 Users=root"},
    {"requester": "root"},
    {"environment": "onprem-hpc\n"},
    {"expires_at": "2026-12-10T00:00:00 Flags=MAINT"},
    {"expires_at": "9" * 5000},
    {"phase": "allocated\nFlags=MAINT"},
]


class Slurm:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def reservations(self) -> str:
        return "ReservationName=gpufarm-ir-1;rm StartTime=x Nodes=hpc-a-01 Users=a Accounts=(null)\n"

    def nodes(self) -> str:
        return "NodeName=hpc-a-01 Arch=x86_64\nNodeName=hpc-a-02 Arch=x86_64\nNodeName=ALL Arch=x86_64\n"

    def apply(self, args: Sequence[str]) -> None:
        self.calls.append(tuple(args))


def _incident(ir: int, changes: dict[str, Any]) -> dict[str, Any]:
    values = {
        "phase": "allocated",
        "environment": "onprem-hpc",
        "team": "nlp",
        "requester": "U0000000001",
        "hosts": ["hpc-a-01"],
        "expires_at": "2030-01-01T00:00:00Z",
    } | changes
    fields = {k: {"type": "textbox", "value": v} for k, v in values.items()}
    return {"id": str(ir), "attributes": {"public_id": ir, "state": "active", "fields": fields}}


class Leases:
    def live_incidents(self) -> list[dict[str, Any]]:
        return [_incident(n, change) for n, change in enumerate(HOSTILE, start=100)]


def test_hostile_fields_reach_scontrol_only_as_checked_names() -> None:
    slurm = Slurm()
    report = SlurmEnforcer(Leases(), slurm, NAMES).run_once()
    assert report.error is None
    for call in slurm.calls:
        for arg in call:
            assert arg in KEYWORDS or ARG.match(arg), (call, arg)
        assert re.fullmatch(r"ReservationName=gpufarm-ir-[0-9]+", call[1 if call[0] != "create" else 2])
    nodes = {a for call in slurm.calls for a in call if a.startswith("Nodes=")}
    users = {a for call in slurm.calls for a in call if a.startswith(("Users=", "Accounts="))}
    assert nodes <= {"Nodes=hpc-a-01", "Nodes=hpc-a-01,hpc-a-02"}
    assert users <= {"Users=alice", "Accounts=nlp"}
    skipped = [n for n in report.notices if "is not enforced" in n]
    assert len(skipped) >= 4, report.notices
