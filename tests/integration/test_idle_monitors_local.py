"""Idle reclaim end to end on the local host, driven only by agent-shaped metrics: `datadog apply` creates the idle
monitors from the example farm's policy, a 16-GPU lease on two hosts goes half idle, the sandbox evaluates the
monitors on its clock, the idle webhook is called for the idle host only, and the requester is warned once."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.setup.apply import apply_setup
from gpufarm.setup.plan import SetupSpec
from gpufarm.setup.squatter_monitor import farm_monitors
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import BOB, DANA, OPERATORS_CHANNEL

pytestmark = pytest.mark.integration


def _apply_monitors(farm: LocalFarm) -> int:
    config = parse_farm((farm.host.root / "config" / "farm.example.yaml").read_text())
    env = farm.host.env
    spec = SetupSpec(
        incident_webhook_url=env["GPUFARM_INCIDENT_WEBHOOK_URL"],
        idle_webhook_url=env["GPUFARM_IDLE_WEBHOOK_URL"],
        valid_values=config.valid_values(),
        has_secret=True,
        monitors=farm_monitors(config),
    )
    plan = apply_setup(farm.admin, spec, secret=farm.settings.webhook_secret)
    assert not plan.blocked
    return len([c for c in plan.changes if c.kind == "monitor"])


def _agent_series(host: str, ir: int, index: int, busy: bool, stamps: range) -> list[MetricSeries]:
    """What gpufarm-node sends for one whole GPU (spec/metrics.yaml), one point a minute."""
    uuid = f"gpu-{zlib.crc32(host.encode()):08x}-0000-4000-8000-{index:012x}"
    tags = (
        "environment:onprem-hpc",
        f"gpu_uuid:{uuid}",
        f"gpu_index:{index}",
        "gpu_model:h100",
        "gpu_slicing_mode:none",
        f"gpu_ir:ir-{ir}",
        f"ir:ir-{ir}",
    )

    def gauge(metric: str, value: float, *extra: str) -> MetricSeries:
        points = tuple(MetricPoint(t, value) for t in stamps)
        return MetricSeries(metric, points, (*tags, *extra), host=host)

    states = {"busy": busy, "idle": not busy, "idle_held": False}
    return [
        gauge("gpufarm.gpu.utilization", 88.0 if busy else 0.0),
        gauge("gpufarm.gpu.processes", 1.0 if busy else 0.0),
        *(gauge("gpufarm.gpu.idle_state", 1.0 if on else 0.0, f"state:{s}") for s, on in states.items()),
    ]


def test_half_idle_lease_is_warned_from_its_idle_host_through_the_projects_own_monitors(farm: LocalFarm) -> None:
    assert _apply_monitors(farm) == 7  # six idle monitors and the squatter monitor
    farm.slash(BOB, "request 16 H100 project=vit team=vision env=onprem-hpc")
    assert farm.settle()
    ir = ir_in(farm.messages(user=BOB.id, kind="response", contains="IR-")[-1]["text"])
    assert ir is not None
    [ask] = farm.messages(channel=OPERATORS_CHANNEL, contains="needs approval")
    farm.click(DANA, ask, "gpu_approve")
    assert farm.settle()
    lease = farm.allocation(ir)
    assert lease.phase is Phase.ALLOCATED and len(lease.hosts) == 2
    idle_host, busy_host = sorted(lease.hosts)

    # Two hours of agent metrics, the longest window: 8 idle GPUs on one host, 8 busy on the other (the lease
    # averages 44 %). Datadog takes points at most an hour old, so they go in as two hours, an hour apart; a group is
    # judged only once it has had a whole window of data.
    for hour in range(2):
        now = int(_clock(farm))
        stamps = range(now - 59 * 60, now + 1, 60)
        series = [s for i in range(8) for s in _agent_series(idle_host, ir, i, False, stamps)]
        series += [s for i in range(8) for s in _agent_series(busy_host, ir, i, True, stamps)]
        farm.gateway.submit(series)
        for _ in range(5 if hour else 1):
            farm.post("/_sandbox/clock", {"advance": 60 if hour else 3600})
            assert farm.settle()
        if not hour:
            assert farm.allocation(ir).phase is Phase.ALLOCATED  # an hour of data: not judged yet
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.IDLE_WARNED, timeout=20)

    events = farm.get("/_sandbox/monitors/events")["events"]
    fired = {(e["group"], e["transition"]) for e in events if e["notified"]}
    assert fired == {(f"gpu_ir:ir-{ir},host:{idle_host}", "Triggered")}, events
    assert {e["monitor_name"].split(" (")[0] for e in events} == {
        "[gpufarm] no process on its GPUs",
        "[gpufarm] low GPU utilisation",
    }
    # Two monitors fired for the idle host; the requester is warned once.
    warnings = farm.messages(user=BOB.id, kind="dm", contains="has been idle")
    assert len(warnings) == 1, warnings

    # A job started on the idle host ten minutes ago: both monitors recover (no-process at once, the two-hour mean
    # utilisation climbs over 5 %), and only then is the warning cleared.
    now = int(_clock(farm))
    farm.gateway.submit(
        [s for i in range(8) for s in _agent_series(idle_host, ir, i, True, range(now - 600, now + 1, 60))]
    )
    farm.post("/_sandbox/clock", {"advance": 60})
    assert farm.settle()
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED, timeout=20)
    # Datadog redelivers the old Triggered late: its group is OK now, so it is stale and warns no one.
    triggered = next(
        d["payload"]
        for d in farm.get("/_sandbox/webhooks/deliveries")["deliveries"]
        if d["webhook"] == "gpufarm-idle" and '"Triggered"' in d["payload"] and "kind idle," in d["payload"]
    )
    token = {"X-Gpufarm-Token": farm.host.env["GPUFARM_WEBHOOK_SECRET"]}
    status, body = farm.post("/fn/idle_alert/", json.loads(triggered), token)
    assert status == 200 and "stale Triggered" in body["ignored"], body
    assert farm.settle()
    assert farm.allocation(ir).phase is Phase.ALLOCATED
    assert len(farm.messages(user=BOB.id, kind="dm", contains="has been idle")) == 1


def _clock(farm: LocalFarm) -> float:
    state: Any = farm.get("/_sandbox/clock")
    return float(state["now"])
