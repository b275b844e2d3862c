"""Idle settings a request chooses (gpufarm.core.governance.idle_choice) and how the lease honours them
(gpufarm.core.idle.lease_window): bounded at request time, the window by gpufarm's own timer over the pool's
monitors, the grace by the sweep."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat.command_text import parse_command
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm.core.kernel.serial import IdleScope
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

USER = "U0000000001"
OPS = "U0000000OPS"
FARM = parse_farm(FARM_YAML)
_ids = itertools.count(1)


def _build(text: str) -> dict[str, int | None]:
    args = parse_command(f"request 8 H100 env=hpc team=nlp project=p {text}").args or {}
    request = build_request(args, FARM, requester=USER, channel=None, request_id=f"idle-{next(_ids):06d}")
    return {"window": request.idle_window_minutes, "grace": request.idle_grace_minutes}


def test_a_request_chooses_its_idle_window_and_grace_within_the_bounds() -> None:
    assert _build("idle=2h grace=30m") == {"window": 120, "grace": 30}
    assert _build("idle=90 grace=1h") == {"window": 90, "grace": 60}
    assert _build("") == {"window": None, "grace": None}
    with pytest.raises(ValidationFailed, match=r"idle= in hpc is between 30 and 240 minutes, not 300"):
        _build("idle=5h")
    with pytest.raises(ValidationFailed, match=r"grace= in hpc is between 15 and 480 minutes, not 5"):
        _build("grace=5m")
    # The pool's idle monitor judges over 60 minutes: nothing can warn sooner.
    with pytest.raises(
        ValidationFailed, match=r"hpc's idle monitors judge over 60 min at the least: choose idle=60m or more"
    ):
        _build("idle=45m")
    with pytest.raises(ValidationFailed, match=r"idle= takes a duration such as 30m, 2h or 1d"):
        _build("idle=soon")


def test_a_pool_has_its_own_bounds_and_bad_bounds_are_refused() -> None:
    farm = parse_farm(FARM_YAML + "idle_choice:\n  environments:\n    hpc: {window_minutes: {min: 60, max: 1440}}\n")
    assert farm.idle_choice.pool("hpc").window_minutes.max == 1440
    assert farm.idle_choice.pool("cloud").window_minutes.max == 240
    with pytest.raises(FarmConfigError, match="min"):
        parse_farm(FARM_YAML + "idle_choice:\n  window_minutes: {min: 120, max: 60}\n")
    with pytest.raises(FarmConfigError, match="'nowhere' is not an environment"):
        parse_farm(FARM_YAML + "idle_choice:\n  environments:\n    nowhere: {grace_minutes: {min: 1, max: 2}}\n")


@pytest.fixture
def svc() -> Iterator[tuple[GpuFarm, FakeClock]]:
    clock = FakeClock()
    hosts = FakeHosts()
    hosts.seed("hpc-0", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    yield GpuFarm(incidents=FakeIncidents(clock), hosts=hosts, chat=chat, clock=clock, farm=FARM), clock


def _lease(svc: GpuFarm, text: str) -> int:
    args = parse_command(f"request 8 H100 env=hpc team=nlp project=p {text}").args or {}
    request = build_request(args, FARM, requester=USER, channel=None, request_id=f"idle-{next(_ids):06d}")
    alloc, _ = svc.create_request(request)
    svc.decide_request(alloc.ir)
    svc.allocate(svc.allocation(alloc.ir))
    return alloc.ir


MONITOR = IdleScope(hosts=("hpc-0",), kind="idle", value=0.0, window_minutes=60)


def test_a_longer_chosen_window_holds_the_monitors_alert_back_until_it_has_passed(
    svc: tuple[GpuFarm, FakeClock],
) -> None:
    farm, clock = svc
    ir = _lease(farm, "idle=2h grace=30m")
    alloc = farm.allocation(ir)
    assert (alloc.idle_window_minutes, alloc.idle_grace_minutes) == (120, 30)
    clock.advance(hours=3)
    first_alert = clock.now()
    outcome = farm.idle_triggered(ir, MONITOR)  # idle for the monitor's 60 minutes: 60 more to go
    assert outcome.action.startswith("held back: IR-1 chose idle=120m")
    assert farm.allocation(ir).phase is Phase.ALLOCATED
    assert farm.allocation(ir).idle_pending == first_alert - timedelta(minutes=60)
    clock.advance(minutes=30)
    assert farm.sweep().to_warn == []
    clock.advance(minutes=31)
    assert farm.sweep().to_warn == [ir]  # idle for its own 120 minutes: the sweep's idle command warned it
    warned = farm.allocation(ir)
    assert warned.phase is Phase.IDLE_WARNED and warned.idle_pending is None
    # Its own grace (30 min), not the pool's 60.
    clock.advance(minutes=31)
    assert farm.sweep().to_end == [ir]
    ended = farm.allocation(ir)
    assert ended.reclaim_reason is ReclaimReason.IDLE
    assert any("past the 30 min grace [reclaimed-idle]" in line for line in ended.history)


def test_busy_again_before_its_own_window_passed_clears_it(svc: tuple[GpuFarm, FakeClock]) -> None:
    farm, clock = svc
    ir = _lease(farm, "idle=4h")
    clock.advance(hours=2)
    farm.idle_triggered(ir, MONITOR)
    assert farm.allocation(ir).idle_pending is not None
    assert farm.idle_recovered(ir, MONITOR).action == "recovered before its own idle window passed"
    assert farm.allocation(ir).idle_pending is None
    clock.advance(hours=4)
    assert farm.sweep().to_warn == []


def test_a_lease_without_its_own_window_is_warned_at_the_monitors(svc: tuple[GpuFarm, FakeClock]) -> None:
    farm, clock = svc
    ir = _lease(farm, "")
    clock.advance(hours=2)
    assert farm.idle_triggered(ir, MONITOR).action.startswith("warned")


def test_the_monitors_do_not_grow_with_the_windows_leases_choose() -> None:
    # docs/scheduling.md, "Idle settings per lease": the example farm's 6 monitors, whatever the leases choose
    # (the monitors are made from the farm file alone; leases' windows are honoured by gpufarm's own timer).
    from pathlib import Path

    from gpufarm.setup.monitors import desired_monitors

    text = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text(encoding="utf-8")
    farm = parse_farm(text)
    assert len(desired_monitors(farm)) == 6
    wide = parse_farm(text + "idle_choice:\n  window_minutes: {min: 60, max: 1440}\n")
    assert len(desired_monitors(wide)) == 6
