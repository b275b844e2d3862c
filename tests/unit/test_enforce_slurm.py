"""The Slurm enforcer's pure parts and one run against fakes: leases from incidents, host lists, scontrol's output,
the reservations the leases call for, the plan that makes Slurm hold them, and what a run reports."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufarm_node.enforce.config import SlurmNames
from gpufarm_node.enforce.hostlist import HostlistError, expand
from gpufarm_node.enforce.leases import Lease, Skipped, lease_of
from gpufarm_node.enforce.run import LAG_METRIC, UNITS, SlurmEnforcer
from gpufarm_node.enforce.slurm_plan import (
    MAX_OPS_PER_RUN,
    OpKind,
    Reservation,
    desired,
    owned_ir,
    parse_nodes,
    parse_reservations,
    plan,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
SPEC = yaml.safe_load((Path(__file__).resolve().parents[2] / "spec" / "metrics.yaml").read_text())
END = NOW + timedelta(days=3)
NAMES = SlurmNames(frozenset({"onprem-hpc"}), {"U0DANA": "dana"}, {"nlp": "nlp-acct", "vision": "vision"})
# scontrol 22.05's answer, as a real slurmctld printed it (one gpufarm reservation, one of the site's own).
SHOW = (
    "ReservationName=gpufarm-ir-7 StartTime=2026-12-07T12:00:00 EndTime=2026-12-10T12:00:00 Duration=3-00:00:00 "
    "Nodes=hpc-a-[01-02] NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null) Flags=IGNORE_JOBS,SPEC_NODES "
    "TRES=cpu=4 Users=dana Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)\n"
    "ReservationName=maintenance StartTime=2026-12-08T00:00:00 EndTime=2026-12-08T04:00:00 Duration=04:00:00 "
    "Nodes=hpc-b-01 NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=2 "
    "Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)\n"
)
NODES = ["hpc-a-01", "hpc-a-02", "hpc-b-01"]


def _incident(ir: int, **fields: Any) -> dict[str, Any]:
    values = {
        "phase": "allocated",
        "environment": "onprem-hpc",
        "team": "nlp",
        "requester": "U0DANA",
        "hosts": ["hpc-a-01", "hpc-a-02"],
        "expires_at": END.isoformat().replace("+00:00", "Z"),
    } | fields
    state = values.pop("state", "active")
    return {
        "id": f"id-{ir}",
        "attributes": {
            "public_id": ir,
            "state": state,
            "fields": {k: {"type": "textbox", "value": v} for k, v in values.items()},
        },
    }


def _lease(ir: int = 7, **fields: Any) -> Lease:
    got = lease_of(_incident(ir, **fields))
    assert isinstance(got, Lease)
    return got


# -- leases ---------------------------------------------------------------------------------------------------


def test_a_live_allocated_incident_is_a_lease_with_its_hosts_people_and_end() -> None:
    lease = _lease(hosts=["hpc-a-02", "hpc-a-01", "hpc-a-01"])
    assert lease == Lease(7, "onprem-hpc", "nlp", "U0DANA", ("hpc-a-01", "hpc-a-02"), END)


@pytest.mark.parametrize(
    "fields",
    [{"state": "resolved"}, {"phase": "requested"}, {"phase": "reclaimed"}, {"phase": "waiting", "hosts": []}],
)
def test_an_incident_holding_no_hosts_is_no_lease(fields: dict[str, Any]) -> None:
    assert lease_of(_incident(7, **fields)) is None


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"hosts": ["hpc-a-01", "bad host;rm"]}, "hosts"),
        ({"hosts": ["h"] * 600}, "hosts"),
        ({"environment": None}, "environment"),
        ({"team": "../x"}, "team"),
    ],
)
def test_a_hand_edited_incident_is_skipped_with_why(fields: dict[str, Any], why: str) -> None:
    got = lease_of(_incident(7, **fields))
    assert isinstance(got, Skipped) and why in got.why


def test_a_requester_that_is_not_a_slack_id_is_no_user() -> None:
    assert _lease(requester="dana; rm -rf").requester is None


# -- host lists and scontrol's output -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("hpc-a-01", ["hpc-a-01"]),
        ("hpc-a-[01-03,07]", ["hpc-a-01", "hpc-a-02", "hpc-a-03", "hpc-a-07"]),
        ("r[1-2]-n[8-9],login", ["r1-n8", "r1-n9", "r2-n8", "r2-n9", "login"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("", []),
    ],
)
def test_host_lists_expand_as_slurm_prints_them(expression: str, hosts: list[str]) -> None:
    assert expand(expression) == hosts


@pytest.mark.parametrize("expression", ["gpu[1-", "gpu]1[", "gpu[a-b]", "gpu[5-1]", "gpu[0-9999999]"])
def test_a_malformed_or_huge_host_list_is_refused(expression: str) -> None:
    with pytest.raises(HostlistError):
        expand(expression)


def test_only_gpufarms_reservations_are_read() -> None:
    have = parse_reservations(SHOW, UTC)
    assert list(have) == ["gpufarm-ir-7"]
    assert have["gpufarm-ir-7"] == Reservation(
        "gpufarm-ir-7", frozenset({"hpc-a-01", "hpc-a-02"}), frozenset({"dana"}), frozenset(), END
    )
    assert parse_reservations("No reservations in the system\n", UTC) == {}
    assert owned_ir("gpufarm-ir-007") is None and owned_ir("gpufarm-ir-x") is None and owned_ir("gpufarm-ir-3") == 3


def test_node_names_are_read_from_show_node() -> None:
    text = "NodeName=hpc-a-01 Arch=x86_64 CoresPerSocket=1\nNodeName=hpc-a-02 Arch=x86_64\n"
    assert parse_nodes(text) == ["hpc-a-01", "hpc-a-02"]


# -- what the leases call for ---------------------------------------------------------------------------------


def test_a_lease_calls_for_a_reservation_of_its_hosts_in_this_cluster_for_its_user() -> None:
    want = desired([_lease(hosts=["hpc-a-01.cluster.example", "hpc-c-09"])], NAMES, NODES, NOW)
    assert want.reservations == {
        "gpufarm-ir-7": Reservation("gpufarm-ir-7", frozenset({"hpc-a-01"}), frozenset({"dana"}), frozenset(), END)
    }
    assert want.notices == ()


def test_a_requester_without_a_cluster_user_gets_the_teams_account_and_operators_are_told() -> None:
    want = desired([_lease(requester="U0EVE")], NAMES, NODES, NOW)
    reservation = want.reservations["gpufarm-ir-7"]
    assert reservation.users == frozenset() and reservation.accounts == frozenset({"nlp-acct"})
    assert [n.key for n in want.notices] == ["user:U0EVE"]
    assert "team nlp's account nlp-acct" in want.notices[0].text


def test_leases_of_other_pools_other_clusters_or_past_their_end() -> None:
    other_pool = _lease(1, environment="cloud-aws")
    elsewhere = _lease(2, hosts=["hpc-z-01"])
    past = _lease(3, expires_at=(NOW - timedelta(minutes=1)).isoformat())
    want = desired([other_pool, elsewhere, past], NAMES, NODES, NOW)
    assert list(want.reservations) == ["gpufarm-ir-3"]
    assert want.reservations["gpufarm-ir-3"].end is None


# -- the plan ----------------------------------------------------------------------------------------------------


def _want(**changes: Any) -> Reservation:
    base = {"nodes": frozenset({"hpc-a-01", "hpc-a-02"}), "users": frozenset({"dana"}), "accounts": frozenset()}
    return Reservation("gpufarm-ir-7", **(base | {"end": END} | changes))


def test_nothing_to_do_when_slurm_holds_the_leases() -> None:
    assert plan({"gpufarm-ir-7": _want()}, parse_reservations(SHOW, UTC), tz=UTC).ops == ()


def test_a_missing_reservation_is_created_and_one_no_lease_explains_is_deleted() -> None:
    want = {"gpufarm-ir-8": Reservation("gpufarm-ir-8", frozenset({"hpc-b-01"}), accounts=frozenset({"nlp"}))}
    ops = plan(want, parse_reservations(SHOW, UTC), tz=UTC).ops
    assert [(op.kind, op.name) for op in ops] == [(OpKind.DELETE, "gpufarm-ir-7"), (OpKind.CREATE, "gpufarm-ir-8")]
    assert ops[0].args == ("delete", "ReservationName=gpufarm-ir-7")
    assert ops[1].args == (
        "create",
        "reservation",
        "ReservationName=gpufarm-ir-8",
        "Nodes=hpc-b-01",
        "Accounts=nlp",
        "StartTime=now",
        "Duration=UNLIMITED",
        "Flags=IGNORE_JOBS",
    )


def test_a_shrunk_extended_lease_that_changed_hands_is_one_update() -> None:
    later = END + timedelta(days=2)
    want = {"gpufarm-ir-7": _want(nodes=frozenset({"hpc-a-02"}), users=frozenset({"erin"}), end=later)}
    (op,) = plan(want, parse_reservations(SHOW, UTC), tz=UTC).ops
    assert op.kind is OpKind.UPDATE and op.why == "the lease changed"
    assert op.args == (
        "update",
        "ReservationName=gpufarm-ir-7",
        "Nodes=hpc-a-02",
        "Users=erin",
        "EndTime=2026-12-12T12:00:00",
    )


def test_from_a_user_to_the_teams_account_the_new_names_come_first() -> None:
    want = {"gpufarm-ir-7": _want(users=frozenset(), accounts=frozenset({"nlp"}))}
    (op,) = plan(want, parse_reservations(SHOW, UTC), tz=UTC).ops
    assert op.args == ("update", "ReservationName=gpufarm-ir-7", "Accounts=nlp", "Users-=dana")


def test_a_hand_edit_is_put_back_and_said_so() -> None:
    want = {"gpufarm-ir-7": _want()}
    edited = {"gpufarm-ir-7": _want(users=frozenset({"mallory"}))}
    (op,) = plan(want, edited, applied=want, tz=UTC).ops
    assert op.why == "edited by hand; put back" and "Users=dana" in op.args


def test_a_plan_is_bounded_and_says_what_waits() -> None:
    want = {
        f"gpufarm-ir-{n}": Reservation(f"gpufarm-ir-{n}", frozenset({f"n{n}"}), frozenset({"u"}))
        for n in range(1, MAX_OPS_PER_RUN + 51)
    }
    todo = plan(want, {}, tz=UTC)
    assert len(todo.ops) == MAX_OPS_PER_RUN and todo.deferred == 50


# -- one run ------------------------------------------------------------------------------------------------------


class FakeSlurm:
    """scontrol as far as the enforcer uses it: reservations kept as their fields, rendered as 22.05 prints them."""

    def __init__(self, show: str = SHOW, fail: Sequence[str] = ()) -> None:
        self.held: dict[str, dict[str, str]] = {}
        for line in show.splitlines():
            fields = dict(token.partition("=")[::2] for token in line.split())
            self.held[fields["ReservationName"]] = fields
        self.fail, self.calls, self.down = set(fail), [], False

    def reservations(self) -> str:
        if self.down:
            raise RuntimeError("slurm_load_reservations error: Unable to contact slurm controller")
        return "".join(" ".join(f"{k}={v}" for k, v in f.items()) + "\n" for f in self.held.values())

    def nodes(self) -> str:
        return "".join(f"NodeName={n} Arch=x86_64\n" for n in NODES)

    def apply(self, args: Sequence[str]) -> None:
        self.calls.append(tuple(args))
        if any(a.endswith(f"={name}") for a in args for name in self.fail):
            raise RuntimeError(f"scontrol {args[0]} failed (1): Requested nodes are busy")
        pairs = [a.partition("=") for a in args if "=" in a]
        name = next(v for k, _, v in pairs if k == "ReservationName")
        if args[0] == "delete":
            del self.held[name]
            return
        fields = self.held.setdefault(name, {"Users": "(null)", "Accounts": "(null)", "EndTime": "Unknown"})
        for key, _, value in pairs:
            if key.endswith("-"):
                fields[key[:-1]] = "(null)"
            elif key in ("ReservationName", "Nodes", "Users", "Accounts", "EndTime"):
                fields[key] = value


class Leases:
    def __init__(self, *incidents: dict[str, Any]) -> None:
        self.incidents = list(incidents)

    def live_incidents(self) -> list[dict[str, Any]]:
        return self.incidents


class Operators:
    def __init__(self) -> None:
        self.sent: list[dict[str, float]] = []
        self.events: list[str] = []

    def gauges(self, values: dict[str, float], tags: Sequence[str], now: float) -> None:
        self.sent.append(values)

    def event(self, title: str, text: str, tags: Sequence[str], *, alert: str = "warning") -> None:
        self.events.append(f"{title}: {text}")


class Clock:
    def __init__(self) -> None:
        self.now = NOW.timestamp()

    def __call__(self) -> float:
        return self.now


def _enforcer(slurm: FakeSlurm, leases: Leases, operators: Operators, clock: Clock) -> SlurmEnforcer:
    return SlurmEnforcer(leases, slurm, NAMES, operators, clock=clock, tz=UTC)


def test_a_failed_operation_leaves_the_others_applied_and_the_lag_is_reported_until_it_lands() -> None:
    slurm, clock, operators = FakeSlurm(show="", fail=["gpufarm-ir-8"]), Clock(), Operators()
    leases = Leases(_incident(7), _incident(8, hosts=["hpc-b-01"]))
    enforcer = _enforcer(slurm, leases, operators, clock)
    first = enforcer.run_once()
    assert [op.name for op in first.applied] == ["gpufarm-ir-7"] and [op.name for op, _ in first.failed] == [
        "gpufarm-ir-8"
    ]
    assert not first.converged
    clock.now += 60
    second = enforcer.run_once()
    assert second.lag_seconds == 60 and operators.sent[-1][LAG_METRIC] == 60
    lagging = [e for e in operators.events if e.startswith("gpufarm enforcement is lagging")]
    assert len(lagging) == 1 and "gpufarm-ir-8" in lagging[0]
    slurm.fail.clear()
    third = enforcer.run_once()
    assert third.converged and third.lag_seconds == 0 and operators.sent[-1][LAG_METRIC] == 0
    assert operators.events[-1].startswith("gpufarm enforcement caught up")


def test_slurmctld_down_applies_nothing_and_reports() -> None:
    slurm, operators = FakeSlurm(), Operators()
    slurm.down = True
    report = _enforcer(slurm, Leases(), operators, Clock()).run_once()
    assert report.error is not None and "Unable to contact" in report.error
    assert slurm.calls == [] and not report.converged
    assert any("Unable to contact" in e for e in operators.events)


def test_a_requester_without_a_user_is_told_once() -> None:
    slurm, operators = FakeSlurm(show=""), Operators()
    enforcer = _enforcer(slurm, Leases(_incident(7, requester="U0EVE")), operators, Clock())
    assert enforcer.run_once().notices and enforcer.run_once().notices == []
    assert sum("U0EVE" in e for e in operators.events) == 1


def test_drift_is_repaired_a_hand_edit_put_back_and_the_sites_own_reservations_left_alone() -> None:
    slurm, operators = FakeSlurm(show=SHOW), Operators()
    enforcer = _enforcer(slurm, Leases(_incident(7)), operators, Clock())
    assert enforcer.run_once().applied == []
    slurm.held["gpufarm-ir-7"]["Users"] = "mallory"
    slurm.held["gpufarm-ir-99"] = dict(slurm.held["gpufarm-ir-7"], ReservationName="gpufarm-ir-99")
    report = enforcer.run_once()
    assert [(op.kind, op.name, op.why) for op in report.applied] == [
        (OpKind.DELETE, "gpufarm-ir-99", "no live lease holds it"),
        (OpKind.UPDATE, "gpufarm-ir-7", "edited by hand; put back"),
    ]
    assert any("put back" in e for e in operators.events)
    assert "maintenance" in slurm.held and slurm.held["gpufarm-ir-7"]["Users"] == "dana"
    del slurm.held["gpufarm-ir-7"]
    assert [op.why for op in enforcer.run_once().applied] == ["missing"]


def test_the_gauges_are_the_specs() -> None:
    operators = Operators()
    enforcer = _enforcer(FakeSlurm(show=SHOW), Leases(_incident(7)), operators, Clock())
    enforcer.run_once()
    declared = SPEC["enforce_metrics"]
    assert set(operators.sent[-1]) == set(declared) == set(UNITS)
    for name, spec in declared.items():
        assert spec["type"] == "gauge" and spec["unit"] == UNITS[name]
        assert set(spec["tags"]["required"]) == {t.partition(":")[0] for t in enforcer.tags}
    for tag in enforcer.tags:
        key, _, value = tag.partition(":")
        assert re.match(SPEC["tags"][key]["value"], value), tag
