"""Used GPUs on `datadog-agent` pools (issue 12 point 2): one more query per sync on the Agent GPU check's
`gpu.sm_active`, busy devices counted per (ir, host) at the idle monitors' threshold, unattributed devices, bounded
answers, and a failure of either query leaving only its own hosts unmeasured."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, ask_hpc

from gpufarm.adapters.datadog import scalar_results
from gpufarm.core.accounting import agent_usage, gpu_hours
from gpufarm.core.accounting.agent_usage import BUSY_PERCENT, AgentPools, decode
from gpufarm.core.accounting.gpu_hours import IDLE_HELD_QUERY, UNMEASURED, USAGE_QUERY
from gpufarm.core.config.accounting import LedgerSettings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.inventory import agent_source
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import ScalarResult
from gpufarm.core.service import GpuFarm
from gpufarm.setup import monitors

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
AGENT_FARM = FARM_YAML.replace(
    "hpc: {kind: dedicated, gpu_models: [H100]}",
    "hpc: {kind: dedicated, metrics_source: datadog-agent, gpu_models: [H100]}",
).replace("hpc: {H100: {gpus: 8, hard_limit: 16}}", "hpc: {H100: {gpus: 32, hard_limit: 64}}")
POOLS = AgentPools((("environment:hpc",),))
AGENT_QUERY = "avg:gpu.sm_active{(environment:hpc)} by {host,ir,gpu_uuid}"


def device(host: str, index: int, percent: float | None, ir: str | None = None) -> ScalarResult:
    """One device's group as Datadog answers it: a host without an `ir` tag groups under `ir:N/A`."""
    return ScalarResult((f"host:{host}", f"ir:{ir or 'N/A'}", f"gpu_uuid:gpu-{host}-{index}"), percent)


@dataclass
class Answers:
    """MetricsQuery answering the node agent's query and the Agent check's query from tables, or failing."""

    node: list[ScalarResult] = field(default_factory=list)
    agent: list[ScalarResult] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    asked: list[tuple[str, datetime, datetime, str]] = field(default_factory=list)

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        self.asked.append((query, start, end, aggregator))
        if query == IDLE_HELD_QUERY:  # the node agent's idle-held devices: none in these tables
            return []
        which = "node" if query == USAGE_QUERY else "agent"
        if which in self.failing:
            raise UpstreamError("query metrics failed: 503")
        return self.node if which == "node" else self.agent


# -- the query -----------------------------------------------------------------------------------------------------


def test_agent_pools_are_read_from_the_farm_with_their_inventory_scopes() -> None:
    assert agent_usage.for_farm(parse_farm(FARM_YAML)) is None  # every pool on gpufarm-node: no query
    assert agent_usage.for_farm(parse_farm(AGENT_FARM)) == POOLS
    assert POOLS.query() == AGENT_QUERY
    two = AGENT_FARM.replace("cloud: {kind: dedicated,", "cloud: {kind: dedicated, metrics_source: datadog-agent,")
    scoped = two + "inventory:\n  datadog_agent: {scopes: {cloud: [provider:aws, gpufarm:managed]}}\n"
    pools = agent_usage.for_farm(parse_farm(scoped))
    assert pools is not None
    assert pools.query() == (
        "avg:gpu.sm_active{(provider:aws AND gpufarm:managed) OR (environment:hpc)} by {host,ir,gpu_uuid}"
    )


def test_the_idle_monitors_and_the_ledger_share_one_busy_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    def idle_query() -> str:
        wanted = monitors.desired_monitors(parse_farm(AGENT_FARM))
        [idle] = [m for m in wanted if "max:gpu.sm_active" in m.body["query"]]
        assert idle.body["options"]["thresholds"]["critical"] == agent_usage.BUSY_PERCENT
        return str(idle.body["query"])

    assert idle_query().endswith(" < 1")
    answer = [device("a", 0, 3.0, "ir-1")]
    assert decode(answer).busy == {("ir-1", "a"): 1.0}
    monkeypatch.setattr(agent_usage, "BUSY_PERCENT", 5.0)
    assert idle_query().endswith(" < 5")
    assert decode(answer).busy == {("ir-1", "a"): 0.0}  # 3 % is idle to the monitor, so not busy to the ledger


# -- decoding ------------------------------------------------------------------------------------------------------


def test_devices_at_or_above_the_threshold_are_busy_per_ir_and_host() -> None:
    answer = [
        device("a", 0, 88.0, "ir-7"),
        device("a", 1, BUSY_PERCENT, "ir-7"),  # at the threshold: busy
        device("a", 2, BUSY_PERCENT - 0.01, "ir-7"),  # under it: idle
        device("a", 3, 0.0, "ir-7"),
        device("b", 0, 0.0, "ir-8"),  # a host whose devices are all idle is measured, 0 busy
        device("c", 0, 50.0),  # no `ir` host tag: unattributed
        device("c", 1, 0.0),
    ]
    reading = decode(answer)
    assert dict(reading.busy) == {("ir-7", "a"): 2.0, ("ir-8", "b"): 0.0, ("none", "c"): 1.0}
    assert reading.hosts == {"a", "b", "c"}


def test_garbage_groups_are_dropped_and_never_make_a_host_measured() -> None:
    answer = [
        device("a", 0, None, "ir-1"),
        device("b", 0, float("nan"), "ir-1"),
        device("c", 0, -3.0, "ir-1"),
        device("d", 0, 250.0, "ir-1"),
        ScalarResult(("ir:ir-1", "gpu_uuid:gpu-x"), 90.0),  # no host
        ScalarResult(("host:N/A", "ir:ir-1", "gpu_uuid:gpu-x"), 90.0),
        ScalarResult(("host:e", "ir:ir-1"), 90.0),  # no device
        device("f", 0, 90.0, "IR-1; drop"),  # not a tag gpufarm writes: unattributed
        device("g", 0, 90.0, "ir-0"),
    ]
    reading = decode(answer)
    assert reading.hosts == {"f", "g"}
    assert dict(reading.busy) == {("none", "f"): 1.0, ("none", "g"): 1.0}


def test_a_shared_host_counts_each_device_for_every_lease_it_names_and_once_each() -> None:
    answer = [device("s", i, 90.0, ir) for ir in ("ir-1", "ir-2") for i in range(2)]
    answer.append(device("s", 0, 90.0, "ir-1"))  # the same group twice counts once
    assert dict(decode(answer).busy) == {("ir-1", "s"): 2.0, ("ir-2", "s"): 2.0}


def test_the_answer_is_bounded_per_host_and_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    flood = [device("a", i, 90.0, "ir-1") for i in range(agent_source.MAX_GPUS + 10)]
    assert decode(flood).busy == {("ir-1", "a"): float(agent_source.MAX_GPUS)}
    monkeypatch.setattr(agent_usage, "MAX_GROUPS", 3)
    many = [device(f"h{i}", 0, 90.0, "ir-1") for i in range(5)]
    assert decode(many).hosts == {"h0", "h1", "h2"}


def test_a_scalar_answer_of_a_group_per_device_decodes_in_linear_time() -> None:
    # 4,000 Agent hosts of 8 GPUs with a lease each: one row per device, three group columns (the v2 scalar shape).
    n = 32_000
    columns = [
        {"name": "host", "type": "group", "values": [[f"h{i // 8}"] for i in range(n)]},
        {"name": "ir", "type": "group", "values": [[f"ir-{i // 8 + 1}"] for i in range(n)]},
        {"name": "gpu_uuid", "type": "group", "values": [[f"gpu-{i}"] for i in range(n)]},
        {"name": "a", "type": "number", "values": [90.0 if i % 2 else 0.0 for i in range(n)]},
    ]
    started = time.perf_counter()
    reading = decode(scalar_results(columns))
    # Each column read once: ~0.2 s here; a copy of every column per row took minutes at this size.
    assert time.perf_counter() - started < 10
    assert len(reading.hosts) == 4_000 and reading.busy[("ir-1", "h0")] == 4.0


# -- merged into the one measurement ---------------------------------------------------------------------------


def test_measure_makes_one_more_query_and_merges_it_with_the_node_agents() -> None:
    answers = Answers(
        node=[ScalarResult(("gpu_ir:ir-1", "host:n1"), 3.0)],
        agent=[device("a1", 0, 90.0, "ir-2"), device("a1", 1, 0.0, "ir-2"), device("a2", 0, 40.0)],
    )
    usage = gpu_hours.measure(answers, NOW, LedgerSettings(window_minutes=30), POOLS)
    assert [(q, s, e) for q, s, e, _ in answers.asked] == [
        (USAGE_QUERY, NOW - timedelta(minutes=30), NOW),
        (IDLE_HELD_QUERY, NOW - timedelta(minutes=30), NOW),
        (AGENT_QUERY, NOW - timedelta(minutes=30), NOW),
    ]
    assert answers.asked[2][3] == "avg"
    assert usage.measured and usage.hosts == {"n1", "a1", "a2"}
    assert usage.lease_busy(1, "n1") == 3.0 and usage.lease_busy(2, "a1") == 1.0
    assert usage.lease_busy(2, "a9") is None  # an agent host that sent nothing: unmeasured
    assert usage.unattributed() == {"a2": 1.0}
    # The Agent's check cannot tell idle-held devices: an agent pool's lease has none.
    assert usage.lease_idle_held(2, "a1") == 0
    # Without agent pools, the node agent's queries alone.
    answers.asked.clear()
    assert gpu_hours.measure(answers, NOW, LedgerSettings()).hosts == {"n1"}
    assert len(answers.asked) == 2


def test_a_host_the_node_agent_measured_keeps_that_measurement() -> None:
    answers = Answers(node=[ScalarResult(("gpu_ir:ir-1", "host:x"), 2.0)], agent=[device("x", 0, 90.0, "ir-1")])
    usage = gpu_hours.measure(answers, NOW, LedgerSettings(), POOLS)
    assert usage.lease_busy(1, "x") == 2.0


def test_a_failing_agent_query_leaves_only_its_hosts_unmeasured_and_the_reverse() -> None:
    node = [ScalarResult(("gpu_ir:ir-1", "host:n1"), 3.0)]
    agent = [device("a1", 0, 90.0, "ir-2")]
    usage = gpu_hours.measure(Answers(node, agent, failing={"agent"}), NOW, LedgerSettings(), POOLS)
    assert usage.measured and usage.lease_busy(1, "n1") == 3.0
    assert usage.lease_busy(2, "a1") is None  # unmeasured, never idle
    usage = gpu_hours.measure(Answers(node, agent, failing={"node"}), NOW, LedgerSettings(), POOLS)
    assert usage.lease_busy(1, "n1") is None and usage.lease_busy(2, "a1") == 1.0
    both = gpu_hours.measure(Answers(node, agent, failing={"node", "agent"}), NOW, LedgerSettings(), POOLS)
    assert both == UNMEASURED


# -- through the service: the ledger and the GPU-hours of an agent-pool lease ----------------------------------


@pytest.fixture
def agent_world() -> Iterator[tuple[GpuFarm, FakeClock, FakeIncidents, Answers]]:
    clock = FakeClock(datetime(2026, 11, 30, 20, 0, tzinfo=UTC))
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for n in range(2):
        hosts.seed(f"hpc-{n}", "H100", 8, "hpc")
    answers = Answers()
    svc = GpuFarm(
        incidents=incidents,
        hosts=hosts,
        chat=FakeChat(operators=frozenset({"U0000000OPS"})),
        clock=clock,
        farm=parse_farm(AGENT_FARM),
        metrics=FakeMetrics(),
        usage=answers,
    )
    yield svc, clock, incidents, answers


def test_an_agent_pool_lease_shows_used_and_accrues_busy_and_idle_hours(
    agent_world: tuple[GpuFarm, FakeClock, FakeIncidents, Answers],
) -> None:
    svc, clock, incidents, answers = agent_world
    ir = ask_hpc(svc, incidents, "U0000000001", 8, 7, team="nlp", project="llm")
    [host] = Allocation.from_record(incidents.by_ir(ir)).hosts
    answers.agent = [device(host, i, 90.0 if i < 6 else 0.0, f"ir-{ir}") for i in range(8)]
    text = svc.quota("nlp").blocks[0]["text"]["text"]
    assert "`nlp/llm` H100 in `hpc`: 8 held: 6 used / 2 idle / 0 unmeasured" in text
    clock.advance(minutes=60)
    assert svc.sync().accrued == [ir]
    alloc = Allocation.from_record(incidents.by_ir(ir))
    assert (alloc.hours_held, alloc.hours_busy, alloc.hours_idle, alloc.hours_unmeasured) == (8.0, 6.0, 2.0, 0.0)
    # The Agent's query failing: the next hour is unmeasured, never idle.
    answers.failing = {"agent"}
    clock.advance(minutes=60)
    assert svc.sync().accrued == [ir]
    alloc = Allocation.from_record(incidents.by_ir(ir))
    assert (alloc.hours_held, alloc.hours_busy, alloc.hours_idle, alloc.hours_unmeasured) == (16.0, 6.0, 2.0, 8.0)
