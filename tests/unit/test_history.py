"""The audit trail (gpufarm.core.kernel.history): one bounded line per step, written with the change, never
rewritten."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat import block_kit, messages
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.commands import executor
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Entry, Step
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand, Op
from gpufarm.core.service import GpuFarm

pytestmark = pytest.mark.unit

USER = "U0000000001"
OPS = "U0000000OPS"
URL = "https://hooks.slack.com/commands/T0000000001/1/abc"
T0 = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)
_ids = itertools.count(1)


def test_an_entry_is_one_bounded_line_that_parses_back() -> None:
    e = history.entry(T0, OPS, Step.REJECTED, "reason: no\nbudget\x00 left", "")
    assert e.line() == "2026-12-01T14:00:00Z U0000000OPS rejected: reason: no budget left"
    assert history.parse(e.line()) == Entry(T0, OPS, "rejected", "reason: no budget left")
    long = history.entry(T0, "not an actor!", Step.REQUESTED, "x" * 1000).line()
    assert len(long) == history.MAX_ENTRY_CHARS and long.endswith("…")
    assert " gpufarm requested: " in long  # an actor that is neither a user id nor a system name is not stored
    assert history.parse("hello world") is None
    assert history.shown([e.line()], inert, mention) == [
        "2026-12-01 14:00Z <@U0000000OPS> *rejected*: reason: no budget left"
    ]
    # Hand-edited or quoted text is shown as typed, never as a mention or a link.
    odd = history.entry(T0, OPS, Step.REJECTED, "reason: <!channel> & <http://evil.example|x>").line()
    assert history.shown([odd, "<!here> by hand"], inert, mention) == [
        "2026-12-01 14:00Z <@U0000000OPS> *rejected*: reason: &lt;!channel&gt; &amp; &lt;http://evil.example|x&gt;",
        "&lt;!here&gt; by hand",
    ]


def _lines(n: int, step: Step = Step.WARNED) -> list[str]:
    return [history.entry(T0 + timedelta(minutes=i), history.MONITOR, step, f"n{i}").line() for i in range(n)]


def test_past_the_bound_the_oldest_are_summarised_and_the_kept_ones_are_unchanged() -> None:
    first = history.entry(T0, USER, Step.REQUESTED, "8x H100").line()
    lines = [first, *_lines(history.MAX_ENTRIES - 1)]
    assert len(lines) == history.MAX_ENTRIES
    new = history.entry(T0 + timedelta(days=1), USER, Step.KEPT, "1 of 2")
    out = history.appended(lines, new)
    assert len(out) == history.FOLD_TO_ENTRIES
    assert out[0] == first  # the request stays verbatim
    summary = history.parse(out[1])
    assert summary is not None and summary.step == "summary"
    folded = history.MAX_ENTRIES - history.FOLD_TO_ENTRIES + 2  # 65 lines: the first, a summary, 46 kept
    assert summary.details == f"{folded} earlier entries to {_lines(folded)[-1][:20]}: warned {folded}"
    assert summary.at == T0
    # Every entry kept is one of the lines before, as it was; the new one is last.
    assert out[2:-1] == lines[-(history.FOLD_TO_ENTRIES - 3) :]
    assert out[-1] == new.line()


def test_folding_again_adds_to_the_summary() -> None:
    out = [history.entry(T0, USER, Step.REQUESTED).line()]
    for i in range(300):
        step = Step.KEPT if i % 3 else Step.WARNED
        out = history.appended(out, history.entry(T0 + timedelta(minutes=i), USER, step, f"n{i}"))
        assert len(out) <= history.MAX_ENTRIES and sum(map(len, out)) <= history.MAX_CHARS
    summary = history.parse(out[1])
    assert summary is not None and summary.step == "summary"
    counted = sum(int(part.rsplit(" ", 1)[1]) for part in summary.details.split(": ", 1)[1].split(", "))
    assert counted == int(summary.details.split(" ", 1)[0]) == 300 - (len(out) - 2)
    assert out[-1].endswith("kept: n299")


def test_long_entries_fold_by_size_too() -> None:
    out = [history.entry(T0, USER, Step.REQUESTED).line()]
    for _ in range(100):
        out = history.appended(out, history.entry(T0, USER, Step.EXTENDED, "y" * 400))
        assert sum(map(len, out)) <= history.MAX_CHARS
    assert len(out) < history.MAX_ENTRIES


# ---- the steps, written with the change they record ----------------------------------------------------------


@pytest.fixture
def svc() -> Iterator[GpuFarm]:
    clock = FakeClock()
    hosts = FakeHosts()
    for i in range(2):
        hosts.seed(f"hpc-{i}", "H100", 8, "hpc")
    chat = FakeChat(operators=frozenset({OPS}))
    yield GpuFarm(incidents=FakeIncidents(clock), hosts=hosts, chat=chat, clock=clock, farm=parse_farm(FARM_YAML))


def _request(svc: GpuFarm, count: int) -> int:
    values = {"gpu_count": str(count), "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
    request = build_request(values, svc.context.farm, requester=USER, channel=None, request_id=f"h-{next(_ids):06d}")
    # Created and decided as the pool's consumer does (the up-front check would spare a refused one its incident).
    alloc, _ = svc.create_request(request)
    svc.decide_request(alloc.ir)
    return alloc.ir


def _steps(svc: GpuFarm, ir: int) -> list[tuple[str, str, str]]:
    alloc = svc.allocation(ir)
    parsed = [history.parse(line) for line in alloc.history]
    return [(e.actor, e.step, e.details) for e in parsed if e is not None]


def test_a_lease_records_every_step_with_who_and_why(svc: GpuFarm) -> None:
    ir = _request(svc, 8)
    svc.allocate(svc.allocation(ir))
    svc.idle_triggered(ir, IdleScope(hosts=("hpc-0",), kind="idle", value=0.0, window_minutes=60))
    svc.keep(ir, USER)
    svc.extend(ir, USER, 2)
    svc.force_reclaim(ir, OPS, "job finished, holding for nothing")
    svc.process(svc.allocation(ir).incident_id)
    steps = _steps(svc, ir)
    assert [s[1] for s in steps] == [
        "requested",
        "approved",
        "allocated",
        "warned",
        "kept",
        "extended",
        "reclaimed",
        "freed",
    ]
    assert steps[0] == (USER, "requested", "8x H100 in hpc for 7 days, team nlp, project p")
    assert steps[1][0] == "policy"
    assert steps[2][2].startswith("hosts: hpc-0 (8 GPUs); until ")
    assert steps[3] == ("monitor", "warned", "kind idle; on hpc-0 (kind idle, 0, over 60 min)")
    assert steps[5][0] == USER and " -> " in steps[5][2] and steps[5][2].endswith("(+2 days)")
    assert steps[6] == (
        OPS,
        "reclaimed",
        "reason: operator; note: job finished, holding for nothing; "
        f"an operator ({OPS}) took back 8x H100 [reclaimed-operator]",
    )
    assert steps[7] == ("gpufarm", "freed", "hosts: hpc-0")


def test_operators_decisions_and_the_queue_position_are_recorded(svc: GpuFarm) -> None:
    first = _request(svc, 8)
    svc.allocate(svc.allocation(first))
    beyond = _request(svc, 8)  # beyond quota: asked of the operators
    rejected = _request(svc, 8)
    svc.reject(rejected, OPS, "the team is over budget")
    svc.approve(beyond, OPS)
    svc.allocate(svc.allocation(beyond))
    assert [s[1] for s in _steps(svc, beyond)] == ["requested", "asked-operators", "approved", "allocated"]
    assert _steps(svc, rejected)[-1] == (OPS, "rejected", "reason: the team is over budget [rejected-operator]")
    refused = _request(svc, 8)  # nlp holds 16, its hard limit: refused by policy, and the refusal recorded
    assert _steps(svc, refused)[-1] == (
        "policy",
        "refused",
        "team nlp would hold 24 H100 in hpc, over its hard limit of 16 (it holds 16 now) [refused-policy]",
    )


def test_a_waiting_request_records_its_position(svc: GpuFarm) -> None:
    svc.context.farm = parse_farm(FARM_YAML.replace("gpus: 8, hard_limit: 16", "gpus: 32, hard_limit: 32"))
    irs = [_request(svc, 16), _request(svc, 8), _request(svc, 8)]
    for ir in irs:
        svc.allocate(svc.allocation(ir))
    assert svc.allocation(irs[0]).phase is Phase.ALLOCATED
    fifo = "first come, first served [queued-capacity]"
    assert _steps(svc, irs[1])[-1] == ("gpufarm", "waiting", f"1st of 1 waiting for H100; no room in the pool; {fifo}")
    assert _steps(svc, irs[2])[-1] == (
        "gpufarm",
        "waiting",
        f"2nd of 2 waiting for H100; others are served first; {fifo}",
    )
    # The latest reason is the lease's field, and `/gpu status` shows its sentence.
    assert svc.allocation(irs[2]).reason == "queued-capacity"
    assert "Why: 2nd of 2 waiting for H100; others are served first" in svc.status(irs[2], USER).text


def test_a_redelivered_command_appends_nothing(svc: GpuFarm) -> None:
    ir = _request(svc, 8)
    svc.allocate(svc.allocation(ir))
    extend = IncidentCommand(op=Op.EXTEND, ir=ir, actor=USER, days=3, response_url=URL)
    executor.execute(svc.context, extend)
    before = svc.allocation(ir).history
    executor.execute(svc.context, extend)
    assert svc.allocation(ir).history == before
    assert [s[1] for s in _steps(svc, ir)].count("extended") == 1


def test_status_prints_the_history(svc: GpuFarm) -> None:
    ir = _request(svc, 8)
    svc.allocate(svc.allocation(ir))
    svc.release(ir, USER)
    message = svc.status(ir, USER)
    assert "History (4 entries):" in message.text
    assert f"<@{USER}> released" in message.text
    history_blocks = [b for b in message.blocks if b["type"] == "section" and "History" in b["text"]["text"]]
    assert history_blocks and all(len(b["text"]["text"]) <= 3000 for b in message.blocks if b["type"] == "section")


def test_a_long_history_fits_the_status_message() -> None:
    lines = [history.entry(T0, USER, Step.EXTENDED, "z" * 280).line() for _ in range(history.MAX_ENTRIES)]
    alloc = Allocation(incident_id="x", ir=7, title="t", state="stable", phase="allocated", history=tuple(lines))
    message = messages.status_message(alloc)
    sections = [b for b in message.blocks if b["type"] == "section"]
    assert len(message.blocks) <= block_kit.MAX_MESSAGE_BLOCKS
    assert all(len(b["text"]["text"]) <= block_kit.MAX_SECTION_TEXT for b in sections)
    assert message.text.count("extended") == history.MAX_ENTRIES


def test_a_repair_by_the_sync_is_recorded(svc: GpuFarm) -> None:
    ir = _request(svc, 8)
    svc.allocate(svc.allocation(ir))
    host = svc.allocation(ir).hosts[0]
    svc.context.hosts.replace_tags(
        host, [t for t in svc.context.hosts.get_tags(host, source="user") if not t.startswith("ir:")]
    )
    svc.reconcile_pool("hpc")
    assert _steps(svc, ir)[-1] == ("sync", "repaired", f"restored ir:ir-{ir}, project:p, team:nlp on {host}")


def test_a_repair_of_several_hosts_is_one_entry_and_a_quiet_sync_adds_none(svc: GpuFarm) -> None:
    # One history entry per lease and sync, never one per host: the scale figures count one incident write a lease.
    ir = _request(svc, 16)  # beyond the team's quota: an operator approves it
    svc.approve(ir, OPS)
    svc.allocate(svc.allocation(ir))
    assert sorted(svc.allocation(ir).hosts) == ["hpc-0", "hpc-1"]
    before = len(svc.allocation(ir).history)
    for host in svc.allocation(ir).hosts:
        svc.context.hosts.replace_tags(
            host, [t for t in svc.context.hosts.get_tags(host, source="user") if not t.startswith("ir:")]
        )
    svc.reconcile_pool("hpc")
    svc.reconcile_pool("hpc")
    steps = _steps(svc, ir)
    assert len(steps) == before + 1
    actor, step, details = steps[-1]
    assert (actor, step) == ("sync", "repaired")
    assert details.count("restored") == 1 and all(h in details for h in ("hpc-0", "hpc-1"))


def test_status_shows_keeps_and_an_exemption(svc: GpuFarm) -> None:
    ir = _request(svc, 8)
    svc.allocate(svc.allocation(ir))
    svc.idle_triggered(ir)
    svc.keep(ir, USER)
    svc.exempt(ir, OPS, 3, "paper deadline")
    text = svc.status(ir, USER).text
    assert "Keeps used: 1, idle reclaim held off until " in text
    assert "Exempt from idle reclaim until " in text and f"(granted by <@{OPS}>)" in text
