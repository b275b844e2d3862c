"""Incident commands (docs/design.md, rule 7): queued per pool, run against the incident as it is then, answered."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeQueue
from pydantic import ValidationError

from gpufarm.adapters.slack import SlackError
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.commands import executor
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, GpuRequest
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import UNASSIGNED_GROUP, IncidentCommand, Op, pool_group
from gpufarm.core.service import GpuFarm

USER = "U0000000001"
OPS = "U0000000OPS"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
_ids = itertools.count(1)


@dataclass
class World:
    svc: GpuFarm
    incidents: FakeIncidents
    chat: FakeChat
    clock: FakeClock
    queue: FakeQueue

    def request(self, count: int = 8, team: str = "nlp") -> GpuRequest:
        values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": team, "project": "p"}
        return build_request(
            values, self.svc.context.farm, requester=USER, channel=None, request_id=f"r-{next(_ids):06d}"
        )

    def run(self) -> list[str]:
        """Be the pool's queue consumer: run every queued command in order (allocating what was approved)."""
        done = []
        while self.queue.sent:
            group, body = self.queue.sent.pop(0)
            command = IncidentCommand.model_validate(body["command"])
            pool = command.request.environment if command.request else self.alloc(command.incident).environment
            assert group == pool_group(pool)
            done.append(executor.execute(self.svc.context, command))
            for a in self.svc.context.live():
                if a.phase is Phase.APPROVED:
                    self.svc.allocate(a)
            for r in self.incidents.search(IncidentQuery.where({State.RESOLVED})):
                self.svc.process(r.id)
        return done

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def answers(self) -> list[str]:
        return [s.text for s in self.chat.to(URL)]


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    for i in range(4):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    queue = FakeQueue()
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FARM_YAML), queue=queue)
    yield World(svc, incidents, chat, clock, queue)


def command(op: Op, ir: int, actor: str | None = USER, **extra: Any) -> IncidentCommand:
    return IncidentCommand.model_validate({"op": op, "ir": ir, "actor": actor, "response_url": URL, **extra})


def allocated(world: World) -> int:
    assert executor.request(world.svc.context, world.request(), response_url=URL, origin="o") is None
    world.run()
    [ir] = [a.ir for a in world.svc.context.live()]
    assert world.alloc(ir).phase is Phase.ALLOCATED
    return ir


def test_dedup_ids_collapse_retries_only() -> None:
    one = command(Op.RELEASE, 5)
    assert one.dedup_id() == command(Op.RELEASE, 5).dedup_id()
    assert one.dedup_id() != command(Op.RELEASE, 5, response_url=URL + "x").dedup_id()
    assert one.dedup_id() != command(Op.EXTEND, 5).dedup_id()
    assert len(one.dedup_id()) <= 128
    with pytest.raises(ValidationError):
        IncidentCommand(op=Op.RELEASE, ir=0)
    with pytest.raises(ValidationError):
        IncidentCommand.model_validate({"op": "release", "ir": 1, "surprise": True})


def test_the_group_is_the_incidents_pool() -> None:
    assert pool_group("onprem-hpc") == "onprem-hpc"
    assert pool_group(None) == pool_group("Not a pool!") == UNASSIGNED_GROUP


def test_release_then_extend_the_extend_is_told_it_came_too_late(world: World) -> None:
    ir = allocated(world)
    days = world.alloc(ir).duration_days
    executor.submit(world.svc.context, command(Op.RELEASE, ir))
    executor.submit(world.svc.context, command(Op.EXTEND, ir, days=2, origin="second"))
    assert world.alloc(ir).phase is Phase.ALLOCATED  # nothing written before the consumer runs
    world.run()
    a = world.alloc(ir)
    assert (a.phase, a.reclaim_reason, a.duration_days) == (Phase.RECLAIMED, ReclaimReason.RELEASED, days)
    released, extend = world.answers()[-2:]
    assert "being released" in released
    assert "has ended (released by the requester); nothing to extend" in extend


def test_expiry_re_checks_the_incident_when_it_runs(world: World) -> None:
    ir = allocated(world)
    world.clock.advance(days=8)
    world.svc.sync()
    [(_, body)] = [(g, b) for g, b in world.queue.sent if "command" in b]
    assert body["command"]["op"] == "expire"
    world.queue.sent = [(g, b) for g, b in world.queue.sent if "command" in b]
    # An extension that ran before the expiry command did: nothing is due any more.
    world.svc.extend(ir, USER, 7)
    assert world.run() == ["nothing to do (allocated)"]
    assert world.alloc(ir).phase is Phase.ALLOCATED
    world.clock.advance(days=8)
    world.svc.sync()
    world.queue.sent = [(g, b) for g, b in world.queue.sent if "command" in b]
    assert world.run() == ["resolved (expired)"]
    assert world.alloc(ir).reclaim_reason is ReclaimReason.EXPIRED


def test_keep_after_the_expiry_is_told_nothing_is_kept(world: World) -> None:
    ir = allocated(world)
    world.svc.idle_triggered(ir)
    world.clock.advance(days=8)
    executor.submit(world.svc.context, IncidentCommand(op=Op.EXPIRE, ir=ir))
    executor.submit(world.svc.context, command(Op.KEEP, ir))
    world.run()
    assert world.alloc(ir).phase is Phase.RECLAIMED
    assert "has ended (its time ran out); nothing to keep" in world.answers()[-1]


def test_the_decision_counts_grants_committed_before_it(world: World) -> None:
    # Three requests checked up-front against nothing granted; decided one after another in the pool's group.
    for count in (8, 4, 10):
        assert executor.request(world.svc.context, world.request(count), response_url=URL, origin=str(count)) is None
    # Nothing is created outside the group: three create commands wait in the pool's group.
    assert list(world.svc.context.live()) == []
    assert [(g, b["command"]["op"]) for g, b in world.queue.sent] == [("hpc", "create")] * 3
    world.run()
    first, second, third = (world.alloc(ir) for ir in (1, 2, 3))
    assert first.phase is Phase.ALLOCATED and first.approved_by == "policy"
    assert second.phase is Phase.REQUESTED and second.slack_message  # beyond quota, within the hard limit
    assert (third.phase, third.state) == (Phase.REJECTED, State.RESOLVED)  # 8 + 16 (10 asked, two hosts) > 16
    assert "refused" in third.title
    answer = world.answers()[-1]
    assert "IR-3 refused: 10 GPUs asked, the fewest whole hosts in hpc that hold it are 8 + 8 GPUs" in answer
    assert "team nlp would hold 24 H100 in hpc, over its hard limit of 16" in answer
    assert "The request is closed" in answer


def test_an_operator_approval_cannot_break_the_hard_limit(world: World) -> None:
    for count in (8, 6, 6):
        executor.request(world.svc.context, world.request(count), response_url=URL, origin=str(count))
    world.run()
    for ir in (2, 3):
        executor.submit(world.svc.context, command(Op.APPROVE, ir, actor=OPS))
    world.run()
    assert world.alloc(2).phase is Phase.ALLOCATED
    assert world.alloc(3).phase is Phase.REQUESTED
    assert (
        # 6 asked is charged the whole 8-GPU host it takes: 16 held + 8.
        "IR-3 cannot be approved: team nlp would hold 24 H100 in hpc, over its hard limit of 16"
        in (world.answers()[-1])
    )


def test_a_redelivered_command_does_not_apply_twice(world: World) -> None:
    ir = allocated(world)
    release = command(Op.RELEASE, ir)
    executor.execute(world.svc.context, release)
    executor.execute(world.svc.context, release)
    assert world.alloc(ir).phase is Phase.RECLAIMING
    # The redelivery found its own id in the incident and said again what it did.
    assert [a for a in world.answers() if "being released" in a][-2:] == [
        f"IR-{ir} is being released (released by the requester); its hosts are freed shortly.",
        f"IR-{ir} is being released (released); its hosts are freed shortly.",
    ]


def test_without_a_queue_a_command_runs_at_once(world: World) -> None:
    ir = allocated(world)
    world.svc.context.queue = None
    assert executor.submit(world.svc.context, command(Op.EXTEND, ir, days=1)).startswith(f"IR-{ir} extended by 1 days")
    with pytest.raises(NotFound):
        executor.submit(world.svc.context, command(Op.RELEASE, 99))
    assert world.queue.sent == []


def test_a_create_carries_the_request_and_no_ir() -> None:
    request = build_request(
        {"gpu_count": "2", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"},
        parse_farm(FARM_YAML),
        requester=USER,
        channel=None,
        request_id="r-create-1",
    )
    create = IncidentCommand(op=Op.CREATE, request=request, actor=USER)
    assert create.group() == "hpc"
    # Keyed by the Slack request id alone: another delivery of the request (another response_url) is the same.
    twin = IncidentCommand(op=Op.CREATE, request=request, actor=USER, response_url=URL, origin="retry")
    assert create.dedup_id() == twin.dedup_id() != IncidentCommand(op=Op.RELEASE, ir=1, actor=USER).dedup_id()
    assert IncidentCommand.model_validate(create.to_body()["command"]) == create
    for bad in ({"op": "create", "ir": 1, "request": request}, {"op": "create"}, {"op": "release", "request": request}):
        with pytest.raises(ValidationError):
            IncidentCommand.model_validate(bad)


def test_overlapping_deliveries_of_one_request_create_one_incident(world: World) -> None:
    req = world.request()
    # The original and a retry overlapping it: two workers queue the same create; SQS keeps one.
    for origin in ("first", "retry"):
        assert executor.request(world.svc.context, req, response_url=URL, origin=origin) is None
    assert len(world.queue.sent) == 1
    world.run()
    # A retry after the dedup window runs a second create in the group: it finds the incident by request id.
    world.queue._dedup.clear()
    executor.request(world.svc.context, req, response_url=URL, origin="late")
    world.run()
    assert world.incidents.creates == 1
    [alive] = world.svc.context.live()
    answers = world.answers()
    assert len(answers) == 2 and all(a.startswith(f"IR-{alive.ir} created") for a in answers), answers


def test_the_up_front_check_failing_does_not_lose_the_request(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(_: GpuRequest) -> None:
        raise UpstreamError("Datadog search incidents failed: HTTP 503")

    monkeypatch.setattr(world.svc, "precheck", down)
    assert executor.request(world.svc.context, world.request(), response_url=URL, origin="o") is None
    world.run()
    [alive] = world.svc.context.live()
    assert alive.phase is Phase.ALLOCATED


class LostAnswers(FakeIncidents):
    """An incident API whose next PATCH lands and then fails (a 5xx or timeout after the write)."""

    fail_after_write = 0

    def update(self, incident_id: str, fields: Any, *, title: str | None = None) -> Any:
        record = super().update(incident_id, fields, title=title)
        if self.fail_after_write:
            self.fail_after_write -= 1
            raise UpstreamError("Datadog update incident failed: no answer in time")
        return record


def test_an_extend_whose_write_landed_but_failed_adds_its_days_once(world: World) -> None:
    ir = allocated(world)
    flaky = LostAnswers(world.clock)
    flaky.records = world.incidents.records
    world.svc.context.incidents = flaky
    before = world.alloc(ir)
    extend = command(Op.EXTEND, ir, days=2)
    flaky.fail_after_write = 1
    with pytest.raises(UpstreamError):
        executor.execute(world.svc.context, extend)  # the queue redelivers it
    assert world.alloc(ir).duration_days == (before.duration_days or 0) + 2
    assert extend.dedup_id() in (world.incidents.by_ir(ir).fields.get(f.LAST_COMMANDS) or [])
    summary = executor.execute(world.svc.context, extend)
    after = world.alloc(ir)
    assert after.duration_days == (before.duration_days or 0) + 2
    assert summary.startswith("already applied")
    assert world.answers()[-1].startswith(f"IR-{ir} extended; it now ends ")
    # A new extend (another delivery, another id) still applies.
    executor.execute(world.svc.context, command(Op.EXTEND, ir, days=1, origin="again"))
    assert world.alloc(ir).duration_days == (before.duration_days or 0) + 3


def test_every_write_of_a_command_records_its_id_and_keeps_the_last_few(world: World) -> None:
    ir = allocated(world)
    written = len(world.incidents.updates)
    sent = [command(Op.EXTEND, ir, days=1, origin=str(n)) for n in range(f.LAST_COMMANDS_KEPT + 2)]
    for c in sent:
        executor.execute(world.svc.context, c)
    assert all(f.LAST_COMMANDS in fields for _, fields in world.incidents.updates[written:])
    kept = world.incidents.by_ir(ir).fields[f.LAST_COMMANDS]
    assert kept == [c.dedup_id() for c in sent][-f.LAST_COMMANDS_KEPT :]


def test_a_lost_answer_fails_the_command_and_its_redelivery_only_answers(world: World) -> None:
    ir = allocated(world)
    calls: list[Message] = []

    def respond_once_failing(url: str, text: str, blocks: Any = None) -> None:
        calls.append(Message(text))
        if len(calls) == 1:
            raise UpstreamError("slack response_url failed: service_unavailable (HTTP 503)")

    world.chat.respond = respond_once_failing  # type: ignore[method-assign,assignment]
    release = command(Op.RELEASE, ir)
    with pytest.raises(UpstreamError):
        executor.execute(world.svc.context, release)
    written = len(world.incidents.updates)
    executor.execute(world.svc.context, release)
    assert len(world.incidents.updates) == written  # nothing written again
    assert [c.text for c in calls] == [
        f"IR-{ir} is being released (released by the requester); its hosts are freed shortly.",
        f"IR-{ir} is being released (released); its hosts are freed shortly.",
    ]


def test_an_answer_slack_refuses_for_good_does_not_fail_the_command(world: World) -> None:
    ir = allocated(world)

    def expired(url: str, text: str, blocks: Any = None) -> None:
        raise SlackError("response_url", "expired_url", 404)

    world.chat.respond = expired  # type: ignore[method-assign,assignment]
    assert executor.execute(world.svc.context, command(Op.RELEASE, ir)).startswith(f"IR-{ir} is being released")
    assert world.alloc(ir).phase is Phase.RECLAIMING
