"""The true ledger (issue 12 points 2 and 3): used and idle measured from the agents' metrics, unmeasured never
idle, unattributed use, and GPU-hours accrued into the incidents (idempotent, staggered, final at the end)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeQueue, ask_hpc

from gpufarm.core.accounting import gpu_hours
from gpufarm.core.accounting.gpu_hours import UNMEASURED, Usage
from gpufarm.core.commands import executor
from gpufarm.core.config.accounting import LedgerSettings
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.inventory.ledger_gauges import LEDGER_GAUGES
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import ScalarResult
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.service import GpuFarm

USER = "U0000000001"
LEDGER_YAML = FARM_YAML.replace("hpc: {H100: {gpus: 8, hard_limit: 16}}", "hpc: {H100: {gpus: 32, hard_limit: 64}}")
LEDGER_YAML += "rates:\n  currency: USD\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.50}}\n"


@dataclass
class FakeBusy:
    """MetricsQuery answering the busy-GPU query with one row per (gpu_ir, host), or failing."""

    rows: dict[tuple[str, str], float | None] = field(default_factory=dict)
    fail: bool = False
    queries: list[tuple[str, datetime, datetime]] = field(default_factory=list)
    # The idle-held query's rows (gpufarm.ir.gpus_idle_held), and whether that query alone fails.
    held: dict[tuple[str, str], float | None] = field(default_factory=dict)
    held_fails: bool = False

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        self.queries.append((query, start, end))
        is_held = query == gpu_hours.IDLE_HELD_QUERY
        if self.fail or (is_held and self.held_fails):
            raise UpstreamError("query metrics failed: 503")
        rows = self.held if is_held else self.rows
        return [ScalarResult((f"gpu_ir:{ir}", f"host:{host}"), v) for (ir, host), v in rows.items()]


@dataclass
class World:
    svc: GpuFarm
    clock: FakeClock
    incidents: FakeIncidents
    hosts: FakeHosts
    busy: FakeBusy
    metrics: FakeMetrics

    def ask(self, count: int = 8, days: int = 7, team: str = "nlp") -> int:
        return ask_hpc(self.svc, self.incidents, USER, count, days, team=team, project="llm")

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def gauge(self, metric: str, *tags: str) -> float | None:
        return self.metrics.value(metric, *tags)


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock(datetime(2026, 11, 30, 20, 0, tzinfo=UTC))
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for n in range(4):
        hosts.seed(f"hpc-{n}", "H100", 8, "hpc")
    busy = FakeBusy()
    metrics = FakeMetrics()
    chat = FakeChat(operators=frozenset({"U0000000OPS"}))
    farm = parse_farm(LEDGER_YAML)
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=farm, metrics=metrics, usage=busy)
    yield World(svc, clock, incidents, hosts, busy, metrics)


# -- measuring ---------------------------------------------------------------------------------------------------


def test_one_query_groups_busy_devices_by_ir_and_host_and_drops_garbage() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    query = FakeBusy(
        rows={("ir-1", "a"): 3.0, ("none", "b"): 2.0, ("ir-2", "c"): None, ("ir-3", "d"): float("nan")}
        | {("ir-4", "e"): -1.0, ("ir-5", "f"): 5000.0}
    )
    usage = gpu_hours.measure(query, now, LedgerSettings(window_minutes=30))
    [(text, start, end), (held_text, *held_window)] = query.queries
    assert text == "avg:gpufarm.ir.gpus_busy{*} by {gpu_ir,host}"
    assert held_text == "avg:gpufarm.ir.gpus_idle_held{*} by {gpu_ir,host}"
    assert (start, end) == (now - timedelta(minutes=30), now) == tuple(held_window)
    assert usage.measured and dict(usage.busy) == {("ir-1", "a"): 3.0, ("none", "b"): 2.0}
    assert usage.lease_busy(1, "a") == 3.0
    assert usage.lease_busy(1, "b") == 0.0  # the host reported, this lease's devices were not busy
    assert usage.lease_busy(1, "z") is None  # nothing from the host: unmeasured
    assert usage.unattributed() == {"b": 2.0}


def test_a_failing_or_absent_query_is_unmeasured_never_idle() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert gpu_hours.measure(FakeBusy(fail=True), now, LedgerSettings()) == UNMEASURED
    assert gpu_hours.measure(None, now, LedgerSettings()) == UNMEASURED
    assert UNMEASURED.lease_busy(1, "a") is None


def test_the_ledger_splits_held_into_used_idle_and_unmeasured(world: World) -> None:
    first, second = world.ask(16), world.ask(8)
    a, b = world.alloc(first), world.alloc(second)
    a_hosts, [b_host] = sorted(a.hosts), b.hosts
    usage = Usage(True, {(f"ir-{first}", a_hosts[0]): 6.0, ("none", b_host): 2.0}, frozenset({a_hosts[0], b_host}))
    tagged = GpuHost.from_tags(b_host, [*world.hosts.tags[b_host]["datadog"], "team:vision"])
    assert tagged is not None
    acc = gpu_hours.accounts([a, b], usage, [tagged])
    line = acc.lines[("nlp", "llm", "hpc", "H100")]
    # 16 + 8 held: IR-first's first host 6 busy and 2 idle, its second host sent nothing (8 unmeasured);
    # IR-second's host reported only unattributed use, so its 8 are measured idle.
    assert (line.allocated, line.used, line.idle, line.unmeasured) == (24, 6.0, 2.0 + 8.0, 8)
    assert acc.allocated == {("hpc", "H100"): 24}
    assert acc.unattributed == {(b_host, "vision", "hpc"): 2.0}
    failed = gpu_hours.accounts([a, b], UNMEASURED, [])
    assert failed.lines[("nlp", "llm", "hpc", "H100")].idle == 0 and not failed.measured


def test_the_sync_publishes_the_ledger_gauges_with_their_declared_tags(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 5.0, ("none", "hpc-3"): 1.0}
    world.busy.held = {(f"ir-{ir}", host): 2.0}
    world.svc.sync()
    tags = ("team:nlp", "project:llm", "environment:hpc", "gpu_model:h100")
    assert world.gauge("gpufarm.ledger.gpus.allocated", *tags) == 8
    assert world.gauge("gpufarm.ledger.gpus.used", *tags) == 5
    assert world.gauge("gpufarm.ledger.gpus.idle_held", *tags) == 2
    # In money at 2.50 USD a GPU-hour: 5 busy, 1 idle with no process, 2 idle-held; 24 of 32 H100 unallocated.
    cost = {
        kind: world.gauge("gpufarm.ledger.cost.per_hour", *tags, f"kind:{kind}", "currency:usd")
        for kind in ("busy", "idle", "idle_held", "unmeasured")
    }
    assert cost == {"busy": 12.5, "idle": 2.5, "idle_held": 5.0, "unmeasured": 0.0}
    unallocated = world.gauge("gpufarm.ledger.cost.unallocated_per_hour", "environment:hpc", "gpu_model:h100")
    assert unallocated == 24 * 2.5
    # A pool with no rate sends no cost, never 0.
    assert world.gauge("gpufarm.ledger.cost.unallocated_per_hour", "environment:cloud") is None
    assert world.gauge("gpufarm.ledger.gpus.idle", *tags) == 3
    assert world.gauge("gpufarm.ledger.gpus.unmeasured", *tags) == 0
    assert world.gauge("gpufarm.inventory.gpus.allocated", "environment:hpc", "gpu_model:h100") == 8
    assert world.gauge("gpufarm.ledger.gpus.unattributed", "host:hpc-3", "team:none") == 1
    assert world.gauge("gpufarm.ledger.measured") == 1
    declared = {g.name: set(g.tags) for g in LEDGER_GAUGES}
    for series in world.metrics.series:
        if series.metric.startswith(("gpufarm.ledger.", "gpufarm.budget.", "gpufarm.inventory.gpus.allocated")):
            assert {t.split(":", 1)[0] for t in series.tags} == declared[series.metric], series.metric
    world.busy.fail = True
    world.svc.sync()
    assert world.gauge("gpufarm.ledger.gpus.unmeasured", *tags) == 8
    assert world.gauge("gpufarm.ledger.gpus.idle", *tags) == 0
    assert world.gauge("gpufarm.ledger.measured") == 0


def test_gpu_quota_shows_the_ledger(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 2.0}
    text = world.svc.quota("nlp").blocks[0]["text"]["text"]
    assert "`nlp/llm` H100 in `hpc`: 8 held: 2 used / 6 idle / 0 unmeasured · 20.00 USD/h, idle 15.00 USD/h" in text
    world.busy.fail = True
    assert "could not be measured" in world.svc.quota().blocks[0]["text"]["text"]


# -- accruing ---------------------------------------------------------------------------------------------------


def test_accrual_arithmetic_splits_busy_idle_unmeasured_and_months() -> None:
    start = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    alloc = Allocation(
        incident_id="x",
        ir=7,
        title="t",
        state=State.ACTIVE,
        phase=Phase.ALLOCATED,
        hosts=("a", "b"),
        host_gpus={"a": 8, "b": 4},
        allocated_at=start,
    )
    hours = gpu_hours.accrue(alloc, start + timedelta(hours=2), {"a": 6.0, "b": None})
    assert hours is not None
    assert (hours.held, hours.busy, hours.idle, hours.unmeasured) == (24.0, 12.0, 4.0, 8.0)
    assert dict(hours.by_month) == {"2026-11": 12.0, "2026-12": 12.0}
    assert hours.held == hours.busy + hours.idle + hours.unmeasured and hours.idle_held == 0
    split = gpu_hours.accrue(alloc, start + timedelta(hours=2), {"a": 6.0, "b": None}, {"a": 1.5, "b": 4.0})
    assert split is not None and (split.idle, split.idle_held) == (4.0, 3.0)  # b unmeasured: nothing idle there
    # Busy is capped at what the host holds; accruing to where it already is adds nothing.
    capped = gpu_hours.accrue(alloc, start + timedelta(hours=1), {"a": 99.0, "b": 0.0})
    assert capped is not None and (capped.busy, capped.idle) == (8.0, 4.0)
    written = alloc.model_copy(update={"hours_until": start + timedelta(hours=2), "hours_held": 24.0})
    assert gpu_hours.accrue(written, start + timedelta(hours=2), {}) is None
    fields = gpu_hours.hours_fields(hours, start + timedelta(hours=2))
    assert fields[f.GPU_HOURS_HELD] == "24.000" and fields[f.GPU_HOURS_UNTIL] == "2026-12-01T01:00:00Z"
    assert fields[f.GPU_HOURS_BY_MONTH] == ["2026-11=12.000", "2026-12=12.000"]


def test_the_sync_accrues_a_lease_once_per_accrue_hours_and_a_no_change_sync_writes_nothing(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 2.0}
    world.clock.advance(minutes=30)
    assert world.svc.sync().accrued == []
    world.clock.advance(minutes=30)
    assert world.svc.sync().accrued == [ir]
    alloc = world.alloc(ir)
    assert (alloc.hours_held, alloc.hours_busy, alloc.hours_idle, alloc.hours_unmeasured) == (8.0, 2.0, 6.0, 0.0)
    assert alloc.hours_until == world.clock.now()
    before = world.incidents.by_ir(ir)
    world.clock.advance(minutes=5)
    assert world.svc.sync().accrued == []
    assert world.incidents.by_ir(ir) == before
    # The metrics go away: the next hour is unmeasured, never idle.
    world.busy.fail = True
    world.clock.advance(minutes=55)
    assert world.svc.sync().accrued == [ir]
    alloc = world.alloc(ir)
    assert (alloc.hours_held, alloc.hours_idle, alloc.hours_unmeasured) == (16.0, 6.0, 8.0)


def test_the_sync_accrues_idle_held_hours_among_the_idle_and_a_failed_read_leaves_them_unsplit(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 2.0}
    # 3 of the 6 idle devices hold memory with no work; a reading of more than the idle ones is capped there.
    world.busy.held = {(f"ir-{ir}", host): 3.0, (f"ir-{ir}", "elsewhere"): 8.0}
    world.clock.advance(hours=1)
    assert world.svc.sync().accrued == [ir]
    alloc = world.alloc(ir)
    assert (alloc.hours_busy, alloc.hours_idle, alloc.hours_idle_held) == (2.0, 6.0, 3.0)
    assert world.incidents.by_ir(ir).fields[f.GPU_HOURS_IDLE_HELD] == "3.000"
    world.busy.held = {(f"ir-{ir}", host): 99.0}
    world.clock.advance(hours=1)
    world.svc.sync()
    assert world.alloc(ir).hours_idle_held == 9.0  # at most the 6 idle devices
    world.busy.held_fails = True
    world.clock.advance(hours=1)
    world.svc.sync()
    alloc = world.alloc(ir)
    assert (alloc.hours_busy, alloc.hours_idle, alloc.hours_idle_held) == (6.0, 18.0, 9.0)


def test_an_accrue_command_carries_idle_held_and_one_queued_without_it_splits_nothing(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 4.0}
    world.busy.held = {(f"ir-{ir}", host): 1.0}
    world.clock.advance(hours=2)
    queue = FakeQueue()
    world.svc.context.queue = queue
    world.svc.sync()
    [body] = [b for _, b in queue.sent if "command" in b]
    command = IncidentCommand.model_validate(body["command"])
    assert command.accrue is not None and command.accrue.idle_held == (f"{host}=1.000",)
    older = command.model_copy(update={"accrue": command.accrue.model_copy(update={"idle_held": ()})})
    assert gpu_hours.scope_idle_held(older.accrue) == {}  # type: ignore[arg-type]
    world.svc.context.queue = None
    executor.execute(world.svc.context, command)
    assert (world.alloc(ir).hours_idle, world.alloc(ir).hours_idle_held) == (8.0, 2.0)


def test_accrual_is_staggered_and_bounded_per_sync(world: World) -> None:
    irs = []
    for _ in range(4):
        irs.append(world.ask(8))
        world.clock.advance(minutes=15)
    settings = LedgerSettings(accrue_hours=1, max_accruals=2)
    live = [world.alloc(ir) for ir in irs]
    now = world.clock.now()  # one hour after the first allocation
    assert [a.ir for a in gpu_hours.due_leases(live, now, settings)] == irs[:1]
    later = now + timedelta(minutes=45)
    assert [a.ir for a in gpu_hours.due_leases(live, later, settings)] == irs[:2]  # capped, oldest first


def test_an_accrue_command_runs_in_the_pool_group_and_a_redelivery_is_not_applied_twice(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 8.0}
    world.clock.advance(hours=2)
    queue = FakeQueue()
    world.svc.context.queue = queue
    report = world.svc.sync()
    assert report.accrued == [ir]
    [(group, body)] = [(g, b) for g, b in queue.sent if "command" in b]
    command = IncidentCommand.model_validate(body["command"])
    assert (group, command.op, command.ir) == ("hpc", Op.ACCRUE, ir)
    assert world.alloc(ir).hours_held == 0  # the consumer writes it
    world.svc.context.queue = None
    assert executor.execute(world.svc.context, command).startswith("accrued to 16.0")
    assert world.alloc(ir).hours_busy == 16.0
    assert executor.execute(world.svc.context, command).startswith("already applied")
    assert world.alloc(ir).hours_held == 16.0


def test_release_writes_the_final_hours_with_its_end(world: World) -> None:
    ir = world.ask(8)
    [host] = world.alloc(ir).hosts
    world.busy.rows = {(f"ir-{ir}", host): 8.0}
    world.clock.advance(hours=1)
    world.svc.sync()
    world.clock.advance(minutes=30)
    world.svc.release(ir, USER)
    alloc = world.alloc(ir)
    assert alloc.phase is Phase.RECLAIMING
    # The last half hour had no measurement: held and unmeasured, not idle.
    assert (alloc.hours_held, alloc.hours_busy, alloc.hours_idle, alloc.hours_unmeasured) == (12.0, 8.0, 0.0, 4.0)
    assert alloc.hours_until == world.clock.now()


def test_ledger_settings_are_validated() -> None:
    with pytest.raises(FarmConfigError, match="accrue_hours"):
        parse_farm(FARM_YAML + "ledger: {accrue_hours: 0}\n")
    with pytest.raises(FarmConfigError, match="window_minutes"):
        parse_farm(FARM_YAML + "ledger: {window_minutes: 100000}\n")
    assert parse_farm(FARM_YAML + "ledger: {accrue_hours: 6, max_accruals: 50}\n").ledger.accrue_hours == 6


def test_the_field_schema_carries_the_gpu_hours() -> None:
    names = {spec.name for spec in f.SCHEMA}
    assert {f.GPU_HOURS_HELD, f.GPU_HOURS_BUSY, f.GPU_HOURS_IDLE, f.GPU_HOURS_UNMEASURED} <= names
    assert f.BY_NAME[f.GPU_HOURS_BY_MONTH].kind is f.FieldKind.TEXTARRAY
