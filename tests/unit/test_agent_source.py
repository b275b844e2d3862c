"""The Datadog Agent's GPU check as an inventory source: its farm file section, its queries (one per pool, one per
sync), the model read from the device name, bounded answers, and how the ledger merges what it reads."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeClock

from gpufarm.core.config.farm import FarmConfig, FarmConfigError, parse_farm
from gpufarm.core.config.inventory import DatadogAgentInventory
from gpufarm.core.inventory.agent_source import AgentCheckSource, device_model, for_farm, pool_query, recent_query
from gpufarm.core.inventory.ledger_gauges import ledger_series
from gpufarm.core.inventory.sources import merge
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import ScalarResult, SeenNode, SourceReading

MODELS = ("H100", "A100", "L4", "A10")
AGENT_FARM = FARM_YAML.replace(
    "cloud: {kind: dedicated, gpu_models: [H100, A100]}",
    "cloud: {kind: dedicated, metrics_source: datadog-agent, gpu_models: [H100, A100]}",
)


class Answers:
    """A MetricsQuery answering each query from a table (or failing), recording what it was asked."""

    def __init__(self, table: dict[str, list[ScalarResult] | Exception]) -> None:
        self.table = table
        self.asked: list[tuple[str, datetime, datetime, str]] = []

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        self.asked.append((query, start, end, aggregator))
        answer = self.table.get(query, [])
        if isinstance(answer, Exception):
            raise answer
        return answer


def devices(*rows: tuple[str, str, float]) -> list[ScalarResult]:
    return [ScalarResult((f"host:{h}", f"gpu_device:{d}"), v) for h, d, v in rows]


def hosts(*names: str) -> list[ScalarResult]:
    return [ScalarResult((f"host:{n}",), 1.0) for n in names]


def farm(inventory: str) -> FarmConfig:
    return parse_farm(AGENT_FARM + "inventory:\n" + inventory)


def source(query: Answers, *, down_after: int | None = 30, **settings: object) -> AgentCheckSource:
    return AgentCheckSource(
        DatadogAgentInventory.model_validate(settings),
        ["cloud"],
        MODELS,
        query,
        FakeClock(),
        down_after_minutes=down_after,
    )


POOL = pool_query(("environment:cloud",))
RECENT = recent_query([("environment:cloud",)])


# -- the model from the device name ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "model"),
    [
        ("nvidia_h100_80gb_hbm3", "H100"),
        ("nvidia_a100_sxm4_80gb", "A100"),
        ("nvidia_a10", "A10"),  # not A100: whole parts of the name only
        ("nvidia_l4", "L4"),
        ("tesla_t4", None),  # a model the farm does not list is unknown, never another one
        ("nvidia_h100_a100_bridge", None),  # a name that says two models says none
    ],
)
def test_the_model_is_a_whole_part_of_the_device_name(device: str, model: str | None) -> None:
    assert device_model(device, MODELS, {}) == model


def test_the_farm_file_names_models_for_devices_whose_name_does_not() -> None:
    assert device_model("nvidia_gh200_480gb", MODELS, {"nvidia_gh200_480gb": "H100"}) == "H100"


# -- reading ---------------------------------------------------------------------------------------------------


def test_one_query_per_pool_and_one_per_sync_say_each_hosts_gpus_and_which_still_report() -> None:
    query = Answers(
        {
            POOL: devices(("dd-a", "nvidia_h100_80gb_hbm3", 8), ("dd-b", "nvidia_a100_sxm4_80gb", 4)),
            RECENT: hosts("dd-a"),
        }
    )
    reading = source(query, lookback_minutes=120).read()
    assert reading.calls == 2 and reading.errors == ()
    assert [q for q, *_ in query.asked] == [
        "sum:gpu.device.total{environment:cloud} by {host,gpu_device}",
        "max:gpu.device.total{(environment:cloud)} by {host}",
    ]
    (_, start, end, aggregator), (_, recent_start, recent_end, _) = query.asked
    assert end - start == timedelta(minutes=120) and aggregator == "max"
    assert recent_end - recent_start == timedelta(minutes=30)  # inventory.down_after_minutes
    by_id = {n.id: n for n in reading.nodes}
    assert (by_id["dd-a"].gpu_model, by_id["dd-a"].gpu_count, by_id["dd-a"].silent) == ("H100", 8, False)
    assert (by_id["dd-b"].gpu_model, by_id["dd-b"].gpu_count, by_id["dd-b"].silent) == ("A100", 4, True)
    assert all(n.agent and n.environment == "cloud" and n.source == "datadog-agent" for n in reading.nodes)


def test_calls_stay_the_pools_count_plus_one_whatever_the_hosts() -> None:
    rows = [(f"dd-{i:05d}", "nvidia_h100_80gb_hbm3", 8.0) for i in range(5000)]
    query = Answers({POOL: devices(*rows), RECENT: hosts(*(r[0] for r in rows))})
    reading = source(query).read()
    assert reading.calls == 2 and len(query.asked) == 2 and len(reading.nodes) == 5000


def test_the_farm_files_scope_device_names_and_lookback_are_what_the_queries_use() -> None:
    scope = ("kube_cluster_name:gpu-a", "team:ml")
    custom = pool_query(scope)
    query = Answers({custom: devices(("k-1", "nvidia_gh200_480gb", 1))})
    reading = source(
        query,
        down_after=None,
        scopes={"cloud": list(scope)},
        device_models={"nvidia_gh200_480gb": "H100"},
        lookback_minutes=45,
    ).read()
    assert query.asked[0][0] == "sum:gpu.device.total{kube_cluster_name:gpu-a AND team:ml} by {host,gpu_device}"
    assert query.asked[0][2] - query.asked[0][1] == timedelta(minutes=45)
    assert [(n.id, n.gpu_model) for n in reading.nodes] == [("k-1", "H100")]
    assert reading.calls == 1  # no down policy: no recency query, nobody silent


def test_a_failed_pool_query_is_an_error_of_that_pool_and_a_failed_recency_query_silences_nobody() -> None:
    failing = Answers({POOL: UpstreamError("query metrics: HTTP 429 rate limited")})
    reading = source(failing).read()
    assert reading.nodes == () and reading.calls == 1
    [error] = reading.errors
    assert (error.source, error.where, error.throttled) == ("datadog-agent", "cloud", True)
    quiet = Answers({POOL: devices(("dd-a", "nvidia_h100_80gb_hbm3", 8)), RECENT: UpstreamError("query metrics: 503")})
    reading = source(quiet).read()
    assert [n.silent for n in reading.nodes] == [False]  # a missing answer never makes a host down
    assert [e.where for e in reading.errors] == ["*"]


def test_answers_are_bounded_garbage_groups_are_dropped() -> None:
    query = Answers(
        {
            POOL: [
                *devices(("ok-1", "nvidia_l4", 2), ("huge", "nvidia_l4", 10_000), ("neg", "nvidia_l4", -1)),
                *devices(("bad host!", "nvidia_l4", 1), ("nan", "nvidia_l4", float("nan"))),
                ScalarResult(("host:nodata", "gpu_device:nvidia_l4"), None),
                ScalarResult(("host:weird", "gpu_device:NVIDIA L4 <script>"), 1.0),
            ],
            RECENT: hosts("ok-1"),
        }
    )
    reading = source(query).read()
    assert [(n.id, n.gpu_count) for n in reading.nodes] == [("ok-1", 2)]


def test_a_host_with_two_device_names_is_two_nodes_under_one_name() -> None:
    query = Answers(
        {POOL: devices(("mix", "nvidia_h100_80gb_hbm3", 4), ("mix", "nvidia_a100_sxm4_80gb", 4)), RECENT: hosts("mix")}
    )
    nodes = source(query).read().nodes
    assert sorted((n.id, n.names, n.gpu_model) for n in nodes) == [
        ("mix", ("mix",), "A100"),
        ("mix/nvidia_h100_80gb_hbm3", ("mix",), "H100"),
    ]


# -- the farm file ---------------------------------------------------------------------------------------------


def test_the_section_builds_the_source_on_the_agent_pools_only() -> None:
    config = farm("  down_after_minutes: 20\n  datadog_agent: {lookback_minutes: 60}\n")
    built = for_farm(config, Answers({}), FakeClock())
    assert built is not None
    assert built.pools == ("cloud",) and built.down_after_minutes == 20 and built.settings.lookback_minutes == 60
    assert for_farm(farm("  datadog_agent: {enabled: false}\n"), Answers({}), FakeClock()) is None
    assert for_farm(parse_farm(AGENT_FARM), Answers({}), FakeClock()) is None  # no section: not read
    assert for_farm(config, None, FakeClock()) is None  # no query port (a test's service without metrics)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("  datadog_agent: {scopes: {hpc: ['environment:hpc']}}\n", r"scopes\.hpc: 'hpc' is not an environment with"),
        ("  datadog_agent: {device_models: {nvidia_b200: B200}}\n", r"device_models\.nvidia_b200: 'B200' is not a"),
        ("  down_after_minutes: 60\n  datadog_agent: {lookback_minutes: 60}\n", r"lookback_minutes: 60 must exceed"),
        ("  datadog_agent: {scopes: {cloud: ['env cloud']}}\n", r"datadog_agent\.scopes\.cloud"),
        ("  datadog_agent: {scopes: {cloud: []}}\n", r"scopes\.cloud: empty"),
        ("  datadog_agent: {lookback: 60}\n", r"datadog_agent\.lookback"),
    ],
)
def test_the_section_is_validated_strictly(text: str, problem: str) -> None:
    with pytest.raises(FarmConfigError, match=problem):
        farm(text)


def test_the_section_needs_a_pool_on_the_agent() -> None:
    with pytest.raises(FarmConfigError, match="no environment has metrics_source: datadog-agent"):
        parse_farm(FARM_YAML + "inventory:\n  datadog_agent: {}\n")


# -- the merge -------------------------------------------------------------------------------------------------

NOW = 1_800_000_000.0


def check_node(name: str, model: str | None = "H100", count: int = 8, *, silent: bool = False) -> SeenNode:
    return SeenNode(
        "datadog-agent", name, (name,), gpu_model=model, gpu_count=count, environment="cloud", agent=True, silent=silent
    )


def registered(name: str) -> SeenNode:
    return SeenNode(
        "gpufarm-node", name, (name,), gpu_model="H100", gpu_count=8, environment="cloud", agent=True, last_reported=NOW
    )


def test_an_agent_check_host_without_gpufarm_tags_is_inventory_with_an_agent_and_down_when_silent() -> None:
    readings = [
        SourceReading("datadog-agent", nodes=(check_node("dd-a"), check_node("dd-b", silent=True), check_node("h1"))),
        # The cloud instance that is dd-a runs the Agent: it is not "no agent"; the one that is nobody is.
        SourceReading(
            "aws",
            nodes=(
                SeenNode("aws", "i-0a", ("i-0a", "dd-a"), gpu_model="H100", gpu_count=8, environment="cloud"),
                SeenNode("aws", "i-0b", ("i-0b",), gpu_model="H100", gpu_count=8, environment="cloud"),
            ),
        ),
    ]
    ledger = merge([registered("h1")], readings, now=NOW, down_after_minutes=30, environments={"cloud": object()})
    pool = ledger.pools[("cloud", "H100")]
    # h1 is registered: gpufarm's registration counts it once, the check's series add nothing.
    assert (pool.total, pool.unregistered, pool.down, pool.no_agent) == (8, 16, 8, 8)
    assert ledger.down == ["dd-b"]
    assert [n.id for n in ledger.no_agent] == ["i-0b"]
    series = {(s.metric, s.tags): s.points[0].value for s in ledger_series(ledger, int(NOW))}
    assert series[("gpufarm.inventory.gpus.unregistered", ("environment:cloud", "gpu_model:h100"))] == 16
    assert series[("gpufarm.inventory.gpus.down", ("environment:cloud", "gpu_model:h100"))] == 8


def test_an_agent_check_host_of_an_unknown_device_is_unknown_never_another_model() -> None:
    ledger = merge(
        [], [SourceReading("datadog-agent", nodes=(check_node("t4", model=None),))], now=NOW, down_after_minutes=None
    )
    assert [n.id for n in ledger.unknown] == ["t4"] and ledger.pools == {}


def test_the_example_farm_documents_the_section_it_validates() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text()
    start = text.index("  # datadog_agent:")
    lines = [line.replace("# ", "", 1) for line in text[start:].splitlines()[:4]]
    agent_pool = text.replace("metrics_source: gpufarm-node", "metrics_source: datadog-agent", 1)
    at = agent_pool.index("\n", agent_pool.index("gpu_count: 8}", agent_pool.index("  static:"))) + 1
    config = parse_farm(agent_pool[:at] + "\n".join(lines) + "\n" + agent_pool[at:])
    agent = config.inventory.datadog_agent
    assert agent is not None
    assert (agent.lookback_minutes, agent.scope("cloud-aws"), agent.device_models) == (
        180,
        ("environment:cloud-aws",),
        {"nvidia_gh200_480gb": "H100"},
    )
