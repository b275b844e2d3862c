"""The outlook (gpufarm.core.outlook): unmet demand per pool and model by reason, free capacity weeks ahead with
leases ending and reservations, its gauges as spec/metrics.yaml declares them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import spec_check

from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.outlook.capacity import first_short, outlook, pool_capacity, slot_bounds
from gpufarm.core.outlook.demand import unmet_demand, wait_span
from gpufarm.core.outlook.gauges import FREE_GPUS, GAUGES, LEASED_GPUS, RESERVED_GPUS, outlook_series

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)  # a Monday
START, END = NOW - timedelta(days=7), NOW


def _at(days: float) -> datetime:
    return NOW + timedelta(days=days)


def _line(at: datetime, step: str, details: str = "") -> str:
    return f"{at:%Y-%m-%dT%H:%M:%SZ} gpufarm {step}" + (f": {details}" if details else "")


def lease(ir: int, **values: object) -> LeaseFacts:
    base: dict[str, object] = {
        "state": State.STABLE,
        "phase": Phase.ALLOCATED,
        "team": "nlp",
        "environment": "hpc",
        "gpu_model": "H100",
        "gpu_count": 8,
    }
    return LeaseFacts(ir=ir, **(base | values))  # type: ignore[arg-type]


def test_a_wait_runs_from_its_waiting_step_to_its_allocation_and_counts_its_gpus() -> None:
    waited = lease(
        1,
        allocated_at=_at(-2),
        history=(
            _line(_at(-3), "requested"),
            _line(_at(-3), "waiting", "position 2 of 2 [queued-capacity]"),
            _line(_at(-2), "allocated", "node-1"),
        ),
    )
    assert wait_span(waited, NOW) == (_at(-3), _at(-2))
    [hpc] = unmet_demand([waited], START, END, NOW)
    assert (hpc.environment, hpc.gpu_model, hpc.waited) == ("hpc", "H100", 1)
    assert hpc.waiting_gpu_hours == pytest.approx(8 * 24)
    assert hpc.waited_why == {"queued-capacity": 1} and not hpc.refused and not hpc.withdrawn


def test_a_request_still_waiting_counts_to_now_and_only_inside_the_period() -> None:
    still = lease(
        2,
        state=State.ACTIVE,
        phase=Phase.WAITING,
        gpu_count=4,
        waiting_since=_at(-10),
        history=(_line(_at(-10), "waiting", "queued [queued-fair-share]"),),
    )
    [hpc] = unmet_demand([still], START, END, NOW)
    assert hpc.waiting_gpu_hours == pytest.approx(4 * 7 * 24)  # the period's 7 days, not the 10 it waited
    # The reason given before the period is not counted in it.
    assert hpc.waited_why == {}


def test_refused_and_withdrawn_are_counted_per_pool_and_model_by_reason() -> None:
    refused = lease(
        3,
        state=State.RESOLVED,
        phase=Phase.REJECTED,
        gpu_count=16,
        history=(_line(_at(-1), "refused", "over the hard limit [refused-policy]"),),
    )
    rejected = lease(
        4,
        state=State.RESOLVED,
        phase=Phase.REJECTED,
        environment="cloud",
        gpu_model="a100",
        gpu_count=2,
        history=(_line(_at(-2), "rejected", "no budget [rejected-operator]"),),
    )
    withdrawn = lease(
        5,
        state=State.RESOLVED,
        phase=Phase.RECLAIMED,
        gpu_count=8,
        history=(
            _line(_at(-4), "waiting", "queued [queued-capacity]"),
            _line(_at(-3), "withdrawn", "no hosts within 24 h [withdrawn-wait-limit]"),
        ),
    )
    # A refusal whose history line was folded away counts by its field, at its end.
    folded = lease(
        6, state=State.RESOLVED, phase=Phase.REJECTED, gpu_count=1, reason="refused-policy", modified=_at(-1)
    )
    old = lease(
        7,
        state=State.RESOLVED,
        phase=Phase.REJECTED,
        history=(_line(_at(-30), "refused", "over [refused-policy]"),),
    )
    found = unmet_demand([refused, rejected, withdrawn, folded, old], START, END, NOW)
    assert [(d.environment, d.gpu_model) for d in found] == [("hpc", "H100"), ("cloud", "A100")]
    hpc, cloud = found
    assert hpc.refused == {"refused-policy": 2} and hpc.withdrawn == {"withdrawn-wait-limit": 1}
    assert hpc.unmet_requests == 3 and hpc.unmet_gpus == 16 + 8 + 1
    assert hpc.waiting_gpu_hours == pytest.approx(8 * 24) and hpc.waited == 1
    assert cloud.refused == {"rejected-operator": 1} and cloud.unmet_gpus == 2 and cloud.waiting_gpu_hours == 0


def test_leases_that_never_waited_are_no_demand() -> None:
    assert unmet_demand([lease(8, allocated_at=_at(-1), history=(_line(_at(-1), "allocated"),))], START, END, NOW) == []


def test_free_capacity_by_week_counts_leases_to_their_ends_and_reservations_over_their_windows() -> None:
    live = [
        # 8 GPUs until day 10: weeks 0 and 1.
        lease(10, expires_at=_at(10)),
        # 4 GPUs with no end: held for ever.
        lease(11, gpu_count=4, expires_at=None),
        # A reservation of 8 over days 15-17: week 2 only.
        lease(12, state=State.ACTIVE, phase=Phase.RESERVED, reserved_from=_at(15), reserved_until=_at(17)),
        # Another pool's lease and an ended lease: not counted.
        lease(13, environment="cloud", expires_at=_at(30)),
        lease(14, state=State.RESOLVED, phase=Phase.RECLAIMED, expires_at=_at(30)),
    ]
    [hpc] = outlook(live, {("hpc", "H100"): 16}, NOW)
    assert [(s.leased, s.reserved, s.free) for s in hpc.slots] == [(12, 0, 4), (12, 0, 4), (4, 8, 4), (4, 0, 12)]
    assert hpc.slots[0].start == NOW and hpc.slots[0].end == datetime(2026, 12, 14, tzinfo=UTC)
    assert hpc.first_short() is None and first_short([hpc]) is None


def test_the_first_week_capacity_runs_out_is_named() -> None:
    live = [
        lease(20, gpu_count=8, expires_at=_at(20)),
        lease(21, state=State.ACTIVE, phase=Phase.RESERVED, reserved_from=_at(8), reserved_until=_at(9)),
    ]
    pools = outlook(live, {("hpc", "H100"): 16, ("cloud", "A100"): 8}, NOW)
    short = first_short(pools)
    assert short is not None
    pool, slot = short
    assert (pool.environment, pool.gpu_model, slot.free, slot.start) == ("hpc", "H100", 0, slot_bounds(NOW)[1][0])


def test_day_slots_and_capacity_from_the_inventory() -> None:
    assert [b[1] - b[0] for b in slot_bounds(NOW, 3, 1)] == [timedelta(hours=12), timedelta(days=1), timedelta(days=1)]
    hosts = [
        GpuHost("node-1", "H100", 8, "hpc", "c1"),
        GpuHost("node-2", "H100", 8, "hpc", "c1"),
        GpuHost("slice-1", "A100", 2, "slices", "c1"),
        GpuHost("stray", "L4", 4, "hpc", "c1"),  # a model the pool does not offer
    ]
    capacity = pool_capacity({"hpc": ("H100",), "slices": ("A100",)}, hosts, shared=["slices"])
    assert capacity == {("hpc", "H100"): 16, ("slices", "A100"): 2}


def test_gauges_per_pool_model_and_week_as_the_spec_declares_them() -> None:
    pools = outlook([lease(30, expires_at=_at(3))], {("hpc", "H100"): 16}, NOW)
    series = outlook_series(pools, int(NOW.timestamp()))
    assert len(series) == 3 * 4 and {s.metric for s in series} == set(GAUGES)
    for s in series:
        assert spec_check.problems(s, "lifecycle_metrics") == []
    values = {(s.metric, s.tags[-1]): s.points[0].value for s in series}
    assert values[(LEASED_GPUS, "week:00")] == 8 and values[(FREE_GPUS, "week:00")] == 8
    assert values[(FREE_GPUS, "week:01")] == 16 and values[(RESERVED_GPUS, "week:03")] == 0
