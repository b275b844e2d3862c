"""A squatter is told once per episode and, under stop-after, stopped once its grace is over
(gpufarm.core.squatters): the episode lives on the hurt lease, a repeated alert tells no one, a recovery ends it,
an exempt host is never stopped, and a device no lease holds is told to the operators alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeQueue, ask_hpc

from gpufarm.core.commands import executor
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.config.squatters import SquatterAction, SquatterPolicy, grace_minutes
from gpufarm.core.kernel import history
from gpufarm.core.kernel.hosts import EXEMPT_SQUATTERS_TAG, stop_tag
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IncidentCommand, Op, SquatterScope
from gpufarm.core.service import GpuFarm
from gpufarm.core.squatters import episodes
from gpufarm.core.squatters.episodes import Episode, Step

HOLDER = "U0000000002"
OPS = "C0000000001"
DEVICE = "gpu-00000000-0000-4000-8000-000000000001"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STOP_AFTER = SquatterPolicy(policy=SquatterAction.STOP_AFTER, grace="10m")


# -- the policy ------------------------------------------------------------------------------------------------


def test_the_policy_reads_a_bare_action_or_a_mapping_and_refuses_a_bad_grace() -> None:
    assert SquatterPolicy.model_validate("report") == SquatterPolicy()
    assert SquatterPolicy.model_validate("stop-after").stops
    policy = SquatterPolicy.model_validate({"policy": "stop-after", "grace": "2h"})
    assert policy.stops and policy.grace_minutes == 120
    for bad in ({"policy": "kill"}, {"grace": "0m"}, {"grace": "25h"}, {"grace": "10s"}, {"grace": "-5m"}, "evict"):
        with pytest.raises(ValueError, match=r"policy|grace"):
            SquatterPolicy.model_validate(bad)
    with pytest.raises(ValueError, match="Extra inputs"):
        SquatterPolicy.model_validate({"policy": "report", "graze": "10m"})
    assert grace_minutes("90m") == 90 and grace_minutes("1441m") is None


def test_the_farm_file_takes_a_policy_per_environment_and_defaults_to_report() -> None:
    text = FARM_YAML.replace(
        "hpc: {kind: dedicated, gpu_models: [H100]}",
        "hpc: {kind: dedicated, gpu_models: [H100], squatters: {policy: stop-after, grace: 15m}}",
    )
    farm = parse_farm(text)
    assert farm.environments["hpc"].squatters.grace_minutes == 15
    assert not farm.environments["cloud"].squatters.stops
    with pytest.raises(FarmConfigError, match=r"environments\.hpc\.squatters\.grace"):
        parse_farm(text.replace("grace: 15m", "grace: forever"))


# -- the rules (pure) ------------------------------------------------------------------------------------------


def test_an_episode_opens_once_and_stops_only_past_the_grace_under_stop_after() -> None:
    part = episodes.part_of("GPU-A-01", DEVICE)
    assert part == f"gpu-a-01/{DEVICE}"
    step, opened = episodes.decide_alert({}, part, T0, STOP_AFTER, exempt=False)
    assert step is Step.OPEN and opened.since == T0
    held = {part: opened}
    assert episodes.decide_alert(held, part, T0 + timedelta(minutes=9), STOP_AFTER, exempt=False)[0] is Step.NOTHING
    step, stopped = episodes.decide_alert(held, part, T0 + timedelta(minutes=10), STOP_AFTER, exempt=False)
    assert step is Step.STOP and stopped.stop_at == T0 + timedelta(minutes=10) and stopped.since == T0
    # Once stopped, never stopped again; never under report; never on an exempt host.
    assert episodes.decide_alert({part: stopped}, part, T0 + timedelta(hours=1), STOP_AFTER, exempt=False)[0] is (
        Step.NOTHING
    )
    assert episodes.decide_alert(held, part, T0 + timedelta(days=1), SquatterPolicy(), exempt=False)[0] is Step.NOTHING
    assert episodes.decide_alert(held, part, T0 + timedelta(days=1), STOP_AFTER, exempt=True)[0] is Step.NOTHING


def test_the_field_round_trips_and_skips_what_a_hand_edit_broke() -> None:
    kept = {"h/gpu-1": Episode("h/gpu-1", T0), "h/gpu-2": Episode("h/gpu-2", T0, T0 + timedelta(minutes=10))}
    items = episodes.encode(kept)
    assert items == ["h/gpu-1=2026-12-01T12:00:00Z", "h/gpu-2=2026-12-01T12:00:00Z;stop=2026-12-01T12:10:00Z"]
    assert episodes.decode([*items, "garbage", "nohost=2026-12-01T12:00:00Z", "h/gpu-3=yesterday"]) == kept


# -- through the pool's one writer -----------------------------------------------------------------------------


def _farm(policy: str = "") -> tuple[GpuFarm, FakeChat, FakeClock, FakeHosts, FakeIncidents]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc", "a")
    chat = FakeChat(operators=frozenset({"U0000000009"}))
    text = FARM_YAML.replace(
        "hpc: {kind: dedicated, gpu_models: [H100]}", f"hpc: {{kind: dedicated, gpu_models: [H100]{policy}}}"
    )
    svc = GpuFarm(
        incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(text), metrics=FakeMetrics()
    )
    assert ask_hpc(svc, incidents, HOLDER, 8, 7) == 1
    return svc, chat, clock, hosts, incidents


def _alert(svc: GpuFarm, origin: str, op: Op = Op.SQUATTER, ir: int | None = 1, host: str = "hpc-1") -> str:
    command = IncidentCommand(op=op, ir=ir, origin=origin, squatter=SquatterScope(host=host, device=DEVICE, value=1))
    return executor.execute(svc.context, command)


def _squatter_posts(chat: FakeChat) -> list[tuple[str, str]]:
    return [(s.kind, s.target) for s in chat.sent if "squatter" in s.text.lower()]


def _steps(incidents: FakeIncidents) -> list[str]:
    alloc = Allocation.from_record(incidents.by_ir(1))
    return [e.step for line in alloc.history if (e := history.parse(line)) is not None and e.step.startswith("squat")]


def test_an_episode_is_told_once_to_the_operators_and_the_holder_and_ends_on_recovery() -> None:
    svc, chat, clock, hosts, incidents = _farm()
    before = len(chat.sent)
    assert "told" in _alert(svc, "m1|triggered|1")
    assert _squatter_posts(chat) == [("post", OPS), ("dm", HOLDER)]
    # Datadog's retry of the same notification, and a re-notification later: nothing more is said.
    assert _alert(svc, "m1|triggered|1").startswith("already applied")
    clock.advance(minutes=30)
    assert "nothing to do" in _alert(svc, "m1|renotify|2")
    assert len(chat.sent) == before + 2
    alloc = Allocation.from_record(incidents.by_ir(1))
    assert alloc.squatters == (f"hpc-1/{DEVICE}={history.isoformat(clock.now() - timedelta(minutes=30))}",)
    assert "ended after 30 min" in _alert(svc, "m1|recovered|3", Op.SQUATTER_CLEAR)
    assert Allocation.from_record(incidents.by_ir(1)).squatters == ()
    # The next alert is a new episode, told again.
    assert "told" in _alert(svc, "m1|triggered|4")
    assert _steps(incidents) == ["squatted", "squatter-cleared", "squatted"]
    assert hosts.user("hpc-1") == [t for t in hosts.user("hpc-1") if not t.startswith("gpufarm_stop")]


def test_under_stop_after_the_stop_is_published_past_the_grace_and_lifted_when_the_episode_ends() -> None:
    svc, chat, clock, hosts, incidents = _farm(", squatters: {policy: stop-after, grace: 10m}")
    _alert(svc, "m1|triggered|1")
    since = clock.now()
    (dm,) = [s for s in chat.to(HOLDER, "dm") if "squatter" in s.text.lower() or "runs on" in s.text]
    assert "stopped (SIGTERM to a process, eviction of a pod) at" in str(dm.blocks)
    clock.advance(minutes=5)
    assert "nothing to do" in _alert(svc, "m1|renotify|2")
    assert not [t for t in hosts.user("hpc-1") if t.startswith("gpufarm_stop")]
    clock.advance(minutes=5)
    assert "stopped after 10 min" in _alert(svc, "m1|renotify|3")
    assert stop_tag(DEVICE, int(since.timestamp())) in hosts.user("hpc-1")
    assert [s.target for s in chat.sent if s.text.startswith("stopping the squatter")] == [OPS, HOLDER]
    clock.advance(minutes=5)
    assert "nothing to do" in _alert(svc, "m1|renotify|4")  # published once
    assert "ended after 15 min" in _alert(svc, "m1|recovered|5", Op.SQUATTER_CLEAR)
    assert "after 15 min (stopped)" in Allocation.from_record(incidents.by_ir(1)).history[-1]
    assert not [t for t in hosts.user("hpc-1") if t.startswith("gpufarm_stop")]
    assert "ir:ir-1" in hosts.user("hpc-1")  # the lease's own tags stay
    assert _steps(incidents) == ["squatted", "squatter-stopped", "squatter-cleared"]


def test_an_exempt_host_is_told_but_never_stopped() -> None:
    svc, chat, clock, hosts, _incidents = _farm(", squatters: stop-after")
    hosts.add_tags("hpc-1", [EXEMPT_SQUATTERS_TAG])
    _alert(svc, "m1|triggered|1")
    assert "exempted this host" in str(chat.to(HOLDER, "dm")[-1].blocks)
    clock.advance(minutes=60)
    assert "nothing to do" in _alert(svc, "m1|renotify|2")
    assert not [t for t in hosts.user("hpc-1") if t.startswith("gpufarm_stop")]


def test_an_alert_for_a_host_the_lease_does_not_hold_changes_nothing() -> None:
    svc, chat, _clock, hosts, _incidents = _farm()
    hosts.seed("hpc-2", "H100", 8, "hpc", "a")
    before = len(chat.sent)
    assert "not held by IR-1" in _alert(svc, "m1|triggered|1", host="hpc-2")
    assert len(chat.sent) == before


def test_a_device_no_lease_holds_is_told_to_the_operators_alone_once_per_notification() -> None:
    svc, chat, _clock, _hosts, _incidents = _farm()
    queue = FakeQueue()
    svc.context.queue = queue
    command = IncidentCommand(
        op=Op.SQUATTER, origin="m1|triggered|1", squatter=SquatterScope(host="hpc-9", device=DEVICE)
    )
    assert command.group() == "unassigned"
    executor.submit(svc.context, command)
    executor.submit(svc.context, command)  # Datadog's retry of the same notification: the queue drops the twin
    assert len(queue.sent) == 1
    before = len(chat.sent)
    svc.context.queue = None
    assert "no lease" in executor.execute(svc.context, command)
    assert [(s.kind, s.target) for s in chat.sent[before:]] == [("post", OPS)]
    assert "no lease" in chat.sent[-1].text
    with pytest.raises(ValueError, match="monitor group"):
        IncidentCommand(op=Op.SQUATTER, origin="x")
