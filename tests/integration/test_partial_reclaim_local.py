"""Partial reclaim end to end on the local host, from agent-shaped metrics through the monitors `datadog apply`
makes: a 16-GPU lease on two hosts goes half idle, the idle host is warned on its own, the monitor's re-notification
after the grace gives that host back (the lease shrinks and stays open on its busy host), and the team's quota counts
the smaller lease. Fast: the metrics are submitted an hour at a time and the sandbox clock jumps."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB, DANA, OPERATORS_CHANNEL, Person

pytestmark = pytest.mark.integration

# Generous: the functions run in-process and the machine may be busy; nothing here sleeps for real.
SETTLE_S = 60.0


def _series(host: str, ir: int, busy: bool, stamps: range) -> list[MetricSeries]:
    """What gpufarm-node sends for a host's 8 whole GPUs (spec/metrics.yaml), one point a minute."""
    out: list[MetricSeries] = []
    for index in range(8):
        uuid = f"gpu-{zlib.crc32(host.encode()):08x}-0000-4000-8000-{index:012x}"
        tags = ("environment:onprem-hpc", f"gpu_uuid:{uuid}", f"gpu_index:{index}", f"gpu_ir:ir-{ir}", f"ir:ir-{ir}")

        def gauge(metric: str, value: float, *extra: str, tags: tuple[str, ...] = tags) -> MetricSeries:
            return MetricSeries(metric, tuple(MetricPoint(t, value) for t in stamps), (*tags, *extra), host=host)

        out += [
            gauge("gpufarm.gpu.utilization", 88.0 if busy else 0.0),
            gauge("gpufarm.gpu.processes", 1.0 if busy else 0.0),
            gauge("gpufarm.gpu.idle_state", 1.0 if busy else 0.0, "state:busy"),
            gauge("gpufarm.gpu.idle_state", 0.0 if busy else 1.0, "state:idle"),
            gauge("gpufarm.gpu.idle_state", 0.0, "state:idle_held"),
        ]
    return out


def _hour(farm: LocalFarm, ir: int, idle_host: str, busy_host: str, minutes: int) -> None:
    """The last `minutes` of agent metrics for both hosts, then three minutes on the clock (the monitors evaluate;
    a fresh group is judged once it has had a whole window)."""
    now = int(_clock(farm))
    stamps = range(now - minutes * 60, now + 1, 60)
    farm.gateway.submit([*_series(idle_host, ir, False, stamps), *_series(busy_host, ir, True, stamps)])
    for _ in range(3):
        farm.post("/_sandbox/clock", {"advance": 60})
        farm.settle(timeout=SETTLE_S)


def test_the_idle_host_of_a_half_idle_lease_goes_back_and_the_quota_counts_the_smaller_lease(farm: LocalFarm) -> None:
    ir = _approved(farm, BOB, "request 16 H100 project=vit team=vision env=onprem-hpc")
    busy_host, idle_host = sorted(farm.allocation(ir).hosts)
    # Alice fills the pool's other two hosts.
    assert _approved(farm, ALICE, "request 16 H100 project=a team=nlp env=onprem-hpc") is not None
    # Team vision holds its hard limit (16): more is refused, nothing is created.
    farm.slash(BOB, "request 8 H100 project=more team=vision env=onprem-hpc")
    farm.settle(timeout=SETTLE_S)
    assert farm.wait_for(lambda: farm.messages(user=BOB.id, contains="hard limit"), timeout=SETTLE_S)

    # The hour of metrics, one host idle and one busy: the idle host alone is warned.
    _hour(farm, ir, idle_host, busy_host, 59)
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.IDLE_WARNED, timeout=SETTLE_S)
    lease = farm.allocation(ir)
    assert [p.split("=")[0] for p in lease.idle_parts] == [idle_host]
    assert farm.messages(user=BOB.id, kind="dm", contains=f"part of IR-{ir} is idle and goes back")

    # An hour on, still idle there: the monitor re-notifies and the idle host leaves the lease.
    farm.post("/_sandbox/clock", {"advance": 59 * 60})
    _hour(farm, ir, idle_host, busy_host, 60)
    assert farm.wait_for(lambda: idle_host not in farm.allocation(ir).hosts, timeout=SETTLE_S)
    lease = farm.allocation(ir)
    assert lease.phase is Phase.ALLOCATED and lease.hosts == (busy_host,) and lease.gpu_count == 8
    assert f"ir:ir-{ir}" in farm.ir_tags(busy_host) and f"ir:ir-{ir}" not in farm.ir_tags(idle_host)
    assert farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir} gave back {idle_host}")
    # The quota counts the smaller lease: the same request now fits (an operator approves) on the host given back.
    more = _approved(farm, BOB, "request 8 H100 project=more team=vision env=onprem-hpc")
    assert farm.allocation(more).hosts == (idle_host,)
    assert farm.ir_tags(idle_host) == [f"ir:ir-{more}"]


def _approved(farm: LocalFarm, person: Person, text: str) -> int:
    """A request beyond quota, approved by the operator; its IR once allocated."""
    before = len(farm.messages(user=person.id, kind="response", contains="IR-"))
    farm.slash(person, text)
    farm.settle(timeout=SETTLE_S)
    assert farm.wait_for(lambda: len(farm.messages(user=person.id, kind="response", contains="IR-")) > before)
    ir = ir_in(farm.messages(user=person.id, kind="response", contains="IR-")[-1]["text"])
    assert ir is not None
    [ask] = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir} needs approval")
    farm.click(DANA, ask, "gpu_approve")
    farm.settle(timeout=SETTLE_S)
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED, timeout=SETTLE_S)
    return ir


def _clock(farm: LocalFarm) -> float:
    state: Any = farm.get("/_sandbox/clock")
    return float(state["now"])
