"""The Slurm enforcer against a real single-controller Slurm on loopback (gpufarm_sandbox.slurmlocal): a lease's
reservation is made, its user's job runs in it and another user's is refused; it follows the lease when it shrinks,
is extended or changes hands, and goes when the lease ends; drift is repaired; scontrol failing applies nothing,
the lag is reported, and the next run catches up. Skipped, with the reason, where Slurm is not installed."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufarm_node.enforce.config import SlurmNames
from gpufarm_node.enforce.run import SlurmEnforcer
from gpufarm_node.enforce.scontrol import Scontrol
from gpufarm_sandbox import slurmlocal

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(slurmlocal.missing() is not None, reason=f"no local Slurm: {slurmlocal.missing()}"),
]

NODES = ("hpc-a-01", "hpc-a-02")
ALICE, ERIN = "U0000000001", "U0000000007"
NAMES = SlurmNames(frozenset({"onprem-hpc"}), {ALICE: slurmlocal.LEASE_USER}, {"nlp": "nlp"})


@pytest.fixture(scope="module")
def slurm() -> Iterator[slurmlocal.LocalSlurm]:
    with slurmlocal.local_slurm(NODES) as cluster:
        yield cluster


@pytest.fixture
def cluster(slurm: slurmlocal.LocalSlurm) -> Iterator[slurmlocal.LocalSlurm]:
    """The module's Slurm, left without reservations or jobs by each test."""
    yield slurm
    slurm.call("scancel", "--user", slurmlocal.LEASE_USER, check=False)
    slurm.call("scancel", "--user", slurmlocal.OTHER_USER, check=False)
    for line in slurm.reservations().splitlines():
        if line.startswith("ReservationName="):
            slurm.call("scontrol", "delete", line.split()[0], check=False)


class Leases:
    """Live incidents as Datadog's search returns them (the read path itself is the demo stage's test)."""

    def __init__(self) -> None:
        self.incidents: dict[int, dict[str, Any]] = {}

    def hold(self, ir: int, hosts: Sequence[str], requester: str = ALICE, days: float = 3) -> None:
        end = (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0)
        values = {
            "phase": "allocated",
            "environment": "onprem-hpc",
            "team": "nlp",
            "requester": requester,
            "hosts": list(hosts),
            "expires_at": end.isoformat(),
        }
        fields = {k: {"type": "textbox", "value": v} for k, v in values.items()}
        self.incidents[ir] = {"id": str(ir), "attributes": {"public_id": ir, "state": "active", "fields": fields}}

    def end(self, ir: int) -> None:
        self.incidents.pop(ir)

    def live_incidents(self) -> list[dict[str, Any]]:
        return list(self.incidents.values())


class Operators:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.lag: list[float] = []

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None:
        self.lag.append(values["gpufarm.enforce.lag_seconds"])

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        self.events.append(f"{title}: {text}")


def _enforcer(cluster: slurmlocal.LocalSlurm, leases: Leases, operators: Operators, **kw: Any) -> SlurmEnforcer:
    return SlurmEnforcer(leases, kw.pop("scontrol", None) or Scontrol(env=cluster.env), NAMES, operators, **kw)


def _fields(cluster: slurmlocal.LocalSlurm, name: str) -> dict[str, str]:
    for line in cluster.reservations().splitlines():
        if line.startswith(f"ReservationName={name} "):
            return dict(token.partition("=")[::2] for token in line.split())
    return {}


def test_a_lease_is_a_reservation_its_user_runs_in_and_another_user_is_refused(cluster: slurmlocal.LocalSlurm) -> None:
    leases, operators = Leases(), Operators()
    enforcer = _enforcer(cluster, leases, operators)
    leases.hold(12, ["hpc-a-01"])
    report = enforcer.run_once()
    assert report.converged and [op.name for op in report.applied] == ["gpufarm-ir-12"]
    held = _fields(cluster, "gpufarm-ir-12")
    assert held["Nodes"] == "hpc-a-01" and held["Users"] == slurmlocal.LEASE_USER and held["State"] == "ACTIVE"
    accepted, job = cluster.submit(slurmlocal.LEASE_USER, "gpufarm-ir-12")
    assert accepted and cluster.wait_job(job) == "COMPLETED"
    refused, answer = cluster.submit(slurmlocal.OTHER_USER, "gpufarm-ir-12")
    assert not refused and "Access denied" in answer
    # Outside the reservation the other user waits: the node is reserved.
    accepted, job = cluster.submit(slurmlocal.OTHER_USER, node="hpc-a-01")
    assert accepted and cluster.job_state(job) == "PENDING"
    assert enforcer.run_once().applied == []  # nothing changed, nothing done

    leases.end(12)
    report = enforcer.run_once()
    assert [(op.kind.value, op.name) for op in report.applied] == [("delete", "gpufarm-ir-12")]
    assert _fields(cluster, "gpufarm-ir-12") == {}
    assert cluster.wait_job(job) == "COMPLETED"  # the node is free: the waiting job ran


def test_the_reservation_follows_a_shrink_an_extension_and_a_change_of_hands(cluster: slurmlocal.LocalSlurm) -> None:
    leases, operators = Leases(), Operators()
    enforcer = _enforcer(cluster, leases, operators)
    leases.hold(13, NODES, days=2)
    enforcer.run_once()
    assert _fields(cluster, "gpufarm-ir-13")["Nodes"] == "hpc-a-[01-02]"
    leases.hold(13, ["hpc-a-02"], days=5)
    report = enforcer.run_once()
    assert report.converged and [op.why for op in report.applied] == ["the lease changed"]
    held = _fields(cluster, "gpufarm-ir-13")
    end = datetime.fromisoformat(held["EndTime"]).replace(tzinfo=UTC)
    assert held["Nodes"] == "hpc-a-02" and end - datetime.now(UTC) > timedelta(days=4, hours=23)
    # Erin has no cluster user: the reservation names the team's account, and the operators hear it once.
    leases.hold(13, ["hpc-a-02"], requester=ERIN, days=5)
    assert enforcer.run_once().converged and enforcer.run_once().applied == []
    held = _fields(cluster, "gpufarm-ir-13")
    assert held["Users"] == "(null)" and held["Accounts"] == "nlp"
    assert sum(ERIN in e for e in operators.events) == 1


def test_drift_is_repaired_and_a_hand_edit_put_back_without_touching_the_sites_own(
    cluster: slurmlocal.LocalSlurm,
) -> None:
    leases, operators = Leases(), Operators()
    enforcer = _enforcer(cluster, leases, operators)
    leases.hold(14, ["hpc-a-01"])
    enforcer.run_once()
    cluster.call("scontrol", "update", "ReservationName=gpufarm-ir-14", f"Users={slurmlocal.OTHER_USER}")
    for name, node in (("gpufarm-ir-999", "hpc-a-02"), ("maint", "hpc-a-02")):
        args = [f"ReservationName={name}", f"Nodes={node}", "Users=root", "StartTime=now", "Duration=60"]
        cluster.call("scontrol", "create", "reservation", *args, "Flags=IGNORE_JOBS,OVERLAP")
    report = enforcer.run_once()
    assert report.converged
    assert [(op.kind.value, op.name, op.why) for op in report.applied] == [
        ("delete", "gpufarm-ir-999", "no live lease holds it"),
        ("update", "gpufarm-ir-14", "edited by hand; put back"),
    ]
    assert _fields(cluster, "gpufarm-ir-14")["Users"] == slurmlocal.LEASE_USER
    assert _fields(cluster, "maint") and any("put back" in e for e in operators.events)
    cluster.call("scontrol", "delete", "ReservationName=gpufarm-ir-14")
    assert [op.why for op in enforcer.run_once().applied] == ["missing"] and _fields(cluster, "gpufarm-ir-14")


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "scontrol"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_scontrol_failing_applies_nothing_reports_the_lag_and_the_next_run_catches_up(
    cluster: slurmlocal.LocalSlurm, tmp_path: Path
) -> None:
    leases, operators = Leases(), Operators()
    clock = [time.time()]
    failing = Scontrol(_script(tmp_path, 'echo "Unable to contact slurm controller (connect failure)" >&2; exit 1'))
    enforcer = _enforcer(cluster, leases, operators, scontrol=failing, clock=lambda: clock[0])
    leases.hold(15, ["hpc-a-01"])
    report = enforcer.run_once()
    assert not report.converged and "Unable to contact slurm controller" in (report.error or "")
    assert _fields(cluster, "gpufarm-ir-15") == {}
    hung = Scontrol(_script(tmp_path, "sleep 5"), timeout=1)
    enforcer.cluster = hung
    clock[0] += 45
    report = enforcer.run_once()
    assert "timed out after 1s" in (report.error or "") and operators.lag[-1] == 45
    assert sum(e.startswith("gpufarm enforcement is lagging") for e in operators.events) == 1
    enforcer.cluster = Scontrol(env=cluster.env)
    report = enforcer.run_once()
    assert report.converged and operators.lag[-1] == 0 and _fields(cluster, "gpufarm-ir-15")
    assert operators.events[-1].startswith("gpufarm enforcement caught up")


def test_a_cluster_user_slurm_does_not_know_falls_back_to_the_teams_account(cluster: slurmlocal.LocalSlurm) -> None:
    leases, operators = Leases(), Operators()
    names = SlurmNames(NAMES.pools, {ALICE: "nosuchuser"}, NAMES.accounts)
    enforcer = SlurmEnforcer(leases, Scontrol(env=cluster.env), names, operators)
    leases.hold(16, ["hpc-a-02"])
    first = enforcer.run_once()
    assert not first.converged and "Invalid user id" in first.failed[0][1]
    assert any("nosuchuser" in e and "unknown to Slurm" in e for e in operators.events)
    second = enforcer.run_once()
    assert second.converged and _fields(cluster, "gpufarm-ir-16")["Accounts"] == "nlp"
    assert enforcer.run_once().applied == []
