"""Lease semantics (issue 11 point 5): days count from allocation, waiting is bounded and positioned, one reminder
before the end, release confirmed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeQueue, ask_hpc

from gpufarm.core.chat.block_kit import ACTION_EXTEND, ACTION_RELEASE
from gpufarm.core.chat.command_text import Command, Verb, parse_command
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.service import GpuFarm

USER, OPS = "U0000000001", "U0000000OPS"
LEASES_YAML = FARM_YAML.replace(
    "hpc: {H100: {gpus: 8, hard_limit: 16}}", "hpc: {H100: {gpus: 24, hard_limit: 32}}"
).replace(
    "defaults:",
    "leases:\n  waiting_max_hours: 72\n  reminder_hours: 24\n  teams:\n    vision: {reminder_hours: 0}\ndefaults:",
)


@dataclass
class World:
    svc: GpuFarm
    chat: FakeChat
    clock: FakeClock
    incidents: FakeIncidents

    def ask(self, count: int = 8, days: int = 7) -> int:
        return ask_hpc(self.svc, self.incidents, USER, count, days)

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def webhook(self) -> None:
        """What the incident webhook does after the sync resolved incidents: reclaim them, then allocate."""
        for record in list(self.incidents.search(IncidentQuery.where({State.RESOLVED}))):
            self.svc.process(record.id)

    def dms(self) -> list[str]:
        return [s.text for s in self.chat.to(USER, "dm")]


@pytest.fixture
def world() -> Iterator[World]:
    clock = FakeClock()
    incidents = FakeIncidents(clock)
    hosts = FakeHosts()
    hosts.seed("hpc-0", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    svc = GpuFarm(incidents=incidents, hosts=hosts, chat=chat, clock=clock, farm=parse_farm(LEASES_YAML))
    yield World(svc, chat, clock, incidents)


def test_a_waiting_lease_gets_its_full_duration_from_when_its_hosts_are_allocated(world: World) -> None:
    first = world.ask(days=7)
    second = world.ask(days=5)
    waiting = world.alloc(second)
    assert waiting.phase is Phase.WAITING and waiting.waiting_since == world.clock.now()
    assert "it is 1st of 1 waiting for H100" in world.dms()[-1]
    assert "Its 5 days start when its hosts are allocated" in world.dms()[-1]
    listed = world.svc.list_allocations("mine", USER).text
    assert (
        f"IR-{second} waiting 8x H100 hpc nlp/p" in listed
        and "(1st of 1 waiting for H100: first come, first served)" in listed
    )
    world.clock.advance(days=2)
    world.svc.release(first, USER)
    world.webhook()
    lease = world.alloc(second)
    assert lease.phase is Phase.ALLOCATED and lease.allocated_at == world.clock.now()
    assert lease.expires_at == world.clock.now() + timedelta(days=5)  # not the request time + 5 days
    assert lease.waiting_since is None


def test_a_request_waiting_past_its_limit_is_withdrawn_with_its_own_message(world: World) -> None:
    first = world.ask(days=30)
    second = world.ask(days=1)  # its "end" at request time + 1 day must not end it: it never held a host
    world.clock.advance(hours=25)
    world.svc.sync()
    assert world.alloc(second).phase is Phase.WAITING
    world.clock.advance(hours=48)  # 73 h waited, over the 72 h limit
    report = world.svc.sync()
    assert report.withdrawn == [second] and report.expired == []
    world.webhook()
    gone = world.alloc(second)
    assert (gone.phase, gone.reclaim_reason) == (Phase.RECLAIMED, ReclaimReason.WITHDRAWN)
    told = world.dms()[-1]
    assert "waited 72 h without hpc freeing room for it and was withdrawn" in told
    assert "time ran out" not in told
    assert any(
        " sync withdrawn: no 8x H100 freed in hpc within the 72 h waiting limit [withdrawn-wait-limit]" in line
        for line in gone.history
    )
    assert gone.reason == "withdrawn-wait-limit"
    assert any(" gpufarm waiting: " in line for line in gone.history)
    assert world.alloc(first).phase is Phase.ALLOCATED


def test_one_reminder_before_the_end_with_extend_and_a_confirmed_release(world: World) -> None:
    ir = world.ask(days=2)
    world.clock.advance(hours=23)
    assert world.svc.sync().reminded == []  # 25 h left: not in the 24 h window yet
    world.clock.advance(hours=2)
    assert world.svc.sync().reminded == [ir]
    reminder = world.chat.to(USER, "dm")[-1]
    assert reminder.text.startswith(f"IR-{ir} ends ") and "extend or release it" in reminder.text
    buttons = {e["action_id"]: e for b in reminder.blocks if b["type"] == "actions" for e in b["elements"]}
    assert set(buttons) == {ACTION_EXTEND, ACTION_RELEASE}
    assert buttons[ACTION_RELEASE]["confirm"]["confirm"]["text"] == "Release"
    assert world.alloc(ir).expiry_reminded == world.alloc(ir).expires_at
    assert [line.split(" ", 2)[2] for line in world.alloc(ir).history if " reminded: " in line] == [
        f"reminded: ends {world.alloc(ir).expires_at:%Y-%m-%dT%H:%M:%SZ}"
    ]
    world.clock.advance(hours=1)
    assert world.svc.sync().reminded == []  # once per end
    assert world.svc.remind(ir).action.startswith("nothing to do")
    world.svc.extend(ir, USER, 2)  # a new end earns a new reminder in its own window
    world.clock.advance(hours=47)  # the new end is 96 h after the start
    assert world.svc.sync().reminded == [ir]


def test_the_sync_sends_reminders_as_commands_in_the_pools_group(world: World) -> None:
    ir = world.ask(days=1)
    world.clock.advance(hours=1)
    queue = FakeQueue()
    world.svc.context.queue = queue
    world.svc.sync()
    commands = [IncidentCommand.model_validate(b["command"]) for _, b in queue.sent if "command" in b]
    # The hour held is due to accrue too (gpufarm.core.accounting.gpu_hours); that command is its own.
    assert [(c.op, c.ir) for c in commands if c.op is not Op.ACCRUE] == [(Op.REMIND, ir)]
    assert world.alloc(ir).expiry_reminded is None  # the consumer sends it, re-checked there


def test_release_asks_for_confirmation_unless_told_now() -> None:
    assert parse_command("release IR-3") == Command(Verb.RELEASE, ir=3)
    assert parse_command("release IR-3 now").confirmed is True
    assert Command.from_payload(parse_command("release IR-3 now").to_payload()).confirmed is True


def test_lease_settings_are_validated() -> None:
    with pytest.raises(FarmConfigError, match=r"leases\.teams: 'nobody' is not a team"):
        parse_farm(FARM_YAML.replace("defaults:", "leases:\n  teams:\n    nobody: {reminder_hours: 1}\ndefaults:"))
    with pytest.raises(FarmConfigError, match=r"leases\.waiting_max_hours"):
        parse_farm(FARM_YAML.replace("defaults:", "leases: {waiting_max_hours: 0}\ndefaults:"))
    farm = parse_farm(LEASES_YAML)
    assert farm.leases.policy("hpc", "vision").reminder_hours == 0
    assert farm.leases.policy("hpc", "nlp").reminder_hours == 24


def test_the_field_schema_carries_the_lease_fields() -> None:
    assert {f.ALLOCATED_AT, f.WAITING_SINCE, f.EXPIRY_REMINDED} <= set(f.BY_NAME)


def test_a_redelivered_reminder_command_is_answered_from_the_ledger_not_sent_twice(world: World) -> None:
    from gpufarm.core.commands import executor

    ir = world.ask(days=1)
    world.clock.advance(hours=1)
    command = IncidentCommand(op=Op.REMIND, ir=ir, origin="sync-1")
    assert executor.execute(world.svc.context, command).startswith("reminded (ends ")
    assert executor.execute(world.svc.context, command).startswith("already applied")
    assert len([t for t in world.dms() if t.startswith(f"IR-{ir} ends ")]) == 1


def test_status_says_when_the_days_start(world: World) -> None:
    first = world.ask(days=7)
    second = world.ask(days=5)
    held = world.svc.status(first, USER).text
    assert f"7 days from {world.clock.now():%Y-%m-%d %H:%M} UTC, expires " in held
    waiting = world.svc.status(second, USER).text
    assert "5 days from when its hosts are allocated, waiting since " in waiting and "expires" not in waiting
