"""A lease's cost in a period: its hours inside the period by kind (whole months, a cut month's share, the live
stretch unmeasured), idle-held apart from idle, times its rate with MIG shares; unpriced is None, never zero."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from fakes import FARM_YAML

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.money.card import RateCard, round_cents
from gpufarm.core.money.lease_cost import KINDS, HoursByKind, lease_cost, lease_hours

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
CARD = RateCard(
    parse_farm(FARM_YAML + "rates:\n  currency: EUR\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.50}}\n").rates
)


def _t(day: int, hour: int = 0, month: int = 12) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


def facts(**kw: Any) -> LeaseFacts:
    base: dict[str, Any] = {
        "ir": 7,
        "state": State.RESOLVED,
        "phase": Phase.RECLAIMED,
        "team": "nlp",
        "environment": "hpc",
        "gpu_model": "H100",
        "gpu_count": 8,
        "hosts": ("node-1",),
        "host_gpus": {"node-1": 8},
    }
    return LeaseFacts(**(base | kw))


# Held 8 GPUs Nov 21 00:00 to Dec 1 00:00 (1920 GPU-h): busy 1200, idle 560 of which 240 idle-held, unmeasured 160.
ENDED = facts(
    allocated_at=_t(21, month=11),
    hours_until=_t(1),
    hours_held=1920,
    hours_busy=1200,
    hours_idle=560,
    hours_idle_held=240,
    hours_unmeasured=160,
    hours_by_month=("2026-11=1920.000",),
)


def test_a_whole_month_takes_its_hours_and_idle_held_is_apart_from_idle() -> None:
    hours = lease_hours(ENDED, _t(1, month=11), _t(1), NOW)
    assert hours == HoursByKind(held=1920, busy=1200, idle=320, idle_held=240, unmeasured=160)
    assert hours.busy + hours.idle + hours.idle_held + hours.unmeasured == hours.held


def test_a_cut_month_takes_the_share_held_inside_the_period() -> None:
    # Nov 26 to Dec 10: half the lease's holding in November.
    half = lease_hours(ENDED, _t(26, month=11), _t(10), NOW)
    assert half.held == pytest.approx(960) and half.idle_held == pytest.approx(120)
    assert half.idle == pytest.approx(160) and half.busy == pytest.approx(600) and half.unmeasured == pytest.approx(80)
    assert lease_hours(ENDED, _t(1), _t(10), NOW) == HoursByKind()


def test_a_live_lease_counts_its_stretch_since_the_last_accrual_as_unmeasured() -> None:
    live = facts(
        state=State.STABLE,
        phase=Phase.ALLOCATED,
        allocated_at=_t(10, 8),
        hours_until=_t(10, 10),
        hours_held=16,
        hours_busy=8,
        hours_idle=8,
        hours_idle_held=2,
        hours_by_month=("2026-12=16.000",),
    )
    hours = lease_hours(live, _t(9, 12), NOW, NOW)
    assert hours == HoursByKind(held=32, busy=8, idle=6, idle_held=2, unmeasured=16)


def test_idle_held_beyond_idle_is_bounded_by_idle() -> None:
    odd = facts(hours_held=10, hours_idle=2, hours_idle_held=5, hours_busy=8, hours_by_month=("2026-11=10.000",))
    hours = lease_hours(odd, _t(1, month=11), _t(1), NOW)
    assert (hours.idle, hours.idle_held) == (0, 2)


def test_each_kind_is_priced_at_the_lease_rate_and_the_kinds_add_up_to_the_held_cost() -> None:
    hours = lease_hours(ENDED, _t(1, month=11), _t(1), NOW)
    cost = lease_cost(CARD, ENDED, hours)
    assert cost.currency == "EUR" and cost.priced and cost.amount == Decimal("4800.0")
    assert {k: round_cents(v) for k, v in cost.by_kind.items() if v is not None} == {
        "busy": Decimal("3000.00"),
        "idle": Decimal("800.00"),
        "idle_held": Decimal("600.00"),
        "unmeasured": Decimal("400.00"),
    }
    assert sum(v for v in cost.by_kind.values() if v is not None) == cost.amount


def test_a_lease_on_mig_slices_pays_their_share_of_the_gpu() -> None:
    sliced = facts(
        gpu_count=2,
        host_gpus={"node-1": 2},
        devices=("node-1=0.1/mig-aaaaaaaa-1111/1g.10gb", "node-1=0.2/mig-bbbbbbbb-2222/3g.40gb"),
    )
    cost = lease_cost(CARD, sliced, HoursByKind(held=14, busy=14))
    # Two slices of 1/7 and 3/7 of a GPU: 2 units x 7 h at the mean of their rates.
    assert cost.amount is not None and round_cents(cost.amount) == round_cents(Decimal("2.50") * 14 * 4 / 14)
    assert cost.by_kind["busy"] == cost.amount and cost.by_kind["idle"] == 0


@pytest.mark.parametrize("where", [{"environment": "cloud"}, {"gpu_model": "L4"}, {"environment": None}])
def test_an_unpriced_lease_has_no_amount_never_zero(where: dict[str, Any]) -> None:
    cost = lease_cost(CARD, facts(**where), HoursByKind(held=10, idle=10))
    assert cost.amount is None and not cost.priced and cost.currency == "EUR"
    assert cost.by_kind == dict.fromkeys(KINDS) and cost.rate is None
