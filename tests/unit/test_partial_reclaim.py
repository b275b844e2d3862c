"""Partial reclaim: the idle host of a busy multi-host lease is warned on its own and, past the grace, given back
(idle.partial: reclaim) or only warned about (warn); per-host idle state lives in the incident, a recovered host
clears only itself, a lease idle everywhere is reclaimed whole, and redelivered or repeated alerts change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.commands import executor
from gpufarm.core.config.farm import FarmConfigError, PartialIdle, parse_farm
from gpufarm.core.governance.policy import build_request, team_usage
from gpufarm.core.idle import partial
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import units
from gpufarm.core.kernel.hosts import GpuUnit, unit_tag
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand, Op
from gpufarm.core.service import GpuFarm
from gpufarm.core.sync import expiry

USER = "U0000000001"
OPS_CHANNEL = "C0000000001"
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DEVICE = "gpu-0a1b2c3d-0000-4000-8000-00000000000a"
OTHER_DEVICE = "gpu-0a1b2c3d-0000-4000-8000-00000000000b"


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    hosts: FakeHosts
    chat: FakeChat
    clock: FakeClock

    def lease(self, count: int = 16, env: str = "hpc", model: str = "H100", rid: str = "req-00000001") -> int:
        values = {"gpu_count": str(count), "gpu_model": model, "environment": env, "team": "nlp", "project": "p"}
        request = build_request(values, self.svc.context.farm, requester=USER, channel=None, request_id=rid)
        fields = {**request.to_fields(Phase.APPROVED, self.clock.now()), f.APPROVED_BY: "U0000000009"}
        ir = self.incidents.create(request.title(), fields).public_id
        self.svc.process(self.incidents.by_ir(ir).id)
        return ir

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def idle(self, ir: int, *hosts: str, devices: tuple[str, ...] = ()) -> str:
        return self.svc.idle_triggered(ir, IdleScope(hosts=hosts, devices=devices, kind="idle", value=0.0)).action

    def busy(self, ir: int, *hosts: str) -> str:
        return self.svc.idle_recovered(ir, IdleScope(hosts=hosts, kind="idle")).action

    def dms(self, contains: str) -> list[str]:
        return [s.text for s in self.chat.to(USER, "dm") if contains in s.text]

    def process_resolved(self) -> None:
        for record in self.incidents.search(IncidentQuery.where({State.RESOLVED})):
            self.svc.process(record.id)


def _world(yaml: str = FARM_YAML) -> World:
    clock = FakeClock(START)
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for name in ("hpc-1", "hpc-2", "hpc-3"):
        hosts.seed(name, "H100", 8, "hpc", "a")
    hosts.seed("slice-1", "A100", 8, "slices", "k")
    chat = FakeChat()
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(yaml))
    return World(svc, incidents, hosts, chat, clock)


@pytest.fixture
def world() -> Iterator[World]:
    yield _world()


def _two_hosts(world: World) -> tuple[int, str, str]:
    ir = world.lease()
    idle_host, busy_host = sorted(world.alloc(ir).hosts)
    return ir, idle_host, busy_host


# -- policy ----------------------------------------------------------------------------------------------------


def test_partial_defaults_to_reclaim_and_is_overridden_per_environment_then_team() -> None:
    yaml = FARM_YAML.replace(
        "idle: {grace_minutes: 60}",
        "idle: {grace_minutes: 60, environments: {hpc: {partial: warn}}, teams: {nlp: {partial: reclaim}}}",
    )
    farm = parse_farm(yaml)
    assert parse_farm(FARM_YAML).idle.policy("hpc", "nlp").partial is PartialIdle.RECLAIM
    assert farm.idle.policy("hpc", "vision").partial is PartialIdle.WARN
    assert farm.idle.policy("hpc", "nlp").partial is PartialIdle.RECLAIM
    assert farm.idle.policy("cloud", "vision").partial is PartialIdle.RECLAIM


@pytest.mark.parametrize("bad", ["partial: sometimes", "partial: [warn]", "environments: {hpc: {partial: shrink}}"])
def test_a_bad_partial_value_fails_at_load_naming_the_key(bad: str) -> None:
    with pytest.raises(FarmConfigError, match="partial"):
        parse_farm(FARM_YAML.replace("idle: {grace_minutes: 60}", f"idle: {{grace_minutes: 60, {bad}}}"))


# -- pure decisions --------------------------------------------------------------------------------------------


def test_field_encodings_round_trip_and_skip_malformed_entries() -> None:
    idle = {"hpc-1": START, f"hpc-2/{DEVICE}": START + timedelta(minutes=5)}
    assert partial.decode_idle([*partial.encode_idle(idle), "junk", "=2026-01-01T00:00:00Z", "h=never"]) == idle
    entries = [partial.returned_entry("hpc-1", 8, START), "hpc-2=x@y", "hpc-1=²@y", "broken"]
    assert partial.returned_parts(entries) == {"hpc-1": 8}


def test_decide_idle_warns_then_shrinks_then_reclaims_whole(world: World) -> None:
    ir, idle_host, busy_host = _two_hosts(world)
    policy = world.svc.context.farm.idle.policy("hpc", "nlp")
    lease = world.alloc(ir)
    first = partial.decide_idle(lease, [idle_host], START, policy)
    assert (first.step, first.warned, first.idle) == (partial.Step.WARN, (idle_host,), {idle_host: START})
    # Both hosts idle from the start, past the grace: the whole lease, not a shrink to nothing.
    warned = lease.model_copy(
        update={"phase": Phase.IDLE_WARNED, "idle_parts": tuple(partial.encode_idle({idle_host: START}))}
    )
    late = START + timedelta(minutes=60)
    assert partial.decide_idle(warned, [idle_host], late, policy).step is partial.Step.SHRINK
    both = warned.model_copy(update={"idle_parts": tuple(partial.encode_idle(dict.fromkeys(lease.hosts, START)))})
    assert partial.decide_idle(both, [busy_host], late, policy).step is partial.Step.RECLAIM
    assert partial.every_part_due(both, late, policy)
    assert not partial.every_part_due(warned, late, policy)
    # Parts left in the field of a lease no longer warned (allocated) are no warning.
    stale = lease.model_copy(update={"idle_parts": tuple(partial.encode_idle(dict.fromkeys(lease.hosts, START)))})
    assert partial.decide_idle(stale, [idle_host], late, policy).step is partial.Step.WARN
    # A warning from before per-host state (no parts recorded) counts every host as warned then.
    legacy = lease.model_copy(update={"phase": Phase.IDLE_WARNED, "idle_warned_at": START})
    assert partial.every_part_due(legacy, late, policy)
    assert not partial.every_part_due(legacy, late - timedelta(minutes=1), policy)


# -- through the service ---------------------------------------------------------------------------------------


def test_half_idle_lease_gives_back_its_idle_host_after_the_grace(world: World) -> None:
    ir, idle_host, busy_host = _two_hosts(world)
    assert world.idle(ir, idle_host).startswith(f"warned on {idle_host}")
    lease = world.alloc(ir)
    assert lease.phase is Phase.IDLE_WARNED
    assert lease.idle_parts == (f"{idle_host}=2026-03-02T09:00:00Z",)
    [warning] = world.dms("part of")
    assert warning.startswith(f"part of IR-{ir} is idle and goes back at 2026-03-02 10:00 UTC")
    # The same host again, and the other kind's monitor for it: no second warning, nothing returned early.
    world.clock.advance(minutes=30)
    assert world.idle(ir, idle_host) == "nothing to do (idle-warned)"
    assert len(world.dms("part of")) == 1
    # The monitor re-notifies after the grace: the idle host leaves, the busy one stays with its tag.
    world.clock.advance(minutes=30)
    assert world.idle(ir, idle_host).startswith(f"returned {idle_host}")
    lease = world.alloc(ir)
    assert lease.state is State.STABLE and lease.phase is Phase.ALLOCATED
    assert lease.hosts == (busy_host,) and lease.host_gpus == {busy_host: 8} and lease.gpu_count == 8
    assert lease.idle_parts == () and lease.idle_warned_at is None
    assert lease.idle_returned == (f"{idle_host}=8@2026-03-02T10:00:00Z",)
    assert f"monitor shrunk: idle past the grace: {idle_host} (8 GPUs); now 8" in lease.history[-1]
    assert f"ir:ir-{ir}" not in world.hosts.user(idle_host)
    assert f"ir:ir-{ir}" in world.hosts.user(busy_host)
    # The quota counts the smaller lease.
    assert team_usage([lease], "nlp", "hpc", "H100") == 8
    # Requester and operators are told exactly which host went and what the lease keeps.
    told = world.dms("gave back")
    ops = [s.text for s in world.chat.to(OPS_CHANNEL) if "gave back" in s.text]
    assert told and ops and told[-1] == ops[-1]
    assert f"gave back {idle_host} (8 GPUs)" in told[-1] and f"stays open with {busy_host} (8 GPUs)" in told[-1]
    # A late alert for the host given back is for a host the lease no longer holds: nothing changes.
    assert world.idle(ir, idle_host).startswith("ignored:")
    assert world.alloc(ir).hosts == (busy_host,)


def test_the_freed_host_goes_to_the_waiting_request(world: World) -> None:
    ir, idle_host, _ = _two_hosts(world)
    assert world.alloc(world.lease(8, rid="req-00000002")).hosts == ("hpc-3",)
    third = world.lease(8, rid="req-00000003")
    assert world.alloc(third).phase is Phase.WAITING  # the pool is full
    world.idle(ir, idle_host)
    world.clock.advance(minutes=60)
    outcome = world.idle(ir, idle_host)
    assert f"then IR-{third}: allocated ({idle_host})" in outcome, outcome
    assert world.alloc(third).hosts == (idle_host,)
    assert world.hosts.user(idle_host).count(f"ir:ir-{third}") == 1 and f"ir:ir-{ir}" not in world.hosts.user(idle_host)


def test_a_recovered_host_clears_only_itself(world: World) -> None:
    ir, first, second = _two_hosts(world)
    world.idle(ir, first)
    world.clock.advance(minutes=20)
    assert world.idle(ir, second).startswith(f"warned on {second}")
    assert world.busy(ir, first) == f"recovered {first}; still idle {second}"
    lease = world.alloc(ir)
    assert lease.phase is Phase.IDLE_WARNED and lease.idle_parts == (f"{second}=2026-03-02T09:20:00Z",)
    assert (
        world.dms("busy again")[-1] == f"IR-{ir}: {first} busy again, its idle warning cleared; still idle: {second}."
    )
    # The grace counts from each host's own warning: nothing returns at 10:00, the second host does at 10:20.
    world.clock.advance(minutes=40)
    assert world.idle(ir, second) == "nothing to do (idle-warned)"
    assert not expiry.due(world.svc.context, world.alloc(ir))
    world.clock.advance(minutes=20)
    assert world.idle(ir, second).startswith(f"returned {second}")
    assert world.alloc(ir).hosts == (first,)
    # A recovery for a host with no warning changes nothing; the last one clears the lease.
    assert world.busy(ir, first) == "nothing to do (allocated)"


def test_every_host_idle_past_the_grace_is_the_whole_lease_reclaim(world: World) -> None:
    ir, first, second = _two_hosts(world)
    world.idle(ir, first)
    world.idle(ir, second)
    assert len(world.dms("is idle")) == 2  # each host warned once
    world.clock.advance(minutes=60)
    assert world.idle(ir, first) == f"resolved (idle) on {first} (kind idle, 0)"
    lease = world.alloc(ir)
    assert lease.phase is Phase.RECLAIMING and lease.reclaim_reason is ReclaimReason.IDLE
    assert lease.hosts == (first, second)  # the reclaim, not a shrink, frees them
    world.process_resolved()
    assert world.alloc(ir).phase is Phase.RECLAIMED
    assert not [h for h in (first, second) if f"ir:ir-{ir}" in world.hosts.user(h)]


def test_the_last_busy_host_of_a_shrunk_lease_going_idle_ends_the_lease(world: World) -> None:
    ir, first, second = _two_hosts(world)
    world.idle(ir, first)
    world.clock.advance(minutes=60)
    world.idle(ir, first)
    assert world.alloc(ir).hosts == (second,)
    world.idle(ir, second)
    world.clock.advance(minutes=60)
    assert world.idle(ir, second).startswith("resolved (idle)")


def test_policy_warn_keeps_the_hosts_and_the_sync_does_not_reclaim_a_partly_idle_lease() -> None:
    world = _world(FARM_YAML.replace("idle: {grace_minutes: 60}", "idle: {grace_minutes: 60, partial: warn}"))
    ir, idle_host, busy_host = _two_hosts(world)
    world.idle(ir, idle_host)
    [warning] = world.dms("part of")
    assert warning == f"part of IR-{ir} is idle"
    world.clock.advance(minutes=180)
    assert world.idle(ir, idle_host) == "nothing to do (idle-warned): partly idle past the grace; the policy only warns"
    assert expiry.due(world.svc.context, world.alloc(ir)) is None
    assert world.svc.expire(ir).action == "nothing to do (idle-warned)"
    assert set(world.alloc(ir).hosts) == {idle_host, busy_host}
    # The busy host going idle too makes the whole lease idle: reclaimed after its own grace.
    world.idle(ir, busy_host)
    world.clock.advance(minutes=60)
    assert expiry.due(world.svc.context, world.alloc(ir)) is ReclaimReason.IDLE


def test_keep_clears_every_hosts_warning(world: World) -> None:
    ir, first, second = _two_hosts(world)
    world.idle(ir, first)
    world.idle(ir, second)
    world.svc.keep(ir, USER)
    lease = world.alloc(ir)
    assert lease.phase is Phase.ALLOCATED and lease.idle_parts == ()
    # Still idle once the keep's hold (keeps.keep_hours, 24 h by default) is over: the next notification warns
    # again and the grace starts over.
    world.clock.advance(hours=24, minutes=1)
    assert world.idle(ir, first).startswith("warned")


def test_a_redelivered_idle_command_is_not_applied_twice(world: World) -> None:
    ir, idle_host, busy_host = _two_hosts(world)
    world.idle(ir, idle_host)
    world.clock.advance(minutes=60)
    scope = IdleScope(hosts=(idle_host,), kind="idle")
    renotify = IncidentCommand(op=Op.IDLE, ir=ir, origin="1234567|renotify|1772445600", idle=scope)
    assert executor.execute(world.svc.context, renotify).startswith(f"returned {idle_host}")
    written = len(world.incidents.updates)
    assert executor.execute(world.svc.context, renotify) == "already applied (allocated)"
    assert len(world.incidents.updates) == written
    assert world.alloc(ir).hosts == (busy_host,) and len(world.dms("gave back")) == 1


def test_a_shared_lease_gives_back_its_idle_device_once(world: World) -> None:
    ir = world.lease(2, env="slices", model="A100")
    lease = world.alloc(ir)
    assert lease.hosts == ("slice-1",) and lease.host_gpus == {"slice-1": 2}
    assert world.idle(ir, "slice-1", devices=(DEVICE,)).startswith("warned on slice-1, " + DEVICE)
    world.clock.advance(minutes=60)
    assert world.idle(ir, "slice-1", devices=(DEVICE,)).startswith(f"returned slice-1/{DEVICE}")
    lease = world.alloc(ir)
    assert lease.host_gpus == {"slice-1": 1} and lease.gpu_count == 1 and lease.hosts == ("slice-1",)
    assert f"ir:ir-{ir}" in world.hosts.user("slice-1")  # it still holds a GPU there
    # The returned device keeps alerting while the agent still sees it: not counted twice.
    assert world.idle(ir, "slice-1", devices=(DEVICE,)).startswith("ignored: the alert names only parts")
    assert world.alloc(ir).gpu_count == 1
    # Its other device idle too, past the grace: the lease is idle everywhere and is reclaimed whole.
    world.idle(ir, "slice-1", devices=(OTHER_DEVICE,))
    world.clock.advance(minutes=60)
    assert world.idle(ir, "slice-1", devices=(OTHER_DEVICE,)).startswith("resolved (idle)")


def test_a_shared_lease_with_recorded_units_gives_back_exactly_the_idle_unit(world: World) -> None:
    uuids = [f"gpu-0a1b2c3d-0000-4000-8000-0000000000{10 + i:02x}" for i in range(8)]
    uuids[0], uuids[1] = DEVICE, OTHER_DEVICE
    world.hosts.tags["slice-1"]["datadog"] += [unit_tag(GpuUnit(i, uuid=u)) for i, u in enumerate(uuids)]
    ir = world.lease(2, env="slices", model="A100")
    lease = world.alloc(ir)
    assert [u.uuid for u in units.lease_devices(lease)["slice-1"]] == [DEVICE, OTHER_DEVICE]
    assert {f"gpu_assign:ir-{ir}/{DEVICE}", f"gpu_assign:ir-{ir}/{OTHER_DEVICE}"} <= set(world.hosts.user("slice-1"))
    # A device the lease does not hold is not its part.
    assert world.idle(ir, "slice-1", devices=(uuids[5],)).startswith("ignored:")
    world.idle(ir, "slice-1", devices=(DEVICE,))
    world.clock.advance(minutes=60)
    assert world.idle(ir, "slice-1", devices=(DEVICE,)).startswith(f"returned slice-1/{DEVICE}")
    lease = world.alloc(ir)
    assert [u.uuid for u in units.lease_devices(lease)["slice-1"]] == [OTHER_DEVICE] and lease.gpu_count == 1
    tags = world.hosts.user("slice-1")
    assert f"gpu_assign:ir-{ir}/{DEVICE}" not in tags
    assert f"gpu_assign:ir-{ir}/{OTHER_DEVICE}" in tags and f"ir:ir-{ir}" in tags
    # The unit is free again: the next lease of one GPU gets exactly it.
    other = world.lease(1, env="slices", model="A100", rid="req-00000002")
    assert [u.uuid for u in units.lease_devices(world.alloc(other))["slice-1"]] == [DEVICE]
