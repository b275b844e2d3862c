"""The idle policy in the farm YAML: defaults, per-environment and per-team overrides, validation at load, and the
grace the service reclaims by; the idle webhook's scope (lease, hosts, devices, kind, window, value)."""

from __future__ import annotations

import json

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.config.farm import FarmConfigError, IdleKind, IdleSettings, parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand, Op
from gpufarm.core.service import GpuFarm
from gpufarm.handlers.idle_alert import IdleAlert

BASE = FARM_YAML.replace("idle: {grace_minutes: 60}\n", "")
OVERRIDES = """
idle:
  grace_minutes: 60
  startup_grace_minutes: 20
  kinds:
    low_utilization: {threshold_percent: 7}
  environments:
    slices:
      grace_minutes: 30
      kinds:
        low_utilization: {threshold_percent: 12, window_minutes: 30}
        idle_held: {enabled: false}
  teams:
    vision:
      grace_minutes: 10
      startup_grace_minutes: 5
"""


def farm_with(idle_yaml: str) -> str:
    return BASE + idle_yaml


def test_defaults_cover_every_kind() -> None:
    policy = IdleSettings().policy()
    assert (policy.grace_minutes, policy.startup_grace_minutes) == (60, 30)
    assert [(k, p.window_minutes, p.threshold_percent) for k, p in policy.enabled()] == [
        (IdleKind.IDLE, 60, None),
        (IdleKind.IDLE_HELD, 60, None),
        (IdleKind.LOW_UTILIZATION, 120, 5.0),
    ]
    # The unit-test farm's short idle section keeps the defaults for what it leaves out.
    assert parse_farm(FARM_YAML).idle.policy("hpc", "nlp") == policy


def test_environment_then_team_overrides_only_what_they_set() -> None:
    idle = parse_farm(farm_with(OVERRIDES)).idle
    hpc = idle.policy("hpc", "nlp")
    assert hpc.grace_minutes == 60 and hpc.startup_grace_minutes == 20
    assert hpc.kinds[IdleKind.LOW_UTILIZATION].threshold_percent == 7
    assert hpc.kinds[IdleKind.LOW_UTILIZATION].window_minutes == 120  # the top-level override kept the window
    slices = idle.policy("slices", "nlp")
    assert slices.grace_minutes == 30
    low = slices.kinds[IdleKind.LOW_UTILIZATION]
    assert (low.threshold_percent, low.window_minutes) == (12, 30)
    assert [k for k, _ in slices.enabled()] == [IdleKind.IDLE, IdleKind.LOW_UTILIZATION]
    # A team's override wins over its environment's, and keeps what it does not set.
    vision = idle.policy("slices", "vision")
    assert (vision.grace_minutes, vision.startup_grace_minutes) == (10, 5)
    assert vision.kinds[IdleKind.LOW_UTILIZATION].threshold_percent == 12
    assert idle.grace_for("hpc", "vision") == 10 and idle.grace_for(None, None) == 60


@pytest.mark.parametrize(
    ("idle_yaml", "says"),
    [
        ("idle: {threshold_percent: 5}\n", "idle.kinds.low_utilization.threshold_percent"),
        ("idle: {window_minutes: 60}\n", "idle.kinds.<kind>.window_minutes"),
        ("idle: {grace_minute: 60}\n", "grace_minute"),
        ("idle: {kinds: {idle: {threshold_percent: 5}}}\n", "only low_utilization has a threshold"),
        ("idle: {kinds: {busy: {enabled: false}}}\n", "kinds.busy"),
        ("idle: {kinds: {idle: {window_minutes: 2}}}\n", "window_minutes"),
        ("idle: {kinds: {idle: {window: 60}}}\n", "window"),
        ("idle: {kinds: {low_utilization: {threshold_percent: 150}}}\n", "threshold_percent"),
        ("idle: {environments: {nowhere: {grace_minutes: 5}}}\n", "'nowhere' is not an environment"),
        ("idle: {teams: {nobody: {grace_minutes: 5}}}\n", "'nobody' is not a team"),
        ("idle: {teams: {nlp: {kinds: {idle_held: {threshold_percent: 1}}}}}\n", "only low_utilization"),
        ("idle: {startup_grace_minutes: -1}\n", "startup_grace_minutes"),
    ],
)
def test_a_bad_or_dead_key_fails_at_load_naming_it(idle_yaml: str, says: str) -> None:
    with pytest.raises(FarmConfigError) as err:
        parse_farm(farm_with(idle_yaml))
    assert says in str(err.value)


def test_the_example_farm_loads() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text()
    idle = parse_farm(text).idle
    assert idle.policy("shared-slices").kinds[IdleKind.LOW_UTILIZATION].threshold_percent == 10


# -- the service reclaims by the policy in effect for the lease -----------------------------------------------


def _service(idle_yaml: str) -> tuple[GpuFarm, FakeIncidents, FakeClock]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for name in ("hpc-1", "hpc-2"):
        hosts.seed(name, "H100", 8, "hpc", "a")
    farm = parse_farm(farm_with(idle_yaml))
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=FakeChat(), clock=clock, farm=farm, metrics=FakeMetrics())
    return svc, incidents, clock


def _allocated(svc: GpuFarm, incidents: FakeIncidents, team: str, count: str = "16") -> Allocation:
    values = {"gpu_count": count, "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
    request = build_request(
        values, svc.context.farm, requester="U0000000001", channel="C0000000002", request_id="req-00000001"
    )
    fields = request.to_fields(Phase.APPROVED, svc.context.clock.now())
    ir = incidents.create(request.title(), {**fields, f.APPROVED_BY: "U0000000009"}).public_id
    svc.process(incidents.by_ir(ir).id)
    alloc = Allocation.from_record(incidents.by_ir(ir))
    assert alloc.phase is Phase.ALLOCATED, alloc
    return alloc


def test_the_team_grace_decides_the_reclaim() -> None:
    svc, incidents, clock = _service(OVERRIDES)
    alloc = _allocated(svc, incidents, "vision", count="8")
    assert svc.idle_triggered(alloc.ir).action == "warned"
    clock.advance(minutes=11)  # vision's grace is 10 minutes, the farm's 60
    assert svc.idle_triggered(alloc.ir).action == "resolved (idle)"
    assert Allocation.from_record(incidents.by_ir(alloc.ir)).reclaim_reason is ReclaimReason.IDLE


def test_an_alert_for_one_host_of_a_lease_warns_and_one_for_a_host_it_does_not_hold_changes_nothing() -> None:
    svc, incidents, _clock = _service("")
    alloc = _allocated(svc, incidents, "nlp")
    assert len(alloc.hosts) == 2
    stranger = IdleScope(hosts=("cloud-7",), kind="idle")
    assert svc.idle_triggered(alloc.ir, stranger).action.startswith("ignored: cloud-7 not held by")
    assert Allocation.from_record(incidents.by_ir(alloc.ir)).phase is Phase.ALLOCATED
    assert svc.idle_recovered(alloc.ir, stranger).action.startswith("ignored")
    half = IdleScope(hosts=(alloc.hosts[0].upper(),), kind="idle", value=0.0, window_minutes=60)
    outcome = svc.idle_triggered(alloc.ir, half)
    assert outcome.action == f"warned on {alloc.hosts[0].upper()} (kind idle, 0, over 60 min)"
    # The duplicate, and the other monitor's alert for the same host, warn no second time.
    assert svc.idle_triggered(alloc.ir, half).action == "nothing to do (idle-warned)"
    assert svc.idle_triggered(alloc.ir, IdleScope(hosts=half.hosts, kind="low_utilization")).action.startswith(
        "nothing to do"
    )


# -- the idle webhook's payload -------------------------------------------------------------------------------


def _alert(**values: str) -> IdleAlert:
    body = {"alert_transition": "Triggered", "alert_id": "7", "date": "1700000000000", **values}
    return IdleAlert.model_validate(body)


def test_a_per_host_scope_names_the_lease_hosts_kind_window_and_value() -> None:
    alert = _alert(
        alert_scope="gpu_ir:ir-12,host:gpu-a-01",
        tags="gpufarm:managed,gpufarm_idle_kind:idle,gpufarm_idle_window:60m,gpu_ir:ir-12,host:gpu-a-01",
        message="gpufarm lease ir-12 on gpu-a-01: no process (kind idle, value=0). @webhook-gpufarm-idle",
    )
    assert alert.ir() == 12
    assert alert.idle_scope() == IdleScope(hosts=("gpu-a-01",), kind="idle", value=0.0, window_minutes=60)


def test_a_per_device_scope_names_the_device() -> None:
    uuid = "gpu-00000001-0000-4000-8000-000000000003"
    alert = _alert(alert_scope=f"gpu_ir:ir-4,gpu_uuid:{uuid.upper()},host:slice-1", message="value=3.5e-01")
    scope = alert.idle_scope()
    assert alert.ir() == 4 and scope.devices == (uuid,) and scope.hosts == ("slice-1",) and scope.value == 0.35


@pytest.mark.parametrize(
    "scope",
    ["gpu_ir:none,host:gpu-a-01", "host:gpu-a-01", "", "gpu_ir:ir-x", "ir:ir-0"],
)
def test_a_scope_without_a_lease_names_no_ir(scope: str) -> None:
    assert _alert(alert_scope=scope).ir() is None


def test_odd_parts_of_a_scope_are_dropped_not_trusted() -> None:
    alert = _alert(
        alert_scope="ir:ir-3,host:bad host!,gpu_uuid:not-a-uuid,host:" + "h" * 300,
        tags="gpufarm_idle_kind:drop_table,gpufarm_idle_window:99999999m",
        message="value=nan value=1e999",
    )
    assert alert.ir() == 3 and alert.idle_scope() == IdleScope()


def test_two_different_leases_in_one_scope_are_refused() -> None:
    from gpufarm.handlers.idle_alert import ScopeError

    with pytest.raises(ScopeError):
        _alert(alert_scope="ir:ir-3,gpu_ir:ir-4").ir()


def test_the_scope_travels_in_the_idle_command_and_its_dedup_id() -> None:
    scope = IdleScope(hosts=("gpu-a-01",), kind="idle")
    one = IncidentCommand(op=Op.IDLE, ir=12, origin="7|triggered|1", idle=scope)
    other = IncidentCommand(op=Op.IDLE, ir=12, origin="7|triggered|1", idle=IdleScope(hosts=("gpu-a-02",)))
    plain = IncidentCommand(op=Op.IDLE, ir=12, origin="7|triggered|1")
    # Two hosts of one lease alerting in one evaluation are two commands; a lease-wide alert keeps its old id.
    assert len({one.dedup_id(), other.dedup_id(), plain.dedup_id()}) == 3
    assert IncidentCommand.model_validate(json.loads(json.dumps(one.to_body()))["command"]) == one
    with pytest.raises(ValueError, match="hosts"):
        IdleScope(hosts=tuple(f"h{i}" for i in range(65)))
