"""One invocation's view (gpufarm.core.context.reads) and the sync's repair built on it, against in-memory ports.

Reads are narrowed by facets and shared: a narrower scope is answered from a wider one already read, writes update
what was read, the policy's capacity check lists the pool no further than the ask, and a repair that finds nothing
to fix reads no host on its own and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.context.reads import CENSUS_SAMPLE, Reads, host_filter, live_query
from gpufarm.core.governance import charging
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.ports import HostInfo, HostPage
from gpufarm.core.service import GpuFarm
from gpufarm.core.sync import repair
from gpufarm.handlers.incident_webhook import QueueMessage

USER = "U0000000001"


class CountingHosts(FakeHosts):
    """FakeHosts that counts host lists, hosts handed out by them, and single-host tag reads."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: list[str | None] = []
        self.listed = 0
        self.gets: list[str] = []
        self.pages: list[tuple[str, int, int]] = []

    def list_hosts(self, filter_text: str | None = None) -> Iterator[HostInfo]:
        self.lists.append(filter_text)
        for info in super().list_hosts(filter_text):
            self.listed += 1
            yield info

    def get_tags(self, host: str, source: str = "user") -> list[str]:
        self.gets.append(host)
        return super().get_tags(host, source)

    def host_page(self, filter_text: str, start: int, count: int) -> HostPage:
        self.pages.append((filter_text, start, count))
        return super().host_page(filter_text, start, count)


class ListOnlyHosts(FakeHosts):
    """A HostTags without pages: the host list and nothing else (the census is not possible)."""

    host_page = None  # type: ignore[assignment]


class ApproximateHosts(CountingHosts):
    """A host list whose match counts are estimates (Datadog's exact_total_matching false)."""

    def host_page(self, filter_text: str, start: int, count: int) -> HostPage:
        page = super().host_page(filter_text, start, count)
        return HostPage(page.hosts, None)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def incidents(clock: FakeClock) -> FakeIncidents:
    return FakeIncidents(clock)


@pytest.fixture
def hosts() -> CountingHosts:
    hosts = CountingHosts()
    for i in range(6):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc", "a")
    hosts.seed("cloud-1", "A100", 8, "cloud", "use1")
    return hosts


@pytest.fixture
def svc(incidents: FakeIncidents, hosts: CountingHosts, clock: FakeClock) -> GpuFarm:
    return GpuFarm(incidents=incidents, hosts=hosts, chat=FakeChat(), clock=clock, farm=parse_farm(FARM_YAML))


def _lease(svc: GpuFarm, incidents: FakeIncidents, *, env: str = "hpc", team: str = "nlp", phase: Phase) -> int:
    values = {"gpu_count": "8", "gpu_model": "H100" if env == "hpc" else "A100", "environment": env, "team": team}
    req = build_request(
        {**values, "project": "p"},
        svc.context.farm,
        requester=USER,
        channel=None,
        request_id=f"req-{len(incidents.records):08d}",
    )
    fields = req.to_fields(phase, svc.context.clock.now())
    if phase is not Phase.REQUESTED:
        fields[f.STATE] = State.STABLE.value if phase is Phase.ALLOCATED else State.ACTIVE.value
    return incidents.create(req.title(), fields).public_id


def test_queries_name_the_facets_they_narrow_by() -> None:
    assert live_query().text() == "state:(active OR stable)"
    assert live_query("hpc", "nlp").text() == 'state:(active OR stable) AND environment:("hpc") AND team:("nlp")'
    phases = live_query("hpc", phases={Phase.WAITING, Phase.APPROVED}).text()
    assert phases == 'state:(active OR stable) AND environment:("hpc") AND phase:("approved" OR "waiting")'
    assert live_query("hpc", "nlp").text(facets=False) == "state:(active OR stable)"
    assert host_filter() == "gpufarm:managed"
    assert host_filter("onprem-hpc") == "gpufarm:managed environment:onprem-hpc"
    assert host_filter(ir=12) == "gpufarm:managed ir:ir-12"


def test_a_narrower_scope_is_answered_from_a_wider_one_read_before(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    hpc = _lease(svc, incidents, phase=Phase.ALLOCATED)
    _lease(svc, incidents, env="cloud", phase=Phase.WAITING)
    _lease(svc, incidents, team="vision", phase=Phase.WAITING)
    reads = Reads(incidents, hosts)
    assert [a.environment for a in reads.live()] == ["hpc", "cloud", "hpc"]
    assert [a.ir for a in reads.live("hpc", "nlp")] == [hpc]
    assert [a.team for a in reads.live("hpc", phases={Phase.WAITING})] == ["vision"]
    assert len(incidents.searches) == 1
    # A narrow scope read first does not answer a wider one.
    narrow = Reads(incidents, hosts)
    narrow.live("hpc", "nlp")
    narrow.live("hpc")
    assert incidents.searches[1:] == [live_query("hpc", "nlp"), live_query("hpc")]


def test_a_backend_that_ignores_facets_gives_the_same_answers(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    hpc = _lease(svc, incidents, phase=Phase.ALLOCATED)
    _lease(svc, incidents, env="cloud", phase=Phase.ALLOCATED)
    resolved = _lease(svc, incidents, phase=Phase.ALLOCATED)
    incidents.update(incidents.by_ir(resolved).id, {f.STATE: State.RESOLVED.value, f.PHASE: Phase.RECLAIMED.value})
    every = list(incidents.records.values())
    monkeypatch.setattr(incidents, "search", lambda query: iter(every))
    assert [a.ir for a in Reads(incidents, hosts).live("hpc", "nlp")] == [hpc]


def test_writes_update_every_scope_read_so_far(svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts) -> None:
    ir = _lease(svc, incidents, phase=Phase.APPROVED)
    reads = Reads(incidents, hosts)
    assert [a.ir for a in reads.live("hpc", phases={Phase.APPROVED})] == [ir]
    assert [a.ir for a in reads.live("hpc")] == [ir]
    record = incidents.update(incidents.by_ir(ir).id, {f.STATE: "stable", f.PHASE: Phase.ALLOCATED.value})
    reads.wrote(record)
    assert reads.live("hpc", phases={Phase.APPROVED}) == []
    assert [a.phase for a in reads.live("hpc")] == [Phase.ALLOCATED]
    assert reads.get(ir).phase is Phase.ALLOCATED
    gone = incidents.update(record.id, {f.STATE: State.RESOLVED.value, f.PHASE: Phase.RECLAIMED.value})
    reads.wrote(gone)
    assert reads.live("hpc") == []
    assert len(incidents.searches) == 2


def test_host_lists_are_per_pool_and_a_write_updates_the_listed_tags(
    hosts: CountingHosts, incidents: FakeIncidents
) -> None:
    reads = Reads(incidents, hosts)
    assert [h.name for h in reads.inventory("hpc")] == [f"hpc-{i}" for i in range(6)]
    assert reads.listed_user_tags("hpc-0") is not None and "ir:ir-7" not in (reads.listed_user_tags("hpc-0") or [])
    reads.tagged("hpc-0", [*hosts.user("hpc-0"), "ir:ir-7"])
    assert "ir:ir-7" in (reads.listed_user_tags("hpc-0") or [])
    assert [h.name for h in reads.tagged_with(7, "hpc")] == ["hpc-0"]
    assert hosts.lists == [host_filter("hpc")]
    # Everything listed first: a pool is cut from it.
    wide = Reads(incidents, hosts)
    wide.inventory()
    assert [h.name for h in wide.inventory("cloud")] == ["cloud-1"]
    assert hosts.lists[1:] == [host_filter()]


def test_capacity_lists_no_further_than_the_ask_unless_it_refuses(
    hosts: CountingHosts, incidents: FakeIncidents
) -> None:
    assert Reads(incidents, hosts).capacity("hpc", "H100", 16) == 16
    assert hosts.listed == 2
    assert Reads(incidents, hosts).capacity("hpc", "H100", 100) == 48  # the whole pool, to say how big it is
    assert hosts.listed == 2 + 6


def test_one_invocation_reads_its_pool_once_across_its_steps(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    for _ in range(2):
        _lease(svc, incidents, env="cloud", phase=Phase.ALLOCATED)
    ir = _lease(svc, incidents, phase=Phase.APPROVED)
    with svc.context.reading():
        svc.process(incidents.by_ir(ir).id)
        svc.allocate_waiting("hpc")
        svc.status(ir, USER)
    assert incidents.searches == [
        live_query("hpc", phases={Phase.WAITING}),
        # Whether the pool has reservations the lease's term would run into (gpufarm.core.calendar): none here.
        live_query("hpc", phases={Phase.RESERVED}),
        live_query("hpc", phases={Phase.APPROVED, Phase.WAITING}),
    ]
    assert hosts.lists == [host_filter("hpc")]
    # The chosen host was read again before its write and once more after it (dedicated pools verify).
    assert hosts.gets == ["hpc-0", "hpc-0"]


def _holding(svc: GpuFarm, incidents: FakeIncidents, host: str) -> int:
    ir = _lease(svc, incidents, phase=Phase.APPROVED)
    svc.process(incidents.by_ir(ir).id)
    assert incidents.by_ir(ir).fields[f.HOSTS] == [host]
    return ir


def test_a_repair_with_nothing_to_fix_reads_no_host_by_itself_and_writes_nothing(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    _holding(svc, incidents, "hpc-0")
    hosts.gets.clear()
    writes = hosts.writes
    repair = svc.reconcile_pool("hpc")
    assert (repair.removed, repair.restored, repair.conflicts) == ([], [], [])
    assert hosts.gets == [] and hosts.writes == writes


def test_a_repair_reads_and_writes_only_the_drifted_hosts(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    ir = _holding(svc, incidents, "hpc-0")
    hosts.replace_tags("hpc-0", [t for t in hosts.user("hpc-0") if not t.startswith(("ir:", "team:", "project:"))])
    hosts.replace_tags("hpc-3", [*hosts.user("hpc-3"), "ir:ir-999", "team:ghost"])
    hosts.gets.clear()
    writes = hosts.writes
    repair = svc.reconcile_pool("hpc")
    assert sorted(hosts.gets) == ["hpc-0", "hpc-3"]
    assert hosts.writes == writes + 2
    assert f"ir:ir-{ir}" in hosts.user("hpc-0") and "ir:ir-999" not in hosts.user("hpc-3")
    assert repair.removed == ["hpc-3:ir:ir-999", "hpc-3:team:ghost"]


def test_shards_split_a_pool_by_a_stable_hash_and_together_cover_it(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    names = [f"host-{i:04d}" for i in range(1000)]
    shards = [repair.shard_of(n, 4) for n in names]
    assert shards == [repair.shard_of(n, 4) for n in names]  # stable
    assert all(150 < shards.count(s) < 350 for s in range(4))
    assert repair.shards_for(0) == 1
    assert repair.shards_for(repair.SHARD_HOSTS) == 1
    assert repair.shards_for(repair.SHARD_HOSTS + 1) == 2
    for i in range(6):
        hosts.replace_tags(f"hpc-{i}", [*hosts.user(f"hpc-{i}"), "ir:ir-999"])
    removed: list[str] = []
    for shard in range(3):
        removed += svc.reconcile_pool("hpc", shard, 3).removed
    assert sorted(removed) == sorted(f"hpc-{i}:ir:ir-999" for i in range(6))


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        ({"pool": "hpc", "reason": "sync"}, True),
        ({"pool": "hpc", "shard": 2, "shards": 3}, True),
        ({"pool": "hpc", "shard": 3, "shards": 3}, False),
        ({"pool": "hpc", "shard": -1, "shards": 3}, False),
        ({"pool": "hpc", "shards": 10_000}, False),
        ({"incident_id": "0b6b3c1e-0000-4000-8000-000000000000", "shards": 2}, False),
    ],
)
def test_queue_messages_name_one_shard_of_a_pool(body: dict[str, object], ok: bool) -> None:
    from pydantic import ValidationError

    if ok:
        QueueMessage.model_validate(body)
    else:
        with pytest.raises(ValidationError):
            QueueMessage.model_validate(body)


def test_a_write_wins_over_a_search_whose_index_does_not_show_it_yet(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    ir = _lease(svc, incidents, phase=Phase.APPROVED)
    before = list(incidents.records.values())
    reads = Reads(incidents, hosts)
    reads.wrote(incidents.update(incidents.by_ir(ir).id, {f.STATE: "stable", f.PHASE: Phase.ALLOCATED.value}))
    monkeypatch.setattr(incidents, "search", lambda query: iter(before))
    assert [a.phase for a in reads.live("hpc")] == [Phase.ALLOCATED]
    assert reads.live("hpc", phases={Phase.APPROVED}) == []
    assert reads.get(ir).phase is Phase.ALLOCATED


def test_a_users_list_reads_only_their_leases_through_the_requester_facet(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    other = "U0000000002"
    for _ in range(5):
        _lease(svc, incidents, phase=Phase.ALLOCATED)
    theirs = _lease(svc, incidents, env="cloud", phase=Phase.WAITING)
    incidents.update(incidents.by_ir(theirs).id, {f.REQUESTER: other})
    before = len(incidents.searches)
    message = svc.list_allocations("mine", other)
    # And the waiting lease's queue, for its position: the pool's waiting requests only.
    queue = live_query("cloud", phases={Phase.APPROVED, Phase.WAITING})
    assert incidents.searches[before:] == [live_query(requester=other), queue]
    assert live_query(requester=other).text() == f'state:(active OR stable) AND requester:("{other}")'
    assert f"IR-{theirs}" in message.text
    assert all(f"IR-{ir}" not in message.text for ir in range(1, theirs))
    # A team's list reads that team only: the teams come from the user's own leases.
    before = len(incidents.searches)
    svc.list_allocations("team", other)
    assert incidents.searches[before:] == [live_query(requester=other), live_query(team="nlp"), queue]


# -- a pool's host sizes (charging) -------------------------------------------------------------------------------


def _big_pool(hosts: FakeHosts, n: int = 450, *, rare: str | None = None) -> dict[tuple[str, int], int]:
    """n H100 hosts of pool `big` over two clusters and two sizes, names sorted by cluster; the expected sizes."""
    want: dict[tuple[str, int], int] = {}
    for i in range(n):
        cluster, gpus = ("a", 8) if i < n // 2 else ("b", 4 if i % 3 else 8)
        hosts.seed(f"big-{cluster}-{i:04d}", "H100", gpus, "big", cluster)
        want[(cluster, gpus)] = want.get((cluster, gpus), 0) + 1
    if rare is not None:
        hosts.seed(rare, "H100", 16, "big", "a")
        want[("a", 16)] = want.get(("a", 16), 0) + 1
    return want


def test_a_pools_host_sizes_are_counted_from_samples_not_listed(incidents: FakeIncidents) -> None:
    hosts = CountingHosts()
    want = _big_pool(hosts)
    reads = Reads(incidents, hosts)
    assert reads.host_sizes("big", "h100") == want
    assert hosts.lists == []  # never the pool's every page
    pool = host_filter("big", gpu_model="H100")
    assert pool == "gpufarm:managed environment:big gpu_model:h100"
    # The first sample shows cluster a only (names follow clusters); a probe further on finds cluster b's sizes.
    samples = [p for p in hosts.pages if p[0] == pool]
    counts = sorted(p[0].removeprefix(pool + " ") for p in hosts.pages if p[0] != pool)
    assert samples[0] == (pool, 0, CENSUS_SAMPLE) and len(samples) == 3
    assert counts == ["cluster:a gpu_count:8", "cluster:b gpu_count:4", "cluster:b gpu_count:8"]
    assert all(count == 1 for text, _, count in hosts.pages if text != pool)
    # Read once per invocation; the capacity check is answered from it, exactly.
    before = len(hosts.pages)
    assert reads.host_sizes("big", "H100") == want and len(hosts.pages) == before
    assert reads.capacity("big", "H100", 1) == sum(gpus * n for (_, gpus), n in want.items())
    assert hosts.lists == [] and len(hosts.pages) == before


def _listed_sizes(hosts: FakeHosts, env: str, model: str) -> dict[tuple[str, int], int]:
    """The sizes as the pool listed whole gives them (the reference every census must equal)."""
    listed = (GpuHost.from_tags(i.name, i.tags) for i in FakeHosts.list_hosts(hosts, host_filter(env)))
    return charging.sizes_of(h for h in listed if h is not None and h.environment == env and h.gpu_model == model)


def test_a_size_no_sample_shows_has_the_pool_listed_whole(incidents: FakeIncidents) -> None:
    hosts = CountingHosts()
    # One 16-GPU host among 451, named between two sample pages: the counts fall one short of the pool's total.
    want = _big_pool(hosts, rare="big-a-0104x")
    assert Reads(incidents, hosts).host_sizes("big", "H100") == want == _listed_sizes(hosts, "big", "H100")
    assert hosts.lists == [host_filter("big")]
    assert len([p for p in hosts.pages if p[0] == host_filter("big", gpu_model="H100")]) == 4


@pytest.mark.parametrize(
    "odd",
    [
        ["gpufarm:managed", "gpu_model:h100", "gpu_count:8", "environment:big"],  # no cluster: "default"
        ["gpufarm:managed", "gpu_model:h100", "gpu_count:8", "environment:big", "cluster:a", "cluster:b"],
        ["gpufarm:managed", "gpu_model:h100", "gpu_count:eight", "environment:big", "cluster:a"],
    ],
)
def test_a_sampled_host_the_counts_cannot_tell_apart_has_the_pool_listed(
    incidents: FakeIncidents, odd: list[str]
) -> None:
    hosts = CountingHosts()
    _big_pool(hosts)
    hosts.tags["big-a-0000a"] = {"datadog": odd}  # in the first sample
    assert Reads(incidents, hosts).host_sizes("big", "H100") == _listed_sizes(hosts, "big", "H100")
    assert hosts.lists == [host_filter("big")] and len(hosts.pages) == 1


def test_without_exact_counts_or_pages_the_pool_is_listed(incidents: FakeIncidents) -> None:
    approximate = ApproximateHosts()
    want = _big_pool(approximate)
    assert Reads(incidents, approximate).host_sizes("big", "H100") == want
    assert approximate.lists == [host_filter("big")] and len(approximate.pages) == 1
    plain = ListOnlyHosts()
    want = _big_pool(plain)
    assert Reads(incidents, plain).host_sizes("big", "H100") == want


def test_a_small_pool_is_sized_from_its_one_sample_and_a_listing_already_read_costs_nothing(
    incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    reads = Reads(incidents, hosts)
    assert reads.host_sizes("hpc", "H100") == {("a", 8): 6}
    assert hosts.pages == [(host_filter("hpc", gpu_model="H100"), 0, CENSUS_SAMPLE)]
    assert reads.host_sizes("hpc", "A100") == {}
    listing = Reads(incidents, hosts)
    listing.inventory("cloud")
    hosts.pages.clear()
    assert listing.host_sizes("cloud", "A100") == {("use1", 8): 1} and hosts.pages == []


def test_a_requests_decision_on_a_large_pool_lists_none_of_it(svc: GpuFarm, hosts: CountingHosts) -> None:
    # 300 4-GPU hosts in cluster b beside the six 8-GPU hosts of cluster a: 6 GPUs take one 8-GPU host.
    for i in range(300):
        hosts.seed(f"hpc-b-{i:03d}", "H100", 4, "hpc", "b")
    req = build_request(
        {"gpu_count": "6", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"},
        svc.context.farm,
        requester=USER,
        channel=None,
        request_id="req-hpc-00000001",
    )
    decision = svc.precheck(req)
    assert "within team nlp's quota (8 of 8 H100 in hpc)" in decision.reason
    assert hosts.lists == [] and hosts.listed == 0
    # One sample (it shows both clusters) and one count per (cluster, size).
    assert len(hosts.pages) == 3


def test_a_scope_read_fresh_sees_what_was_created_since_and_answers_the_scopes_inside_it(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    first = _lease(svc, incidents, phase=Phase.ALLOCATED)
    reads = Reads(incidents, hosts)
    assert [a.ir for a in reads.live("hpc", "nlp")] == [first]
    created = _lease(svc, incidents, phase=Phase.REQUESTED)
    other = _lease(svc, incidents, team="vision", phase=Phase.WAITING)
    assert [a.ir for a in reads.live("hpc", "nlp")] == [first]  # read before the create: kept for the invocation
    assert [a.ir for a in reads.fresh("hpc")] == [first, created, other]
    # The team in the pool, and the pool's waiting requests, are answered from the fresh read, not the older one.
    assert [a.ir for a in reads.live("hpc", "nlp")] == [first, created]
    assert [a.ir for a in reads.live("hpc", phases={Phase.WAITING})] == [other]
    assert incidents.searches == [live_query("hpc", "nlp"), live_query("hpc")]


def test_a_teams_leases_in_its_quota_pools_come_from_the_pools_read_and_one_search_for_the_rest(
    svc: GpuFarm, incidents: FakeIncidents, hosts: CountingHosts
) -> None:
    hpc = _lease(svc, incidents, phase=Phase.ALLOCATED)
    cloud = _lease(svc, incidents, env="cloud", phase=Phase.ALLOCATED)
    _lease(svc, incidents, env="cloud", team="vision", phase=Phase.ALLOCATED)
    reads = Reads(incidents, hosts)
    reads.live("hpc")
    assert reads.holds_scope("hpc") and reads.holds_scope("hpc", "nlp") and not reads.holds_scope("cloud", "nlp")
    assert [a.ir for a in reads.live_in_pools("nlp", ["hpc", "cloud", "slices"])] == [hpc, cloud]
    rest = incidents.searches[1]
    assert len(incidents.searches) == 2 and dict(rest.fields) == {"environment": ("cloud", "slices"), "team": ("nlp",)}
    # Each pool's team scope is kept: asked again, nothing more is read.
    assert [a.ir for a in reads.live("cloud", "nlp")] == [cloud]
    assert reads.live_in_pools("nlp", ["cloud", "hpc"]) == [reads.get(hpc), reads.get(cloud)]
    assert len(incidents.searches) == 2


def test_a_context_writing_through_a_commands_record_shares_the_invocations_reads(
    svc: GpuFarm, incidents: FakeIncidents
) -> None:
    ir = _lease(svc, incidents, phase=Phase.ALLOCATED)
    ctx = svc.context
    recorded = ctx.with_incidents(FakeIncidents(FakeClock()))
    with ctx.reading() as outer:
        assert [a.ir for a in outer.live("hpc")] == [ir]
        joined = recorded.reads()
        # The record's own store is read through, what the invocation read is shared both ways.
        assert joined.incidents is recorded.incidents and joined is not outer
        assert [a.ir for a in joined.live("hpc", "nlp")] == [ir]
        joined.live("cloud")
        assert outer.holds_scope("cloud")
    assert len(incidents.searches) == 1
