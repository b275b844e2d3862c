"""The lifecycle use cases against in-memory ports: request, decide, allocate, release, reclaim, converge."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics, FakeQueue

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import Conflict, NotAllowed, NotFound, ValidationFailed
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, GpuRequest
from gpufarm.core.kernel.ports import HostInfo
from gpufarm.core.service import GpuFarm

USER = "U0000000001"
OTHER = "U0000000002"
OPS = "U0000000OPS"
OPS_CHANNEL = "C0000000001"
_ids = itertools.count(1)


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    hosts: FakeHosts
    chat: FakeChat
    clock: FakeClock
    metrics: FakeMetrics

    def request(self, user: str = USER, **values: str) -> GpuRequest:
        base = {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "llm-ko"}
        base.update(values)
        return build_request(
            base, self.svc.context.farm, requester=user, channel="C0000000002", request_id=f"req-{next(_ids):08d}"
        )

    def approved(self, **values: str) -> int:
        """An incident already approved (bypassing quotas), for placement tests."""
        req = self.request(**values)
        fields = req.to_fields(Phase.APPROVED, self.clock.now())
        return self.incidents.create(req.title(), {**fields, f.APPROVED_BY: OPS}).public_id

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def process(self, ir: int) -> list[str]:
        return [o.action for o in self.svc.process(self.incidents.by_ir(ir).id)]

    def ir_tags(self, host: str) -> list[str]:
        return [t for t in self.hosts.user(host) if t.startswith("ir:")]


@pytest.fixture
def world() -> World:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for name, cluster in (("hpc-1", "a"), ("hpc-2", "a"), ("hpc-3", "b"), ("hpc-4", "b")):
        hosts.seed(name, "H100", 8, "hpc", cluster)
    hosts.seed("cloud-1", "A100", 8, "cloud", "use1")
    hosts.seed("slice-1", "A100", 8, "slices", "k8s")
    hosts.seed("slice-2", "A100", 4, "slices", "k8s")
    chat = FakeChat(operators=frozenset({OPS}))
    metrics = FakeMetrics()
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FARM_YAML), metrics=metrics)
    return World(svc, incidents, hosts, chat, clock, metrics)


# -- request ---------------------------------------------------------------------------------------------------


def test_within_quota_is_created_approved_by_policy(world: World) -> None:
    answer = world.svc.submit_request(world.request())
    a = world.alloc(1)
    assert (a.phase, a.state, a.approved_by) == (Phase.APPROVED, State.ACTIVE, "policy")
    assert (a.team, a.project, a.gpu_model, a.gpu_count, a.environment, a.requester) == (
        "nlp",
        "llm-ko",
        "H100",
        8,
        "hpc",
        USER,
    )
    assert "IR-1" in answer.text and "Approved by policy" in answer.text
    # The operators' channel hears about it, without buttons to press.
    [fyi] = world.chat.to(OPS_CHANNEL, "post")
    assert "policy" in fyi.text and not any(b["type"] == "actions" for b in fyi.blocks)


def test_beyond_quota_asks_operators_with_buttons(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    answer = world.svc.submit_request(world.request(gpu_count="4"))
    a = world.alloc(2)
    assert a.phase is Phase.REQUESTED and a.approved_by is None
    assert "operators" in answer.text
    ask = world.chat.to(OPS_CHANNEL, "post")[-1]
    [row] = [b for b in ask.blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in row["elements"]] == ["gpu_approve", "gpu_reject"]
    assert {e["value"] for e in row["elements"]} == {"IR-2"}
    assert a.slack_message == f"{OPS_CHANNEL}/{ask.ts}"


def test_over_hard_limit_is_refused_and_creates_nothing(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    answer = world.svc.submit_request(world.request(gpu_count="16", environment="hpc"))
    assert "refused" in answer.text and "hard limit of 16" in answer.text
    assert world.incidents.creates == 1


def test_more_than_the_pool_is_refused(world: World) -> None:
    answer = world.svc.submit_request(world.request(gpu_model="A100", environment="cloud", gpu_count="9"))
    assert "only 8 A100" in answer.text
    assert world.incidents.creates == 0


def test_duplicate_request_creates_one_incident(world: World) -> None:
    req = world.request()
    first = world.svc.submit_request(req)
    second = world.svc.submit_request(req)
    assert world.incidents.creates == 1
    assert "IR-1" in first.text and "IR-1" in second.text


def test_retried_request_asks_operators_if_the_first_attempt_died_before(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    req = world.request(gpu_count="4")
    world.incidents.create(req.title(), req.to_fields(Phase.REQUESTED, world.clock.now()))
    world.svc.submit_request(req)
    assert world.alloc(2).slack_message
    assert world.incidents.creates == 2


# -- approve / reject ------------------------------------------------------------------------------------------


def _pending(world: World) -> int:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.svc.submit_request(world.request(gpu_count="4", user=OTHER))
    return 2


def test_operator_approves(world: World) -> None:
    ir = _pending(world)
    world.svc.approve(ir, OPS)
    a = world.alloc(ir)
    assert (a.phase, a.approved_by) == (Phase.APPROVED, OPS)
    assert any("approved by <@U0000000OPS>" in s.text for s in world.chat.to(OTHER, "dm"))
    assert world.chat.to(OPS_CHANNEL, "update")[-1].text.endswith(f"Approved by <@{OPS}>")


def test_non_operator_cannot_approve_and_nothing_changes(world: World) -> None:
    ir = _pending(world)
    updates = len(world.incidents.updates)
    with pytest.raises(NotAllowed, match="only GPU operators"):
        world.svc.approve(ir, OTHER)
    assert world.alloc(ir).phase is Phase.REQUESTED
    assert len(world.incidents.updates) == updates


def test_second_approval_is_a_clear_conflict(world: World) -> None:
    ir = _pending(world)
    world.svc.approve(ir, OPS)
    with pytest.raises(Conflict, match="already approved"):
        world.svc.approve(ir, OPS)


def test_operator_rejects(world: World) -> None:
    ir = _pending(world)
    world.svc.reject(ir, OPS, "budget")
    a = world.alloc(ir)
    assert (a.phase, a.state) == (Phase.REJECTED, State.RESOLVED)
    assert "budget" in world.chat.to(OTHER, "dm")[-1].text
    # The resolved webhook that follows changes nothing.
    assert world.process(ir) == ["nothing to do (rejected)"]


def test_unknown_ir(world: World) -> None:
    with pytest.raises(NotFound, match="IR-99"):
        world.svc.status(99, USER)
    with pytest.raises(NotFound):
        world.svc.approve(99, OPS)


# -- allocate ----------------------------------------------------------------------------------------------------


def test_allocate_tags_whole_hosts_and_writes_the_incident(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    assert world.process(1) == ["allocated"]
    a = world.alloc(1)
    assert (a.phase, a.state) == (Phase.ALLOCATED, State.STABLE)
    assert a.hosts == ("hpc-1",) and a.host_gpus == {"hpc-1": 8}
    assert world.hosts.user("hpc-1") == ["ir:ir-1", "project:llm-ko", "team:nlp"]
    dm = world.chat.to(USER, "dm")[-1]
    assert "hpc-1" in dm.text and "GPUFARM_IR=IR-1" in dm.text
    # Expiry runs from the allocation.
    assert a.expires_at == world.clock.now() + timedelta(days=7)


def test_duplicate_and_late_webhooks_change_nothing_twice(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    writes, updates, dms = world.hosts.writes, len(world.incidents.updates), len(world.chat.sent)
    assert world.process(1) == ["nothing to do (allocated)"]
    assert world.process(1) == ["nothing to do (allocated)"]
    assert (world.hosts.writes, len(world.incidents.updates), len(world.chat.sent)) == (writes, updates, dms)


def test_full_pool_waits_and_allocates_when_capacity_frees(world: World) -> None:
    for name in ("hpc-3", "hpc-4"):
        world.hosts.tags.pop(name)
    world.svc.submit_request(world.request(gpu_count="8"))
    world.svc.submit_request(world.request(gpu_count="8", team="vision", user=OTHER))
    world.svc.approve(2, OPS)
    assert world.process(1) == ["allocated"]
    assert world.process(2) == ["allocated"]
    # Both hosts are held; the next approved request waits and is told so.
    world.svc.submit_request(world.request(gpu_count="8", user=OTHER))
    world.svc.approve(3, OPS)
    assert world.process(3) == ["waiting"]
    assert world.alloc(3).phase is Phase.WAITING
    assert "no room" in world.chat.to(OTHER, "dm")[-1].text
    assert world.process(3) == ["waiting (still)"]
    # Release one: the reclaim frees a host and the waiting request gets it.
    world.svc.release(1, USER)
    assert world.process(1) == ["reclaimed", "allocated"]
    assert world.alloc(3).hosts == ("hpc-1",)
    assert world.ir_tags("hpc-1") == ["ir:ir-3"]


def test_newer_request_does_not_overtake_a_waiting_one(world: World) -> None:
    world.hosts.tags = {k: v for k, v in world.hosts.tags.items() if k in ("hpc-1",)}
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    world.svc.submit_request(world.request(gpu_count="8", team="vision", user=OTHER))
    world.svc.approve(2, OPS)
    world.process(2)
    world.svc.submit_request(world.request(gpu_count="4", user=OTHER))
    world.svc.approve(3, OPS)
    assert world.process(3) == ["waiting"]
    world.svc.release(1, USER)
    # IR-2 (older, 8 GPUs) takes the freed host; IR-3 keeps waiting behind it.
    assert world.process(1) == ["reclaimed", "allocated", "waiting (still)"]
    assert world.alloc(2).hosts == ("hpc-1",)


def test_shared_pool_hands_out_units_without_host_exclusivity(world: World) -> None:
    world.svc.submit_request(world.request(gpu_model="A100", environment="slices", gpu_count="3"))
    world.svc.submit_request(world.request(gpu_model="A100", environment="slices", gpu_count="1", user=OTHER))
    world.process(1)
    world.process(2)
    assert world.alloc(1).host_gpus == {"slice-2": 3}
    assert world.alloc(2).host_gpus == {"slice-2": 1}
    assert world.ir_tags("slice-2") == ["ir:ir-1", "ir:ir-2"]
    # slice-2 is full now: the next request goes to slice-1.
    world.svc.submit_request(world.request(gpu_model="A100", environment="slices", gpu_count="2", user=OTHER))
    world.svc.approve(3, OPS)
    world.process(3)
    assert world.alloc(3).host_gpus == {"slice-1": 2}


def test_reclaim_keeps_project_tags_another_ir_still_uses(world: World) -> None:
    world.svc.submit_request(world.request(gpu_model="A100", environment="slices", gpu_count="2"))
    world.svc.submit_request(world.request(gpu_model="A100", environment="slices", gpu_count="2", user=OTHER))
    world.process(1)
    world.process(2)
    assert world.alloc(1).hosts == world.alloc(2).hosts == ("slice-2",)
    world.svc.release(1, USER)
    world.process(1)
    assert world.hosts.user("slice-2") == ["project:llm-ko", "team:nlp", "ir:ir-2"]
    world.svc.release(2, OTHER)
    world.process(2)
    assert world.hosts.user("slice-2") == []


def test_allocation_skips_a_host_someone_tagged_meanwhile(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    original = world.hosts.list_hosts

    def stale_listing(filter_text: str | None = None) -> Iterator[HostInfo]:
        # The listing predates another writer taking hpc-1; only the fresh read of its user tags shows it.
        listing = list(original(filter_text))
        world.hosts.tags["hpc-1"]["user"] = ["ir:ir-77"]
        world.hosts.list_hosts = original  # type: ignore[method-assign]
        yield from listing

    world.hosts.list_hosts = stale_listing  # type: ignore[method-assign]
    assert world.process(1) == ["allocated"]
    assert world.alloc(1).hosts == ("hpc-2",)
    assert world.ir_tags("hpc-1") == ["ir:ir-77"]


def test_a_retried_partial_allocation_converges_on_the_same_hosts(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="16"))
    world.svc.approve(1, OPS)
    # An earlier attempt tagged hpc-3, then its incident update failed: the retry reuses hpc-3.
    world.hosts.tags["hpc-3"]["user"] = ["ir:ir-1", "project:llm-ko", "team:nlp"]
    assert world.process(1) == ["allocated"]
    assert world.alloc(1).hosts == ("hpc-3", "hpc-4")
    assert [h for h in ("hpc-1", "hpc-2", "hpc-3", "hpc-4") if world.ir_tags(h)] == ["hpc-3", "hpc-4"]


def test_stray_tags_of_an_earlier_attempt_are_removed(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="16"))
    world.svc.approve(1, OPS)
    # Tags on one host of each cluster: the retry picks one cluster and untags the other host.
    for name in ("hpc-1", "hpc-3"):
        world.hosts.tags[name]["user"] = ["ir:ir-1", "project:llm-ko", "team:nlp"]
    assert world.process(1) == ["allocated"]
    held = world.alloc(1).hosts
    assert len(held) == 2
    assert sorted(h for h in ("hpc-1", "hpc-2", "hpc-3", "hpc-4") if world.ir_tags(h)) == list(held)


def test_partial_tags_are_removed_when_the_retry_must_wait(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="16"))
    world.svc.approve(1, OPS)
    world.hosts.tags["hpc-1"]["user"] = ["ir:ir-1", "project:llm-ko", "team:nlp"]
    for name in ("hpc-2", "hpc-3", "hpc-4"):
        world.hosts.tags[name]["user"] = ["ir:ir-50"]
    assert world.process(1) == ["waiting"]
    assert world.hosts.user("hpc-1") == []


def test_no_host_in_two_incidents_across_many_approvals(world: World) -> None:
    for i in range(7):
        world.approved(gpu_count="4", user=OTHER, project=f"p{i}")
    for ir in [3, 1, 1, 7, 2, 5, 4, 6, 3, 7]:
        world.process(ir)
    holders = {h: world.ir_tags(h) for h in ("hpc-1", "hpc-2", "hpc-3", "hpc-4")}
    assert all(len(v) == 1 for v in holders.values())
    assert sorted(a.phase.value for a in map(world.alloc, range(1, 8))).count("allocated") == 4


# -- release / extend / status / list / quota ------------------------------------------------------------------


def test_release_resolves_then_the_webhook_reclaims(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    answer = world.svc.release(1, USER)
    a = world.alloc(1)
    assert (a.state, a.phase, a.reclaim_reason) == (State.RESOLVED, Phase.RECLAIMING, ReclaimReason.RELEASED)
    assert "being released" in answer.text
    assert world.process(1) == ["reclaimed"]
    a = world.alloc(1)
    assert (a.phase, a.hosts, a.host_gpus) == (Phase.RECLAIMED, (), {})
    assert world.hosts.user("hpc-1") == []
    assert "reclaimed" in world.chat.to(USER, "dm")[-1].text
    assert "reclaimed" in world.chat.to(OPS_CHANNEL, "post")[-1].text
    # Late duplicates change nothing, and a second release is a clear conflict.
    assert world.process(1) == ["nothing to do (reclaimed)"]
    with pytest.raises(Conflict, match="already ended"):
        world.svc.release(1, USER)


def test_only_requester_or_operator_releases(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    with pytest.raises(NotAllowed):
        world.svc.release(1, OTHER)
    world.svc.release(1, OPS)
    assert world.alloc(1).reclaim_reason is ReclaimReason.OPERATOR


def test_resolved_in_datadog_ui_reclaims_too(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    world.incidents.update(world.alloc(1).incident_id, {f.STATE: "resolved"})
    assert world.process(1) == ["reclaimed"]
    assert world.alloc(1).reclaim_reason is ReclaimReason.RESOLVED_IN_DATADOG
    assert world.hosts.user("hpc-1") == []


def test_cancelling_a_pending_request_updates_the_operators_message(world: World) -> None:
    ir = _pending(world)
    world.svc.release(ir, OTHER)
    assert world.alloc(ir).reclaim_reason is ReclaimReason.CANCELLED
    assert "Cancelled" in world.chat.to(OPS_CHANNEL, "update")[-1].text


def test_extend_within_max_days(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8", duration_days="20"))
    world.process(1)
    before = world.alloc(1).expires_at
    assert before is not None
    world.svc.extend(1, USER, 5)
    after = world.alloc(1)
    assert after.duration_days == 25 and (after.expires_at - before).days == 5  # type: ignore[operator]
    with pytest.raises(ValidationFailed, match="limit of 30"):
        world.svc.extend(1, USER, 10)
    with pytest.raises(NotAllowed):
        world.svc.extend(1, OTHER, 1)


def test_status_list_and_quota(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    world.svc.submit_request(world.request(gpu_model="A100", environment="slices", gpu_count="2", user=OTHER))
    world.process(2)
    assert "hpc-1" in world.svc.status(1, USER).text
    assert "IR-1" in world.svc.list_allocations("mine", USER).text
    assert "IR-2" not in world.svc.list_allocations("mine", USER).text
    assert "IR-2" in world.svc.list_allocations("all", USER).text
    assert "IR-1" in world.svc.list_allocations("team", USER).text
    with pytest.raises(ValidationFailed):
        world.svc.list_allocations("team", "U0000000077")
    with pytest.raises(ValidationFailed, match="unknown team"):
        world.svc.list_allocations("team", USER, "nobody")
    text = world.svc.quota("nlp").blocks[0]["text"]["text"]
    assert "`nlp` H100 in `hpc`: 8 / 8" in text
    assert "`hpc` H100: 24 / 32" in text
    assert "`slices` A100: 10 / 12" in text


# -- idle --------------------------------------------------------------------------------------------------------


def test_idle_warn_then_reclaim_after_grace(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    assert world.svc.idle_triggered(1).action == "warned"
    a = world.alloc(1)
    assert a.phase is Phase.IDLE_WARNED and a.idle_warned_at is not None
    warning = world.chat.to(USER, "dm")[-1]
    assert [e["action_id"] for e in warning.blocks[-1]["elements"]] == ["gpu_keep", "gpu_release"]
    # A renotify inside the grace period changes nothing.
    world.clock.advance(minutes=30)
    assert world.svc.idle_triggered(1).action == "nothing to do (idle-warned)"
    world.clock.advance(minutes=31)
    assert world.svc.idle_triggered(1).action == "resolved (idle)"
    assert world.alloc(1).reclaim_reason is ReclaimReason.IDLE
    assert world.process(1) == ["reclaimed"]


def test_idle_recovered_and_keep_clear_the_warning(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    world.svc.idle_triggered(1)
    assert world.svc.idle_recovered(1).action == "recovered"
    assert world.alloc(1).phase is Phase.ALLOCATED and world.alloc(1).idle_warned_at is None
    assert world.svc.idle_recovered(1).action == "nothing to do (allocated)"
    world.svc.idle_triggered(1)
    world.svc.keep(1, USER)
    assert world.alloc(1).phase is Phase.ALLOCATED


# -- sync --------------------------------------------------------------------------------------------------------


def test_sync_expires_repairs_drift_and_publishes_gauges(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8", duration_days="1"))
    world.process(1)
    world.svc.submit_request(world.request(gpu_count="8", user=OTHER, team="vision"))
    world.svc.approve(2, OPS)
    world.process(2)
    # Drift: a stray tag of a long-gone IR on hpc-4, and IR-2's tags wiped by hand from its host.
    world.hosts.tags["hpc-4"]["user"] = ["ir:ir-99", "project:ghost", "team:ghost", "owner:alice"]
    host2 = world.alloc(2).hosts[0]
    world.hosts.tags[host2]["user"] = []
    world.clock.advance(days=1, minutes=1)
    report = world.svc.sync()
    assert report.expired == [1]
    assert world.alloc(1).reclaim_reason is ReclaimReason.EXPIRED
    assert world.hosts.user("hpc-4") == ["owner:alice"]
    assert world.ir_tags(host2) == ["ir:ir-2"]
    assert world.metrics.value("gpufarm.quota.entitled", "team:nlp", "environment:hpc", "gpu_model:h100") == 8
    assert world.metrics.value("gpufarm.quota.allocated", "team:vision", "environment:hpc", "gpu_model:h100") == 8
    assert world.metrics.value("gpufarm.inventory.gpus.total", "environment:hpc", "gpu_model:h100") == 32
    # Expired IR-1 no longer holds its host (the sync's repair already untagged it) and hpc-4 lost its stray tag.
    assert world.metrics.value("gpufarm.inventory.gpus.free", "environment:hpc", "gpu_model:h100") == 24
    assert world.process(1) == ["reclaimed"]
    assert world.alloc(1).hosts == ()


def test_sync_queues_pool_repairs_when_a_queue_is_wired(world: World) -> None:
    queue = FakeQueue()
    world.svc.context.queue = queue
    world.svc.sync()
    world.svc.sync()
    assert sorted(g for g, _ in queue.sent) == ["cloud", "hpc", "slices"]
    assert all(body == {"pool": g, "reason": "sync"} for g, body in queue.sent)


def test_a_lost_dm_does_not_fail_the_step(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.chat.fail_dms = True
    assert world.process(1) == ["allocated"]
    assert world.alloc(1).phase is Phase.ALLOCATED


def test_concurrent_duplicates_of_one_request_leave_one_live_incident(world: World) -> None:
    # Both worker invocations miss each other's incident in the request_id check (they ran at the same time).
    world.incidents.find_by_request_id = lambda request_id: None  # type: ignore[method-assign]
    req = world.request(gpu_count="8")
    first = world.svc.submit_request(req)
    second = world.svc.submit_request(req)
    assert "IR-1" in first.text and "IR-1" in second.text
    assert (world.alloc(1).phase, world.alloc(2).phase) == (Phase.APPROVED, Phase.REJECTED)
    assert "duplicate of IR-1" in world.alloc(2).title
    assert len(world.chat.to(OPS_CHANNEL, "post")) == 1
    assert world.process(2) == ["nothing to do (rejected)"]


def test_a_double_claimed_dedicated_host_is_reported_not_shared(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    world.approved(gpu_count="8", user=OTHER, team="vision")
    world.process(2)
    # Corrupt state no serialized run produces: IR-2 claims IR-1's host and its own tag is gone.
    host1, host2 = world.alloc(1).hosts[0], world.alloc(2).hosts[0]
    world.incidents.update(world.alloc(2).incident_id, {f.HOSTS: [host1], f.HOST_GPUS: [f"{host1}=8"]})
    world.hosts.tags[host2]["user"] = [t for t in world.hosts.user(host2) if not t.startswith("ir:")]
    repair = world.svc.reconcile_pool("hpc")
    assert repair.conflicts == [f"{host1}: IR-2 and ir-1"]
    assert world.ir_tags(host1) == ["ir:ir-1"]
    assert "claimed by two allocations" in world.chat.to(OPS_CHANNEL, "post")[-1].text


def test_verify_after_write_backs_off_a_host_another_writer_took(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    original = world.hosts.replace_tags

    def racing_write(host: str, tags: list[str], source: str = "user") -> list[str]:
        out = original(host, tags, source)
        if host == "hpc-1" and "ir:ir-1" in tags:
            # Someone outside this pool's queue tags the same host right after us.
            original(host, [*world.hosts.user(host), "ir:ir-42"], source)
        return out

    world.hosts.replace_tags = racing_write  # type: ignore[method-assign]
    assert world.process(1) == ["allocated"]
    assert world.alloc(1).hosts == ("hpc-2",)
    assert world.ir_tags("hpc-1") == ["ir:ir-42"]


def test_operator_force_reclaim(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.process(1)
    with pytest.raises(NotAllowed):
        world.svc.force_reclaim(1, USER, "mine anyway")
    world.svc.force_reclaim(1, OPS, "maintenance window")
    assert world.alloc(1).reclaim_reason is ReclaimReason.OPERATOR
    assert world.process(1) == ["reclaimed"]
    assert world.alloc(1).hosts == () and world.ir_tags("hpc-1") == []


def test_an_approval_webhook_arriving_after_the_release_changes_nothing(world: World) -> None:
    world.svc.submit_request(world.request(gpu_count="8"))
    world.svc.release(1, USER)
    # The webhooks arrive late and out of order: "resolved" first, then the older "approved" one.
    assert world.process(1) == ["reclaimed"]
    assert world.process(1) == ["nothing to do (reclaimed)"]
    assert all(world.ir_tags(h) == [] for h in ("hpc-1", "hpc-2", "hpc-3", "hpc-4"))
    assert world.alloc(1).reclaim_reason is ReclaimReason.RELEASED
