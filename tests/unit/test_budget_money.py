"""Budgets in money beside GPU-hours (issue 25 point 3): validated at load, burned at the rate card's prices,
incomplete (never under budget) where a pool has no rate; each threshold told once per period, recorded in the
budget period's own incident; the forecast's date; `/gpu budget`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeQueue, ask_hpc

from gpufarm.core.accounting import budget_alerts, forecast
from gpufarm.core.accounting.burn import Burn, burn
from gpufarm.core.accounting.spend import spend
from gpufarm.core.chat.command_text import Verb, parse_command
from gpufarm.core.config.accounting import Budget, BudgetPeriod
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.money.card import RateCard
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import incident_webhook, runtime

USER, OPS = "U0000000001", "U0000000OPS"
TEAM_CHANNEL, OPS_CHANNEL = "C0000000NLP", "C0000000001"
RATES = "rates:\n  currency: EUR\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.50}}\n"
MONEY_YAML = (
    FARM_YAML.replace("hpc: {H100: {gpus: 8, hard_limit: 16}}", "hpc: {H100: {gpus: 32, hard_limit: 64}}")
    .replace("  nlp:\n    max_days: 30\n", f"  nlp:\n    max_days: 30\n    channel: {TEAM_CHANNEL}\n")
    .replace("defaults:", "budgets:\n  - {team: nlp, period: month, amount: 2000}\ndefaults:")
    + RATES
)


def _dec(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 12, day, hour, tzinfo=UTC)


# -- the farm file ---------------------------------------------------------------------------------------------------


def test_a_budget_gives_hours_or_money_exactly_once_and_its_alerts_are_checked() -> None:
    farm = parse_farm(MONEY_YAML)
    (budget,) = farm.budgets
    assert budget.in_money and budget.amount == Decimal(2000) and budget.gpu_hours is None
    assert budget.alerts == (50, 80, 100)
    for bad, reason in (
        ("{team: nlp, gpu_hours: 10, amount: 10}", "exactly one"),
        ("{team: nlp}", "exactly one"),
        ("{team: nlp, amount: -5}", "greater than 0"),
        ("{team: nlp, amount: 1.005}", "decimal places"),
        ("{team: nlp, gpu_hours: 10, alerts: [80, 80]}", "twice"),
        ("{team: nlp, gpu_hours: 10, alerts: [0]}", "greater than or equal to 1"),
        ("{team: nlp, amount: 100}", "needs a rates: section"),
    ):
        with pytest.raises(FarmConfigError, match=reason):
            parse_farm(FARM_YAML + f"budgets: [{bad}]\n")
    assert parse_farm(FARM_YAML + "budgets: [{team: nlp, gpu_hours: 10, alerts: [90, 25]}]\n").budgets[0].alerts == (
        25,
        90,
    )


# -- money burn ------------------------------------------------------------------------------------------------------


def _facts(ir: int, env: str, model: str, hours: float, *, team: str = "nlp") -> LeaseFacts:
    return LeaseFacts(
        ir=ir,
        state=State.RESOLVED,
        phase=Phase.RECLAIMED,
        team=team,
        project="p",
        environment=env,
        gpu_model=model,
        gpu_count=8,
        hosts=("a",),
        host_gpus={"a": 8},
        allocated_at=_dec(1),
        hours_held=hours,
        hours_busy=hours,
        hours_until=_dec(2),
        hours_by_month=(f"2026-12={hours}",),
    )


def test_money_burn_is_the_period_cost_and_an_unpriced_pool_makes_it_incomplete() -> None:
    farm = parse_farm(MONEY_YAML)
    card = RateCard(farm.rates)
    budget = farm.budgets[0]
    priced = [_facts(1, "hpc", "H100", 192), _facts(2, "hpc", "H100", 100, team="vision")]
    burned = spend(card, budget, priced, _dec(10))
    assert burned.spent == Decimal("480.0") and burned.burned == 192 and not burned.incomplete
    assert burned.currency == "EUR" and burned.percent == pytest.approx(24.0)
    # A lease on a pool with no rate: what is priced still counts, and the budget is incomplete, never "under".
    burned = spend(card, budget, [*priced, _facts(3, "cloud", "A100", 50)], _dec(10))
    assert burned.incomplete and burned.unpriced == ("cloud",) and burned.spent == Decimal("480.0")
    # A budget in GPU-hours never is.
    hours = Budget(team="nlp", gpu_hours=1000)
    assert not burn(hours, [_facts(3, "cloud", "A100", 50)], _dec(10)).incomplete


# -- the sync's alerts, told once per period -------------------------------------------------------------------------


@dataclass
class World:
    svc: GpuFarm
    clock: FakeClock
    incidents: FakeIncidents
    chat: FakeChat
    metrics: FakeMetrics

    def posts(self, channel: str) -> list[str]:
        return [m.text for m in self.chat.sent if m.kind == "post" and m.target == channel and "budget" in m.text]

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))


def _world(yaml: str) -> World:
    clock = FakeClock(_dec(1))
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for n in range(6):
        hosts.seed(f"hpc-{n}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    metrics = FakeMetrics()
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(yaml), metrics=metrics)
    return World(svc, clock, incidents, chat, metrics)


@pytest.fixture
def world() -> Iterator[World]:
    yield _world(MONEY_YAML)


def test_each_threshold_is_told_once_per_period_across_syncs(world: World) -> None:
    first = ask_hpc(world.svc, world.incidents, USER, 8, 4)  # 8 x 4 x 24 x EUR 2.50 = EUR 1,920 of 2,000: fits
    assert world.alloc(first).phase is Phase.ALLOCATED
    world.clock.advance(days=1)
    world.svc.sync()
    assert world.posts(TEAM_CHANNEL) == []  # EUR 480: under 50 %
    world.clock.advance(days=2, hours=12)  # EUR 1,680: 84 %, past 50 and 80 at once
    report = world.svc.sync()
    assert report.budget_alerts == ["nlp 2026-12 80 %"]
    (told,) = world.posts(TEAM_CHANNEL)
    assert "nlp's budget for 2026-12 passed 80 %" in told and "EUR 1,680.00 / EUR 2,000.00 (84 %" in told
    assert "nlp's December budget runs out on Dec 5 at this rate" in told
    assert len(world.posts(OPS_CHANNEL)) == 1
    blocks = str(next(m.blocks for m in world.chat.sent if m.target == TEAM_CHANNEL))
    assert f"IR-{first} 8x H100 (hpc): 672 GPU-hours, EUR 1,680.00" in blocks
    # The thresholds told live in the period's own incident, created ended: never a lease.
    (record,) = world.incidents.search(IncidentQuery.where({State.RESOLVED}, gpufarm_kind=f.BUDGET_PERIOD))
    assert sorted(budget_alerts.told(record)) == [50, 80]
    assert record.fields[f.REQUEST_ID] == "budget:nlp:-:2026-12"
    assert Allocation.from_record(record).is_budget_period
    assert world.svc.process(record.id)[0].action == "nothing to do (budget period)"
    # Later syncs (new invocations, nothing kept between them but the incidents) tell nothing more.
    world.clock.advance(minutes=5)
    assert world.svc.sync().budget_alerts == []
    world.clock.advance(hours=6)
    world.svc.sync()
    assert len(world.posts(TEAM_CHANNEL)) == 1 and len(world.posts(OPS_CHANNEL)) == 1
    # A second lease takes it past 100 %: told once too.
    ask_hpc(world.svc, world.incidents, USER, 8, 1)
    world.clock.advance(hours=12)
    world.svc.sync()
    world.svc.sync()
    texts = world.posts(TEAM_CHANNEL)
    assert len(texts) == 2 and "passed 100 %" in texts[1] and "has run out" in texts[1]
    # A new month is a new period: its thresholds are told again, on its own incident.
    world.clock.current = datetime(2027, 1, 1, 0, 5, tzinfo=UTC)
    assert world.svc.sync().budget_alerts == []
    periods = world.incidents.search(IncidentQuery.where({State.RESOLVED}, gpufarm_kind=f.BUDGET_PERIOD))
    assert len(list(periods)) == 1


def test_a_redelivered_alert_finds_its_threshold_recorded_and_tells_nothing(world: World) -> None:
    ask_hpc(world.svc, world.incidents, USER, 8, 4)
    world.clock.advance(days=3, hours=12)
    ctx = world.svc.context
    assert budget_alerts.tell(ctx, "nlp", None, BudgetPeriod.MONTH) == "nlp 2026-12: told 80 %"
    assert budget_alerts.tell(ctx, "nlp", None, BudgetPeriod.MONTH) == "nlp 2026-12: nothing new to tell"
    assert len(world.posts(TEAM_CHANNEL)) == 1


def test_without_a_channel_the_team_members_named_are_told_by_dm() -> None:
    yaml = MONEY_YAML.replace(
        f"    channel: {TEAM_CHANNEL}\n", "    members: {users: [U0000000001, U0000000002]}\n"
    ).replace("  vision:\n", "  vision:\n    members: {users: [U0000000009]}\n")
    world = _world(yaml)
    ask_hpc(world.svc, world.incidents, USER, 8, 4)
    world.clock.advance(days=3)
    world.svc.sync()
    dms = [m for m in world.chat.sent if m.kind == "dm" and "passed 50 %" in m.text]
    assert sorted(m.target for m in dms) == ["U0000000001", "U0000000002"]


def test_an_incomplete_money_budget_sends_requests_to_operators_and_says_so() -> None:
    # The farm prices only the cloud pool: the team's hpc leases are unpriced.
    yaml = MONEY_YAML.replace("    hpc: {per_gpu_hour: {H100: 2.50}}\n", "    cloud: {per_gpu_hour: {A100: 1.00}}\n")
    world = _world(yaml)
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 1)
    alloc = world.alloc(ir)
    assert alloc.phase is Phase.REQUESTED  # within quota, but the budget cannot price it: an operator decides
    card = next(str(m.blocks) for m in world.chat.sent if m.kind == "post" and f"IR-{ir}" in m.text)
    assert "in money and no rate prices this request" in card
    world.svc.approve(ir, OPS)
    world.svc.process(world.incidents.by_ir(ir).id)
    world.clock.advance(days=1)
    answer = world.svc.budget(USER, "nlp").text
    assert "EUR 0.00 priced / EUR 2,000.00, incomplete: no rate prices hpc" in answer
    assert "is incomplete (no rate prices hpc): no forecast" in answer
    world.svc.publish_gauges()
    tags = ("team:nlp", "project:all", "period:2026-12")
    assert world.metrics.value("gpufarm.budget.incomplete", *tags) == 1


# -- the forecast ----------------------------------------------------------------------------------------------------


def _holding(ir: int, gpus: int, since: datetime, until: datetime, now: datetime) -> Allocation:
    held = gpus * (now - since).total_seconds() / 3600
    return Allocation(
        incident_id=f"id-{ir}",
        ir=ir,
        title="t",
        state=State.ACTIVE,
        phase=Phase.ALLOCATED,
        team="nlp",
        project="p",
        environment="hpc",
        gpu_model="H100",
        gpu_count=gpus,
        hosts=("a",),
        host_gpus={"a": gpus},
        allocated_at=since,
        expires_at=until,
        hours_held=held,
        hours_busy=held,
        hours_until=now,
        hours_by_month=(f"2026-12={held}",),
    )


def _reservation(ir: int, gpus: int, start: datetime, end: datetime) -> Allocation:
    return Allocation(
        incident_id=f"id-{ir}",
        ir=ir,
        title="t",
        state=State.ACTIVE,
        phase=Phase.RESERVED,
        team="nlp",
        project="p",
        environment="hpc",
        gpu_model="H100",
        gpu_count=gpus,
        reserved_from=start,
        reserved_until=end,
    )


@pytest.mark.parametrize(
    ("limit", "reserved", "sentence"),
    [
        # 1,344 used at 8 GPU-hours an hour: 656 left last 82 hours.
        (2000, False, "nlp's December budget runs out on Dec 13 at this rate"),
        # 1,344 + 8 x 528 hours to the month's end = 5,568 of 10,000.
        (10000, False, "nlp's December budget lasts the period at this rate (56 % expected by Dec 31)"),
        # The trend alone runs out on Dec 29; a reservation of 32 GPUs from Dec 15 to 18 brings it to Dec 17.
        (5000, False, "nlp's December budget runs out on Dec 29 at this rate"),
        (5000, True, "nlp's December budget runs out on Dec 17 at this rate"),
        # Already spent.
        (1000, False, "nlp's December budget has run out (134 % used)"),
    ],
)
def test_the_forecast_date_from_the_trend_and_the_commitments(limit: int, reserved: bool, sentence: str) -> None:
    now = _dec(10)
    leases = [_holding(1, 8, _dec(3), _dec(31), now)]
    if reserved:
        leases.append(_reservation(2, 32, _dec(15), _dec(18)))
    budget = Budget(team="nlp", gpu_hours=limit)
    burned = burn(budget, leases, now)
    assert burned.burned == pytest.approx(1344)
    outlook = forecast.forecast(None, burned, leases, now)
    assert outlook.per_day == pytest.approx(192)
    assert outlook.sentence() == sentence


def test_the_forecast_in_money_prices_the_commitments() -> None:
    now = _dec(10)
    card = RateCard(parse_farm(MONEY_YAML).rates)
    lease = _holding(1, 8, _dec(3), _dec(12), now)
    budget = Budget(team="nlp", amount=Decimal(5000))
    burned = Burn(budget, "2026-12", 1344, Decimal(3360), (), "EUR")
    outlook = forecast.forecast(card, burned, [lease], now)
    (held,) = outlook.commitments
    assert held.hours_to_end(now) == 384 and held.cost_to_end(now) == Decimal("960.0")
    assert outlook.per_day == pytest.approx(480)
    # EUR 1,640 left at EUR 20 an hour: 82 hours.
    assert outlook.runs_out == now + timedelta(hours=82)


# -- /gpu budget -----------------------------------------------------------------------------------------------------


def test_the_budget_command_parses_one_team_at_most() -> None:
    assert parse_command("budget").verb is Verb.BUDGET and parse_command("budget").team is None
    assert parse_command("budget NLP").team == "nlp"
    with pytest.raises(ValidationFailed, match=r"/gpu budget \[team\]"):
        parse_command("budget nlp vision")


def test_the_budget_answer_shows_burn_forecast_and_each_live_lease_to_its_end(world: World) -> None:
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 4)
    world.clock.advance(days=1)
    text = world.svc.budget(USER).text
    assert "`nlp` 2026-12*: EUR 480.00 / EUR 2,000.00 (24 %, EUR 1,520.00 left; 192 GPU-hours)" in text
    assert "nlp's December budget runs out on Dec 5 at this rate" in text
    assert "the last 7 days burned EUR 480.00 a day" in text
    assert f"IR-{ir} 8x H100 (hpc) until Dec 5: 576 GPU-hours, EUR 1,440.00" in text
    with pytest.raises(ValidationFailed, match="unknown team"):
        world.svc.budget(USER, "nobody")
    assert "no budget" in world.svc.budget(USER, "vision").text


# -- through the queue: the sync sends, the team's budget group tells ------------------------------------------------


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[World, FakeQueue]]:
    for name in ("GPUFARM_ALLOCATION_QUEUE_URL", "GPUFARM_LOCAL_INVOKE_URL", "GPUFARM_OPERATORS_USERGROUP"):
        monkeypatch.delenv(name, raising=False)
    world = _world(MONEY_YAML)
    queue = FakeQueue()
    runtime.reset()
    runtime.override(
        clock=world.clock,
        incidents=world.incidents,
        hosts=FakeHosts(),
        metrics=world.metrics,
        chat=world.chat,
        farm=world.svc.context.farm,
        queue=queue,
    )
    yield world, queue
    runtime.reset()


def test_the_sync_queues_the_alert_in_the_team_budget_group_and_its_consumer_tells_once(
    queued: tuple[World, FakeQueue],
) -> None:
    world, queue = queued
    ask_hpc(world.svc, world.incidents, USER, 8, 4)
    world.clock.advance(days=3, hours=12)
    svc = runtime.current().service()
    svc.sync()
    svc.sync()  # the same crossing again: the dedup id (budget, period, threshold) collapses it
    budgets_sent = [(g, m) for g, m in queue.sent if "budget" in m]
    assert budgets_sent == [
        (
            "budget-nlp",
            {"budget": {"team": "nlp", "project": None, "period": "month"}, "reason": budgets_sent[0][1]["reason"]},
        )
    ]
    body = json.dumps(budgets_sent[0][1])
    assert incident_webhook.process_message(runtime.current(), body) == ["nlp 2026-12: told 80 %"]
    assert incident_webhook.process_message(runtime.current(), body) == ["nlp 2026-12: nothing new to tell"]
    assert len(world.posts(TEAM_CHANNEL)) == 1
    bad = json.dumps({"budget": {"team": "nlp", "period": "week"}})
    assert incident_webhook.process_message(runtime.current(), bad) == ["dropped: malformed"]
