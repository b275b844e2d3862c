"""GPU-hour budgets (issue 12 point 4): per team or project, per calendar month or quarter, never decaying; a
request expected to overspend goes to the operators with the numbers; burn is a gauge and part of /gpu quota."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, ask_hpc

from gpufarm.core.accounting import budgets
from gpufarm.core.config.accounting import Budget, BudgetPeriod
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.service import GpuFarm

USER, OPS = "U0000000001", "U0000000OPS"
BUDGET_YAML = FARM_YAML.replace(
    "hpc: {H100: {gpus: 8, hard_limit: 16}}", "hpc: {H100: {gpus: 32, hard_limit: 64}}"
).replace(
    "defaults:",
    "budgets:\n"
    "  - {team: nlp, period: month, gpu_hours: 2000}\n"
    "  - {team: nlp, project: big, period: quarter, gpu_hours: 1500}\n"
    "defaults:",
)


def lease(start: datetime, gpus: int = 8, *, months: tuple[str, ...] = (), until: datetime | None = None) -> Allocation:
    return Allocation(
        incident_id="x",
        ir=1,
        title="t",
        state=State.ACTIVE,
        phase=Phase.ALLOCATED,
        team="nlp",
        project="p",
        hosts=("a",),
        host_gpus={"a": gpus},
        allocated_at=start,
        hours_until=until,
        hours_by_month=months,
    )


def test_periods_follow_the_calendar_in_utc() -> None:
    dec = datetime(2026, 12, 31, 23, 59, tzinfo=UTC)
    assert budgets.period_months(BudgetPeriod.MONTH, dec) == ("2026-12",)
    assert budgets.period_months(BudgetPeriod.QUARTER, dec) == ("2026-10", "2026-11", "2026-12")
    jan = dec + timedelta(minutes=1)
    assert budgets.period_months(BudgetPeriod.QUARTER, jan) == ("2027-01", "2027-02", "2027-03")
    assert budgets.period_label(BudgetPeriod.QUARTER, jan) == "2027-Q1"
    assert budgets.period_label(BudgetPeriod.MONTH, datetime(2026, 3, 31, 23, tzinfo=UTC)) == "2026-03"


def test_burn_counts_accrued_months_and_the_unaccrued_stretch_of_a_holding_lease() -> None:
    start = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
    now = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    # Nothing accrued yet: 2 h in November and 2 h in December, 8 GPUs.
    fresh = lease(start)
    assert budgets.lease_burn(fresh, ("2026-12",), now) == 16
    assert budgets.lease_burn(fresh, ("2026-10", "2026-11", "2026-12"), now) == 32
    # Accrued to midnight (16 in November), then 2 h more not yet written.
    accrued = lease(start, months=("2026-11=16.000",), until=datetime(2026, 12, 1, tzinfo=UTC))
    assert budgets.lease_burn(accrued, ("2026-11",), now) == 16
    assert budgets.lease_burn(accrued, ("2026-12",), now) == 16
    # A new quarter starts from nothing: budgets do not carry over, and do not decay within a period.
    assert budgets.lease_burn(accrued, ("2027-01", "2027-02", "2027-03"), now) == 0
    ended = accrued.model_copy(update={"phase": Phase.RECLAIMED, "state": State.RESOLVED})
    assert budgets.lease_burn(ended, ("2026-12",), now + timedelta(days=5)) == 0  # an ended lease burns no more


def test_over_budget_names_the_numbers() -> None:
    budget = Budget(team="nlp", period=BudgetPeriod.MONTH, gpu_hours=1000)
    burned = budgets.Burn(budget, "2026-12", 900.0)
    assert budgets.over_budget(50, [burned]) is None
    reason = budgets.over_budget(192, [burned])
    assert reason == "nlp's GPU-hour budget for 2026-12 has 100 of 1,000 left (900 used) and this request expects 192"


def test_budgets_are_validated() -> None:
    with pytest.raises(FarmConfigError, match="'nobody' is not a team"):
        parse_farm(FARM_YAML + "budgets: [{team: nobody, gpu_hours: 10}]\n")
    with pytest.raises(FarmConfigError, match="two month budgets"):
        parse_farm(FARM_YAML + "budgets: [{team: nlp, gpu_hours: 10}, {team: nlp, gpu_hours: 20}]\n")
    with pytest.raises(FarmConfigError, match="gpu_hours"):
        parse_farm(FARM_YAML + "budgets: [{team: nlp, gpu_hours: -1}]\n")
    with pytest.raises(FarmConfigError, match="period"):
        parse_farm(FARM_YAML + "budgets: [{team: nlp, period: year, gpu_hours: 10}]\n")
    farm = parse_farm(BUDGET_YAML)
    assert [b.label() for b in farm.budgets] == ["nlp", "nlp/big"]


@dataclass
class World:
    svc: GpuFarm
    clock: FakeClock
    incidents: FakeIncidents
    chat: FakeChat
    metrics: FakeMetrics

    def ask(self, count: int, days: int, project: str = "p") -> int:
        return ask_hpc(self.svc, self.incidents, USER, count, days, project=project)

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock(datetime(2026, 12, 1, 0, 0, tzinfo=UTC))
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for n in range(6):
        hosts.seed(f"hpc-{n}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    metrics = FakeMetrics()
    farm = parse_farm(BUDGET_YAML)
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, metrics=metrics)
    yield World(svc, clock, incidents, chat, metrics)


def test_a_request_beyond_the_remaining_budget_goes_to_operators_with_the_numbers(world: World) -> None:
    first = world.ask(8, 7)  # 8 x 7 x 24 = 1,344 expected, within 2,000: approved by policy
    assert world.alloc(first).phase is Phase.ALLOCATED
    world.clock.advance(days=4)  # 768 GPU-hours burned
    second = world.ask(8, 7)  # 1,344 more expected, 1,232 left
    alloc = world.alloc(second)
    assert alloc.phase is Phase.REQUESTED  # within quota, but over budget: an operator decides
    card = next(str(m.blocks) for m in world.chat.sent if m.kind == "post" and f"IR-{second}" in m.text)
    assert "8 GPUs x 7 days x 24 = 1,344 GPU-hours expected" in card
    assert "1,232 of 2,000 left (768 used)" in card
    small = world.ask(8, 2)  # 384 expected: fits
    assert world.alloc(small).phase is Phase.ALLOCATED


def test_ended_leases_still_count_and_the_project_budget_applies_per_quarter(world: World) -> None:
    big = world.ask(8, 5, project="big")  # 960 expected of the project's 1,500 a quarter
    assert world.alloc(big).phase is Phase.ALLOCATED
    world.clock.advance(days=5)
    world.svc.release(big, USER)  # 960 held, written with its end
    ended = world.alloc(big)
    assert ended.hours_held == 960 and ended.hours_by_month == ("2026-12=960.000",)
    for record in list(world.incidents.search(IncidentQuery.where({State.RESOLVED}))):
        world.svc.process(record.id)
    assert world.alloc(big).state is State.RESOLVED
    again = world.ask(8, 3, project="big")  # 576 expected, 540 left in the quarter
    assert world.alloc(again).phase is Phase.REQUESTED
    world.svc.publish_gauges()
    tags = ("team:nlp", "project:big", "period:2026-q4")
    assert world.metrics.value("gpufarm.budget.burned", *tags) == 960
    assert world.metrics.value("gpufarm.budget.remaining", *tags) == 540
    text = world.svc.quota("nlp").blocks[0]["text"]["text"]
    assert "`nlp/big` 2026-Q4: 960 / 1,500 (64 %, 540 left)" in text


def test_the_example_farm_documents_the_ledger_and_budgets_it_validates() -> None:
    text = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text()
    assert parse_farm(text).ledger.accrue_hours == 1
    # The commented example budgets, switched on, are a valid configuration.
    start = text.index("# budgets:")
    lines = [line.removeprefix("# ") for line in text[start:].splitlines()[:3]]
    farm = parse_farm(text + "\n".join(lines) + "\n")
    assert [(b.label(), b.period.value, b.gpu_hours) for b in farm.budgets] == [
        ("nlp", "month", 20000),
        ("nlp/llm-ko", "quarter", 30000),
    ]
