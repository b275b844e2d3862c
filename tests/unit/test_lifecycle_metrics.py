"""Lifecycle metrics (gpufarm.core.leases.metrics): the sync's waiting and idle-warned gauges from its one read of
the live incidents, reclaims by reason and idle warnings counted once each after their write, a failed submit that
fails nothing, every series as spec/metrics.yaml `lifecycle_metrics` declares it, and the dashboards' panels over
them as the sandbox renders them."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import spec_check
import yaml
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, ask_hpc
from werkzeug.test import Client

from gpufarm.core.commands import executor
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import MetricSeries
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand, Op
from gpufarm.core.leases import metrics as lifecycle_metrics
from gpufarm.core.outlook import gauges as outlook_gauges
from gpufarm.core.service import GpuFarm
from gpufarm.setup.dashboards import desired_dashboards, desired_metadata
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "spec" / "metrics.yaml").read_text())
DECLARED: dict[str, Any] = SPEC["lifecycle_metrics"]
USER = "U0000000001"
OPS = "U0000000OPS"
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}


def _problems(s: MetricSeries) -> list[str]:
    return spec_check.problems(s, "lifecycle_metrics")


def _lease(
    ir: int, phase: Phase, *, team: str = "nlp", env: str = "hpc", model: str = "H100", **extra: Any
) -> Allocation:
    state = State.ACTIVE if phase in (Phase.REQUESTED, Phase.APPROVED, Phase.WAITING) else State.STABLE
    return Allocation(
        incident_id=f"id-{ir}",
        ir=ir,
        title=f"lease {ir}",
        state=state,
        phase=phase,
        team=team,
        project="llm",
        gpu_model=model,
        gpu_count=8,
        environment=env,
        **extra,
    )


def _value(series: Sequence[MetricSeries], metric: str, *tags: str) -> float:
    [found] = [s for s in series if s.metric == metric and set(tags) <= set(s.tags)]
    return found.points[0].value


# -- gauges (pure) -------------------------------------------------------------------------------------------------


def test_gauges_count_waiting_requests_their_longest_wait_and_the_leases_warned_idle() -> None:
    farm = parse_farm(FARM_YAML)
    asked = history.entry(NOW - timedelta(hours=2), USER, history.Step.REQUESTED, "8x H100").line()
    live = [
        _lease(1, Phase.REQUESTED, history=(asked,)),
        _lease(
            2,
            Phase.REQUESTED,
            history=(history.entry(NOW - timedelta(minutes=5), USER, history.Step.REQUESTED).line(),),
        ),
        _lease(3, Phase.WAITING, waiting_since=NOW - timedelta(minutes=30), history=(asked,)),
        _lease(4, Phase.APPROVED, team="vision", waiting_since=NOW - timedelta(minutes=1)),
        _lease(5, Phase.ALLOCATED, hosts=("hpc-1",), host_gpus={"hpc-1": 8}),
        _lease(6, Phase.IDLE_WARNED, hosts=("hpc-2",), host_gpus={"hpc-2": 8}, idle_warned_at=NOW),
    ]
    series = lifecycle_metrics.gauges(live, farm, NOW)
    assert all(not _problems(s) for s in series), [p for s in series for p in _problems(s)]
    hpc = ("environment:hpc", "gpu_model:h100")
    waiting, oldest = lifecycle_metrics.REQUESTS_WAITING, lifecycle_metrics.OLDEST_WAIT
    assert _value(series, waiting, *hpc, "team:nlp", "waiting_for:approval") == 2
    assert _value(series, oldest, *hpc, "team:nlp", "waiting_for:approval") == 7200
    # A wait for hosts counts from when it began waiting for them, not from the request.
    assert _value(series, waiting, *hpc, "team:nlp", "waiting_for:hosts") == 1
    assert _value(series, oldest, *hpc, "team:nlp", "waiting_for:hosts") == 1800
    assert _value(series, waiting, *hpc, "team:vision", "waiting_for:hosts") == 1
    assert _value(series, oldest, *hpc, "team:vision", "waiting_for:hosts") == 60
    # Zeros for every team, pool and model the farm has, so an emptied queue reads 0, not its last count.
    slices = ("environment:slices", "gpu_model:l4", "team:vision", "waiting_for:approval")
    assert _value(series, waiting, *slices) == 0 and _value(series, oldest, *slices) == 0
    keys = {(s.metric, s.tags) for s in series if s.metric in (waiting, oldest)}
    models = sum(len(e.gpu_models) for e in farm.environments.values())
    assert len(keys) == 2 * len(farm.teams) * models * 2
    # One 0/1 series per lease holding hosts, tagged with the lease (ir and the dashboards' gpu_ir).
    warned = [s for s in series if s.metric == lifecycle_metrics.LEASES_IDLE_WARNED]
    assert {s.tags: s.points[0].value for s in warned} == {
        ("environment:hpc", "gpu_model:h100", "team:nlp", "project:llm", "ir:ir-5", "gpu_ir:ir-5"): 0.0,
        ("environment:hpc", "gpu_model:h100", "team:nlp", "project:llm", "ir:ir-6", "gpu_ir:ir-6"): 1.0,
    }


def test_the_sync_publishes_them_from_its_one_read_of_the_live_incidents() -> None:
    world = _world()
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    ask_hpc(world.svc, world.incidents, USER, 8, 3)  # beyond quota: the operators decide
    before = len(world.incidents.searches)
    assert world.svc.publish_gauges() > 0
    live_reads = world.incidents.searches[before:]
    assert len(live_reads) == 1, world.incidents.searches[before:]
    series = world.metrics.series
    assert (
        _value(series, lifecycle_metrics.REQUESTS_WAITING, "environment:hpc", "team:nlp", "waiting_for:approval") == 1
    )
    assert _value(series, lifecycle_metrics.LEASES_IDLE_WARNED, f"ir:ir-{ir}") == 0


# -- counts, once each -----------------------------------------------------------------------------------------------


class FailingMetrics(FakeMetrics):
    """A sink whose every submit fails after its retries."""

    def submit(self, series: Sequence[MetricSeries]) -> None:
        raise UpstreamError("Datadog submit metrics failed: HTTP 503")


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    hosts: FakeHosts
    clock: FakeClock
    metrics: FakeMetrics

    def counted(self, metric: str) -> list[MetricSeries]:
        return [s for s in self.metrics.series if s.metric == metric]

    def process_resolved(self) -> None:
        for record in self.incidents.search(IncidentQuery.where({State.RESOLVED})):
            self.svc.process(record.id)


def _world(metrics: FakeMetrics | None = None) -> World:
    clock = FakeClock(NOW)
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for name in ("hpc-1", "hpc-2", "hpc-3"):
        hosts.seed(name, "H100", 8, "hpc", "a")
    sink = metrics or FakeMetrics()
    chat = FakeChat(operators=frozenset({OPS}))
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FARM_YAML), metrics=sink)
    return World(svc, incidents, hosts, clock, sink)


@pytest.fixture
def world() -> Iterator[World]:
    yield _world()


def _command(op: Op, ir: int, actor: str | None = None, **extra: Any) -> IncidentCommand:
    return IncidentCommand.model_validate({"op": op, "ir": ir, "actor": actor, **extra})


def test_a_reclaim_is_counted_once_with_its_reason_and_gpus_whatever_is_redelivered(world: World) -> None:
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    reclaim = _command(Op.FORCE_RECLAIM, ir, OPS, reason="maintenance")
    executor.execute(world.svc.context, reclaim)
    assert world.counted(lifecycle_metrics.RECLAIMS) == []  # decided; counted when the hosts are freed
    world.process_resolved()
    world.process_resolved()  # the incident webhook's message redelivered
    executor.execute(world.svc.context, reclaim)  # the command redelivered: answered from its ledger
    world.process_resolved()
    [count] = world.counted(lifecycle_metrics.RECLAIMS)
    [gpus] = world.counted(lifecycle_metrics.RECLAIMED_GPUS)
    assert count.type == 1 and count.points[0].value == 1 and gpus.points[0].value == 8
    assert set(count.tags) == {
        "reclaim_reason:operator",
        "environment:hpc",
        "gpu_model:h100",
        "team:nlp",
        "project:p",
        f"ir:ir-{ir}",
        f"gpu_ir:ir-{ir}",
    }
    assert not _problems(count) and not _problems(gpus)


def test_a_lease_resolved_in_datadog_and_a_cancelled_request_are_counted_with_their_reasons(world: World) -> None:
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    world.incidents.update(world.incidents.by_ir(ir).id, {f.STATE: State.RESOLVED.value})
    asked = ask_hpc(world.svc, world.incidents, USER, 16, 3)  # beyond quota: waits for an operator
    world.svc.release(asked, USER)
    world.process_resolved()
    world.process_resolved()
    reasons = {
        next(t for t in s.tags if t.startswith("reclaim_reason:")): s.points[0].value
        for s in world.counted(lifecycle_metrics.RECLAIMED_GPUS)
    }
    assert reasons == {"reclaim_reason:resolved-in-datadog": 8, "reclaim_reason:cancelled": 0}


def test_an_idle_warning_is_counted_once_and_a_repeated_alert_counts_nothing(world: World) -> None:
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    [host] = Allocation.from_record(world.incidents.by_ir(ir)).hosts
    idle = _command(Op.IDLE, ir, idle=IdleScope(hosts=(host,), kind="idle", value=0.0).model_dump())
    assert executor.execute(world.svc.context, idle).startswith("warned")
    assert executor.execute(world.svc.context, idle).startswith("already applied")  # redelivered
    again = _command(Op.IDLE, ir, origin="next-alert", idle=IdleScope(hosts=(host,), kind="idle").model_dump())
    executor.execute(world.svc.context, again)  # the monitor alerts again: already warned
    [warned] = world.counted(lifecycle_metrics.IDLE_WARNINGS)
    assert warned.type == 1 and warned.points[0].value == 1 and f"ir:ir-{ir}" in warned.tags
    assert not _problems(warned)
    # Past the grace the idle lease is reclaimed, counted as idle.
    world.clock.advance(minutes=61)
    executor.execute(world.svc.context, _command(Op.IDLE, ir, origin="after-grace", idle={"hosts": [host]}))
    world.process_resolved()
    [count] = world.counted(lifecycle_metrics.RECLAIMS)
    assert "reclaim_reason:idle" in count.tags


def test_the_idle_host_of_a_busy_lease_given_back_counts_as_a_partial_idle_reclaim(world: World) -> None:
    ir = ask_hpc(world.svc, world.incidents, USER, 16, 3)  # beyond quota: approved by an operator
    world.svc.approve(ir, OPS)
    world.svc.process(world.incidents.by_ir(ir).id)
    idle_host, _ = sorted(Allocation.from_record(world.incidents.by_ir(ir)).hosts)
    world.svc.idle_triggered(ir, IdleScope(hosts=(idle_host,), kind="idle"))
    world.clock.advance(minutes=61)
    assert world.svc.idle_triggered(ir, IdleScope(hosts=(idle_host,), kind="idle")).action.startswith("returned")
    [count] = world.counted(lifecycle_metrics.RECLAIMS)
    [gpus] = world.counted(lifecycle_metrics.RECLAIMED_GPUS)
    assert "reclaim_reason:partial-idle" in count.tags and gpus.points[0].value == 8
    assert len(world.counted(lifecycle_metrics.IDLE_WARNINGS)) == 1


def test_a_failed_submit_is_logged_and_fails_neither_the_reclaim_nor_the_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = _world(FailingMetrics())
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    [host] = Allocation.from_record(world.incidents.by_ir(ir)).hosts
    with caplog.at_level(logging.WARNING, logger="gpufarm.core.leases.metrics"):
        assert world.svc.idle_triggered(ir, IdleScope(hosts=(host,), kind="idle")).action.startswith("warned")
        world.svc.force_reclaim(ir, OPS)
        [outcome] = [
            o for r in world.incidents.search(IncidentQuery.where({State.RESOLVED})) for o in world.svc.process(r.id)
        ][:1]
    assert outcome.action == "reclaimed"
    alloc = Allocation.from_record(world.incidents.by_ir(ir))
    assert alloc.phase is Phase.RECLAIMED and alloc.hosts == ()
    assert any("could not count the idle warning of" in r.message for r in caplog.records)
    assert any("could not count the reclaim (operator) of" in r.message for r in caplog.records)


def test_without_a_metrics_sink_nothing_is_counted_and_nothing_fails() -> None:
    world = _world()
    world.svc.context.metrics = None
    ir = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    world.svc.force_reclaim(ir, OPS)
    world.process_resolved()
    assert Allocation.from_record(world.incidents.by_ir(ir)).phase is Phase.RECLAIMED


# -- the dashboards' panels on the sandbox -----------------------------------------------------------------------------


def _wire(series: Sequence[MetricSeries]) -> list[dict[str, Any]]:
    return [
        {
            "metric": s.metric,
            "type": s.type,
            "points": [{"timestamp": p.timestamp, "value": p.value} for p in s.points],
            "tags": list(s.tags),
            **({"unit": s.unit} if s.unit else {}),
        }
        for s in series
    ]


def test_the_overview_and_project_panels_render_the_counts_and_gauges_on_the_sandbox() -> None:
    sb = Sandbox()
    client = Client(sb)
    now = datetime.fromtimestamp(int(sb.clock.now()), UTC)
    world = _world()
    world.clock.current = now - timedelta(minutes=40)
    first = ask_hpc(world.svc, world.incidents, USER, 8, 3)
    second = ask_hpc(world.svc, world.incidents, USER, 8, 3, project="q")  # beyond quota: approved
    world.svc.approve(second, OPS)
    world.svc.process(world.incidents.by_ir(second).id)
    world.svc.idle_triggered(first, IdleScope(kind="idle"))
    world.clock.advance(minutes=10)
    world.svc.force_reclaim(second, OPS)
    world.process_resolved()
    world.clock.advance(minutes=10)
    ask_hpc(world.svc, world.incidents, USER, 8, 3, team="vision")  # waits for an operator
    world.clock.current = now - timedelta(minutes=1)
    world.svc.publish_gauges()
    sent = [s for s in world.metrics.series if s.metric in DECLARED]
    assert client.post("/api/v2/series", json={"series": _wire(sent)}, headers=KEYS).status_code == 202
    for metric, meta in desired_metadata().items():
        if metric in DECLARED:
            assert client.put(f"/api/v1/metrics/{metric}", json=meta, headers=KEYS).status_code == 200
    ids = {}
    for spec in desired_dashboards(parse_farm(FARM_YAML)):
        answer = client.post("/api/v1/dashboard", json=spec.body, headers=KEYS)
        ids[spec.key] = answer.json["id"]
    overview = client.get(f"/dashboards/{ids['farm-overview']}?environment=hpc").get_data(as_text=True)
    assert 'class="widget-error"' not in overview
    rows = _table_rows(overview, "Reclaims by reason per environment and model over the time frame")
    assert rows == [["operator", "hpc", "h100", "1", "8"]]
    waiting = _table_rows(overview, "Waiting requests per environment and model: for an operator, for hosts")
    assert ["hpc", "h100", "1", "0", "19 min"] in waiting  # the longest wait, 1,140 s
    assert _table_rows(overview, "Idle leases per environment and model: warned now") == [["hpc", "h100", "1"]]
    project = client.get(f"/dashboards/{ids['project']}?ir=ir-{first}").get_data(as_text=True)
    assert 'class="widget-error"' not in project
    values = re.findall(r'<p class="value">([^<]*)</p>', project)
    assert values[4:7] == ["1", "1", "-"]  # warned now, idle warnings, no reclaim of this lease
    per_lease = _table_rows(project, "Idle warnings and reclaims per lease over the time frame")
    assert per_lease == [[f"ir-{first}", "1", "-", "-"]]


def _table_rows(page: str, title: str) -> list[list[str]]:
    start = page.index(title)
    table = page[start : page.index("</table>", start)]
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]]


def test_every_declared_lifecycle_metric_is_built_and_its_reasons_are_the_declared_values() -> None:
    # The outlook's gauges are the sync's too (gpufarm.core.outlook.gauges; tests/unit/test_outlook.py checks them).
    declared = {m: s for m, s in DECLARED.items() if m not in outlook_gauges.GAUGES}
    assert set(DECLARED) - set(declared) == set(outlook_gauges.GAUGES)
    assert set(declared) == {*lifecycle_metrics.GAUGES, *lifecycle_metrics.COUNTS}
    assert {m: (s["type"], s["unit"]) for m, s in declared.items()} == {
        m: ("gauge" if m in lifecycle_metrics.GAUGES else "count", lifecycle_metrics.UNITS[m]) for m in declared
    }
    pattern = SPEC["tags"]["reclaim_reason"]["value"]
    assert all(re.match(pattern, r) for r in lifecycle_metrics.REASONS)
    assert not re.match(pattern, "bored") and not set(DECLARED) & set(SPEC["metrics"])
