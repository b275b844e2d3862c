"""The inventory ledger: registered hosts merged with cloud and static sources; no agent, down, unknown, quotas."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.inventory.ledger_gauges import GAUGE_NAMES, LEDGER_GAUGES, ledger_series
from gpufarm.core.inventory.sources import UNASSIGNED, agent_node, is_down, merge, read_in_background
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.ports import CloudQuota, HostInfo, SeenNode, SourceError, SourceReading
from gpufarm.core.service import GpuFarm

NOW = 1_800_000_000.0


def agent(name: str, model: str = "H100", count: int = 8, env: str = "cloud", *, reported: float = NOW, irs=()):
    return SeenNode(
        "gpufarm-node",
        name,
        (name,),
        gpu_model=model,
        gpu_count=count,
        environment=env,
        agent=True,
        last_reported=reported,
        irs=tuple(irs),
    )


def instance(
    iid: str,
    *,
    model: str | None = "H100",
    count: int = 8,
    env: str | None = "cloud",
    vcpus: int = 192,
    names: tuple[str, ...] = (),
    region: str = "us-east-1",
    family: str = "P",
) -> SeenNode:
    return SeenNode(
        "aws",
        iid,
        (iid, *names),
        region=region,
        instance_type="p5.48xlarge",
        family=family,
        gpu_model=model,
        gpu_count=count if model else 0,
        vcpus=vcpus,
        environment=env,
    )


# -- the merge ---------------------------------------------------------------------------------------------------


def test_an_instance_no_registered_host_answers_to_is_no_agent() -> None:
    agents = [agent("i-0aaa"), agent("hpc-1", env="hpc")]
    reading = SourceReading("aws", nodes=(instance("i-0aaa"), instance("i-0bbb")), calls=3)
    ledger = merge(agents, [reading], now=NOW, down_after_minutes=None)
    assert [n.id for n in ledger.no_agent] == ["i-0bbb"]
    assert ledger.pools[("cloud", "H100")].total == 8
    assert ledger.pools[("cloud", "H100")].no_agent == 8
    assert ledger.cloud_gpus[("cloud", "H100", "aws")] == 16
    assert ledger.calls == {"aws": 3}
    assert "aws:us-east-1:i-0bbb (p5.48xlarge, 8xH100, cloud)" in ledger.summary()["no_agent"]


def test_an_instance_matches_its_host_by_any_of_its_names() -> None:
    host = GpuHost.from_tags(
        "ip-10-0-0-7",
        ["gpufarm:managed", "gpu_model:h100", "gpu_count:8", "environment:cloud", "instance-id:i-0ccc"],
    )
    assert host is not None
    by_tag = agent_node(host, HostInfo("ip-10-0-0-7", host.tags, last_reported=NOW))
    assert by_tag.names == ("ip-10-0-0-7", "i-0ccc") and by_tag.last_reported == NOW
    ledger = merge([by_tag], [SourceReading("aws", nodes=(instance("i-0ccc"),))], now=NOW, down_after_minutes=None)
    assert ledger.no_agent == []
    dns = merge(
        [agent("IP-10-0-0-9")],
        [SourceReading("aws", nodes=(instance("i-0d", names=("ip-10-0-0-9",)),))],
        now=NOW,
        down_after_minutes=None,
    )
    assert dns.no_agent == []


def test_a_silent_host_is_down_only_under_a_policy() -> None:
    agents = [agent("h1", reported=NOW - 3600), agent("h2", reported=NOW - 60), agent("h3", reported=None)]
    assert merge(agents, [], now=NOW, down_after_minutes=None).down == []
    ledger = merge(agents, [], now=NOW, down_after_minutes=30)
    assert ledger.down == ["h1"]
    assert ledger.pools[("cloud", "H100")].down == 8 and ledger.pools[("cloud", "H100")].total == 24
    assert is_down(NOW - 1801, NOW, 30) and not is_down(NOW - 1799, NOW, 30)


def test_an_unknown_instance_is_never_counted_as_another_model() -> None:
    reading = SourceReading("aws", nodes=(instance("i-0x", model=None), instance("i-0y", model="A100")))
    ledger = merge([], [reading], now=NOW, down_after_minutes=None)
    assert [n.id for n in ledger.unknown] == ["i-0x"]
    assert ("cloud", "H100") not in ledger.pools
    assert ledger.pools[("cloud", "A100")].no_agent == 8
    assert {n.id for n in ledger.no_agent} == {"i-0x", "i-0y"}
    assert "unknown GPU" in ledger.summary()["unknown"][0]


def test_an_instance_outside_the_farms_environments_is_unassigned() -> None:
    reading = SourceReading("aws", nodes=(instance("i-1", env="nowhere"), instance("i-2", env=None)))
    ledger = merge([], [reading], now=NOW, down_after_minutes=None, environments={"cloud": object()})
    assert ledger.pools[(UNASSIGNED, "H100")].no_agent == 16


def test_quota_held_counts_the_instances_of_registered_hosts_carrying_a_lease() -> None:
    agents = [agent("i-held", irs=("ir-7",)), agent("i-free")]
    nodes = (instance("i-held"), instance("i-free"), instance("i-other", family="G", vcpus=4))
    quotas = (CloudQuota("aws", "us-east-1", "P", 1152, 576), CloudQuota("aws", "us-east-1", "G", 64, 4))
    ledger = merge(agents, [SourceReading("aws", nodes=nodes, quotas=quotas)], now=NOW, down_after_minutes=None)
    lines = {q.family: q for q in ledger.quotas}
    assert (lines["P"].limit, lines["P"].used, lines["P"].held) == (1152, 576, 192)
    assert lines["G"].held == 0


def test_a_failed_source_is_reported_and_the_others_still_count() -> None:
    failed = SourceReading("azure", errors=(SourceError("azure", "sub/eastus", "429 Too Many Requests", True),))
    ok = SourceReading("aws", nodes=(instance("i-1"),))
    ledger = merge([agent("h1")], [failed, ok], now=NOW, down_after_minutes=30)
    assert ledger.down == [] and len(ledger.no_agent) == 1
    assert ledger.summary()["source_errors"] == ["azure sub/eastus: 429 Too Many Requests"]
    series = {(s.metric, s.tags): s.points[0].value for s in ledger_series(ledger, int(NOW))}
    assert series[("gpufarm.inventory.source.errors", ("source:azure",))] == 1
    assert series[("gpufarm.inventory.source.errors", ("source:aws",))] == 0


def test_a_source_still_reading_past_the_wait_is_an_error_and_the_others_still_count() -> None:
    release = threading.Event()

    class Hung:
        name = "azure"

        def read(self) -> SourceReading:
            release.wait(5)  # a cloud that does not answer (let go at the end so no thread outlives the test)
            return SourceReading("azure", nodes=(instance("vm-1"),))

    class Quick:
        name = "aws"

        def read(self) -> SourceReading:
            return SourceReading("aws", nodes=(instance("i-1"),))

    try:
        readings = read_in_background([Hung(), Quick()], wait_s=0.05)()
    finally:
        release.set()
    hung, quick = readings
    assert hung.nodes == () and hung.errors == (SourceError("azure", "*", "no answer within 0 s"),)
    assert [n.id for n in quick.nodes] == ["i-1"] and quick.errors == ()
    ledger = merge([agent("h1")], readings, now=NOW, down_after_minutes=30)
    assert ledger.down == [] and [n.id for n in ledger.no_agent] == ["i-1"]


def test_a_static_entry_for_a_cloud_instance_is_counted_once() -> None:
    cloud = SourceReading("aws", nodes=(instance("i-9", names=("gpu-9",)),))
    static = SourceReading(
        "static", nodes=(SeenNode("static", "gpu-9", ("gpu-9",), gpu_model="H100", gpu_count=8, environment="cloud"),)
    )
    ledger = merge([], [cloud, static], now=NOW, down_after_minutes=None)
    assert len(ledger.no_agent) == 1 and ledger.pools[("cloud", "H100")].no_agent == 8


def test_every_series_is_a_declared_gauge_with_its_declared_tags() -> None:
    reading = SourceReading(
        "aws",
        nodes=(instance("i-1"), instance("i-2", model=None)),
        quotas=(CloudQuota("aws", "us-east-1", "P", 10, 5),),
    )
    ledger = merge([agent("h", reported=0)], [reading], now=NOW, down_after_minutes=5)
    series = ledger_series(ledger, int(NOW))
    declared = {g.name: set(g.tags) for g in LEDGER_GAUGES}
    assert {s.metric for s in series} <= GAUGE_NAMES
    for s in series:
        assert {t.split(":", 1)[0] for t in s.tags} == declared[s.metric], s.metric
    assert len(GAUGE_NAMES) == len(LEDGER_GAUGES)


# -- the farm file -----------------------------------------------------------------------------------------------

INVENTORY = """
inventory:
  down_after_minutes: 30
  aws:
    regions: [us-east-1]
    default_environment: cloud
  azure:
    subscriptions: [00000000-0000-4000-8000-000000000001]
    locations: [eastus]
  static:
    - {name: hpc-9, environment: hpc, cluster: a, gpu_model: h100, gpu_count: 8}
"""


def test_the_inventory_section_is_validated() -> None:
    farm = parse_farm(FARM_YAML + INVENTORY)
    assert farm.inventory.down_after_minutes == 30
    assert farm.inventory.aws is not None and farm.inventory.aws.instance_types[0] == "p3.*"
    assert farm.inventory.static[0].gpu_model == "H100"
    bad = {
        "regions: [us-east-1]": "regions: [Mars]",
        "gpu_model: h100": "gpu_model: a100",
        "default_environment: cloud": "default_environment: nowhere",
        "down_after_minutes: 30": "down_after_minutes: 1",
        "locations: [eastus]": "locations: [eastus]\n    bogus: 1",
        "00000000-0000-4000-8000-000000000001": "not-a-uuid",
    }
    for old, new in bad.items():
        with pytest.raises(FarmConfigError) as err:
            parse_farm(FARM_YAML + INVENTORY.replace(old, new))
        assert "inventory" in str(err.value), old
    assert parse_farm(FARM_YAML).inventory.aws is None


# -- the sync --------------------------------------------------------------------------------------------------


class ReportingHosts(FakeHosts):
    """FakeHosts whose list says when each host last reported."""

    def __init__(self) -> None:
        super().__init__()
        self.reported: dict[str, float] = {}

    def list_hosts(self, filter_text: str | None = None) -> Iterator[HostInfo]:
        for info in super().list_hosts(filter_text):
            yield HostInfo(info.name, info.tags, info.tags_by_source, self.reported.get(info.name))


class Source:
    def __init__(self, name: str, reading: SourceReading | None = None, fail: bool = False) -> None:
        self.name, self.reading, self.fail, self.reads = name, reading, fail, 0

    def read(self) -> SourceReading:
        self.reads += 1
        if self.fail:
            raise RuntimeError("connection reset\nbody that must not be logged")
        assert self.reading is not None
        return self.reading


def make_farm(sources, yaml: str = FARM_YAML + INVENTORY):
    clock = FakeClock()
    hosts = ReportingHosts()
    for name in ("hpc-1", "hpc-2"):
        hosts.seed(name, "H100", 8, "hpc", "a")
    metrics = FakeMetrics()
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=hosts,
        chat=FakeChat(),
        clock=clock,
        farm=parse_farm(yaml),
        metrics=metrics,
        sources=sources,
    )
    return svc, hosts, clock, metrics


def test_the_sync_reports_no_agent_down_and_skipped_sources_and_publishes_them() -> None:
    aws = Source(
        "aws",
        SourceReading(
            "aws", nodes=(instance("i-0new"),), quotas=(CloudQuota("aws", "us-east-1", "P", 384, 192),), calls=4
        ),
    )
    broken = Source("azure", fail=True)
    svc, hosts, clock, metrics = make_farm([broken, aws])
    now = clock.now().timestamp()
    hosts.reported = {"hpc-1": now - 3600, "hpc-2": now}
    report = svc.sync()
    assert aws.reads == broken.reads == 1
    inv = report.inventory
    assert inv["down"] == ["hpc-1"]
    assert [e.split(":")[0] for e in inv["no_agent"]] == ["aws", "static"]
    assert inv["source_errors"] == ["azure *: RuntimeError: connection reset"]
    assert inv["source_calls"] == {"aws": 4, "azure": 0, "static": 0}
    assert metrics.value("gpufarm.inventory.gpus.down", "environment:hpc", "gpu_model:h100") == 8
    assert metrics.value("gpufarm.inventory.gpus.no_agent", "environment:hpc", "gpu_model:h100") == 8
    assert metrics.value("gpufarm.inventory.gpus.no_agent", "environment:cloud", "gpu_model:h100") == 8
    assert metrics.value("gpufarm.cloud.quota.limit", "source:aws", "region:us-east-1", "family:p") == 384
    assert metrics.value("gpufarm.inventory.source.errors", "source:azure") == 1
    assert metrics.value("gpufarm.inventory.gpus.total", "environment:hpc", "gpu_model:h100") == 16
    # Nothing was untagged or written because a source failed.
    assert hosts.writes == 0


def test_a_down_host_gets_no_allocation_and_its_pool_waits() -> None:
    svc, hosts, clock, _ = make_farm([])
    now = clock.now().timestamp()
    hosts.reported = {"hpc-1": now - 3600, "hpc-2": now}

    def approved() -> int:
        req = build_request(
            {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"},
            svc.context.farm,
            requester="U0000000001",
            channel="C0000000002",
            request_id=f"req-{now}-{len(svc.context.incidents.records)}",
        )
        fields = req.to_fields(Phase.APPROVED, clock.now())
        return svc.context.incidents.create(req.title(), {**fields, f.APPROVED_BY: "U0000000OPS"}).public_id

    first = approved()
    svc.process(svc.context.incidents.by_ir(first).id)
    assert Allocation.from_record(svc.context.incidents.by_ir(first)).hosts == ("hpc-2",)
    second = approved()
    svc.process(svc.context.incidents.by_ir(second).id)
    assert Allocation.from_record(svc.context.incidents.by_ir(second)).phase is Phase.WAITING
    hosts.reported["hpc-1"] = (clock.now() + timedelta(seconds=1)).timestamp()
    svc.process(svc.context.incidents.by_ir(second).id)
    assert Allocation.from_record(svc.context.incidents.by_ir(second)).hosts == ("hpc-1",)


def test_the_runtime_builds_the_cloud_sources_the_farm_file_enables_and_reads_nothing() -> None:
    from gpufarm.handlers.runtime import cloud_sources

    farm = parse_farm(FARM_YAML + INVENTORY)
    sources = cloud_sources(farm, 5.0)
    assert [s.name for s in sources] == ["aws", "azure"]
    assert all(getattr(s, "calls", 0) == 0 for s in sources)
    off = parse_farm(
        FARM_YAML + INVENTORY.replace("default_environment: cloud", "default_environment: cloud\n    enabled: false")
    )
    assert [s.name for s in cloud_sources(off, 5.0)] == ["azure"]
    assert cloud_sources(parse_farm(FARM_YAML), 5.0) == ()


def test_a_down_hosts_gpus_are_counted_but_not_free() -> None:
    svc, hosts, clock, metrics = make_farm([])
    hosts.reported = {"hpc-1": clock.now().timestamp() - 3600, "hpc-2": clock.now().timestamp()}
    svc.sync()
    assert metrics.value("gpufarm.inventory.gpus.total", "environment:hpc", "gpu_model:h100") == 16
    assert metrics.value("gpufarm.inventory.gpus.free", "environment:hpc", "gpu_model:h100") == 8
    assert metrics.value("gpufarm.inventory.gpus.down", "environment:hpc", "gpu_model:h100") == 8
