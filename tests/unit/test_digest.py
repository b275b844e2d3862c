"""The operators' daily digest: each section of the builder, the empty case, its schedule, the run and handler."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.accounting.budgets import Burn
from gpufarm.core.chat.links import Links
from gpufarm.core.config.accounting import Budget
from gpufarm.core.config.digest import DigestSettings
from gpufarm.core.config.farm import FarmConfigError, parse_farm
from gpufarm.core.digest import run
from gpufarm.core.digest.build import MAX_LINES, Digest, DigestFacts, QuotaUse, build
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.ports import ScalarResult
from gpufarm.core.money.card import RateCard
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import daily_digest, runtime
from gpufarm_sandbox.emulator.slack_blockkit import block_errors

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
SINCE = NOW - timedelta(days=1)
FARM = parse_farm(FARM_YAML)
SETTINGS = DigestSettings()
LINKS = Links("https://app.datadoghq.com")
EVENTS = Path(__file__).resolve().parents[2] / "events"
_irs = itertools.count(100)


def lease(phase: Phase = Phase.ALLOCATED, **values: Any) -> Allocation:
    """A lease as an incident decodes: nlp/llm 8 H100 in hpc unless told otherwise."""
    state = State.STABLE if phase in (Phase.ALLOCATED, Phase.IDLE_WARNED) else State.ACTIVE
    fields: dict[str, Any] = {
        "incident_id": f"id-{values.get('ir', 0)}",
        "ir": next(_irs),
        "title": "GPU request",
        "state": state,
        "phase": phase,
        "team": "nlp",
        "project": "llm",
        "gpu_model": "H100",
        "gpu_count": 8,
        "environment": "hpc",
        "requester": "U0000000001",
        "expires_at": NOW + timedelta(days=5),
    }
    fields.update(values)
    return Allocation(**fields)


def facts(leases: Sequence[Allocation] = (), **values: Any) -> DigestFacts:
    base: dict[str, Any] = {
        "now": NOW,
        "since": SINCE,
        "until": NOW,
        "leases": leases,
        "farm": FARM,
        "capacity": {("hpc", "H100"): (8, 16)},
    }
    base.update(values)
    return DigestFacts(**base)


def digest_of(leases: Sequence[Allocation] = (), **values: Any) -> Digest:
    built = build(facts(leases, **values), SETTINGS, LINKS)
    assert built is not None
    return built


def text_of(built: Digest) -> str:
    return "\n".join(b["text"]["text"] for b in built.message.blocks if b["type"] in ("section", "header"))


def link(ir: int) -> str:
    return f"<https://app.datadoghq.com/incidents/{ir}|IR-{ir}>"


# -- nothing to say ------------------------------------------------------------------------------------------------


def test_a_quiet_farm_gets_no_digest_even_with_free_capacity_to_show() -> None:
    quiet = [lease(), lease(expires_at=NOW + timedelta(days=3))]
    assert build(facts(quiet), SETTINGS, LINKS) is None
    assert build(facts(), SETTINGS, LINKS) is None
    # Quotas below the threshold, budgets with room and no unattributed use are not news either.
    calm = facts(
        quiet,
        quotas=[QuotaUse("nlp", "hpc", "H100", 4, 8)],
        burns=[Burn(Budget(team="nlp", gpu_hours=1000), "2026-12", 100.0)],
        unattributed={},
    )
    assert build(calm, SETTINGS, LINKS) is None


# -- each section ------------------------------------------------------------------------------------------------


def test_waiting_requests_show_their_age_the_longest_waiting_first() -> None:
    asked = lease(
        Phase.REQUESTED,
        history=(f"{isoformat(NOW - timedelta(hours=2))} U0000000001 requested: 8 H100 in hpc for 7 days",),
    )
    queued = lease(Phase.WAITING, waiting_since=NOW - timedelta(hours=5, minutes=10))
    built = digest_of([asked, queued])
    text = text_of(built)
    assert built.counts == {"Waiting requests": 2}
    assert (
        f"{link(queued.ir)} nlp/llm 8xH100 in `hpc`: waiting for hosts (1st of 1 waiting for H100) for 5 h 10 m" in text
    )
    assert f"{link(asked.ir)} nlp/llm 8xH100 in `hpc`: awaiting an operator's decision for 2 h 0 m" in text
    assert text.index(f"IR-{queued.ir}>") < text.index(f"IR-{asked.ir}>")
    # Free capacity is shown beside the news.
    assert "*Free capacity (free / total GPUs)*\n• `hpc`: H100 8 / 16" in text


def test_idle_warnings_say_when_the_grace_ends() -> None:
    warned = lease(Phase.IDLE_WARNED, idle_warned_at=NOW - timedelta(minutes=20))
    text = text_of(digest_of([warned]))
    # The farm's grace is 60 minutes.
    assert f"{link(warned.ir)} nlp/llm 8xH100 in `hpc`: warned 20 m ago, reclaimed in 40 m (2026-12-01 08:40)" in text


def test_keeps_show_their_count_and_hold() -> None:
    kept = lease(keep_count=1, kept_until=NOW + timedelta(hours=20))
    over = lease(keep_count=2, kept_until=NOW - timedelta(hours=1))  # its hold is over: not shown
    built = digest_of([kept, over])
    assert built.counts == {"Kept after an idle warning": 1}
    assert f"{link(kept.ir)} nlp/llm 8xH100 in `hpc`: keep 1 of 2, held off in 20 h 0 m" in text_of(built)


def test_exemptions_and_leases_ending_within_the_horizon() -> None:
    exempt = lease(exempt_until=NOW + timedelta(hours=6), exempt_by="U0000000OPS")
    later = lease(exempt_until=NOW + timedelta(days=3))
    ending = lease(expires_at=NOW + timedelta(hours=23, minutes=30))
    waiting = lease(Phase.WAITING, expires_at=NOW + timedelta(hours=2), waiting_since=NOW)  # holds nothing: no end
    built = digest_of([exempt, later, ending, waiting])
    text = text_of(built)
    assert built.counts["Exemptions ending within 24 h"] == 1
    assert built.counts["Leases ending within 24 h"] == 1
    assert f"{link(exempt.ir)} nlp/llm 8xH100 in `hpc`: exempt from idle reclaim in 6 h 0 m" in text
    assert "(granted by <@U0000000OPS>)" in text
    assert f"IR-{later.ir}>" not in text
    assert f"{link(ending.ir)} nlp/llm 8xH100 in `hpc`, <@U0000000001>: ends in 23 h 30 m (2026-12-02 07:30)" in text


def test_unattributed_use_lists_hosts_the_most_first() -> None:
    built = digest_of(unattributed={("hpc-1", "nlp", "hpc"): 2.0, ("gpu-9", "none", "none"): 3.5, ("x", "a", "b"): 0})
    text = text_of(built)
    assert built.counts == {"Unattributed use (busy GPUs no lease claims)": 2}
    assert text.index("`gpu-9` (no team tag, no pool): up to 3.5 GPUs busy") < text.index(
        "`hpc-1` (team `nlp`, `hpc`): up to 2 GPUs busy with no lease"
    )
    # Not measured is not "none": nothing is claimed either way.
    assert build(facts(unattributed=None), SETTINGS, LINKS) is None


def test_drift_is_the_sync_repairs_since_the_last_digest() -> None:
    entries = (
        f"{isoformat(SINCE - timedelta(minutes=5))} sync repaired: restored ir:ir-1 on old-1",  # the last digest's
        f"{isoformat(NOW - timedelta(hours=3))} sync repaired: restored ir:ir-7 on hpc-1",
        f"{isoformat(NOW - timedelta(hours=2))} U0000000001 kept: 1 of 2",
        f"{isoformat(NOW)} sync repaired: restored ir:ir-7 on hpc-2",  # the next digest's
    )
    repaired = lease(history=entries)
    built = digest_of([repaired])
    text = text_of(built)
    assert built.counts == {"Drift the sync repaired": 1}
    assert f"{link(repaired.ir)} 2026-12-01 05:00: restored ir:ir-7 on hpc-1" in text
    assert "old-1" not in text and "hpc-2" not in text


def test_many_repairs_are_counted_all_and_the_oldest_shown() -> None:
    entries = tuple(
        f"{isoformat(NOW - timedelta(hours=20, minutes=-i))} sync repaired: restored ir:ir-1 on hpc-{i}"
        for i in range(20)
    )
    built = digest_of([lease(history=entries)])
    section = next(b["text"]["text"] for b in built.message.blocks if "Drift" in b["text"]["text"])
    assert built.counts == {"Drift the sync repaired": 20}
    assert section.startswith("*Drift the sync repaired* (20)")
    assert "hpc-0\n" in section and "hpc-14" in section and "hpc-15" not in section
    assert section.endswith("… and 5 more")


def test_waiting_requests_in_one_queue_have_their_places() -> None:
    first = lease(Phase.WAITING, waiting_since=NOW - timedelta(hours=3))
    second = lease(Phase.WAITING, waiting_since=NOW - timedelta(hours=1))
    other = lease(Phase.WAITING, waiting_since=NOW - timedelta(hours=2), environment="cloud", gpu_model="A100")
    text = text_of(digest_of([second, other, first]))
    assert f"IR-{first.ir}> nlp/llm 8xH100 in `hpc`: waiting for hosts (1st of 2 waiting for H100)" in text
    assert f"IR-{second.ir}> nlp/llm 8xH100 in `hpc`: waiting for hosts (2nd of 2 waiting for H100)" in text
    assert "(1st of 1 waiting for A100)" in text


def test_quota_and_budget_pressure_from_their_thresholds() -> None:
    budget = Budget(team="nlp", gpu_hours=20000)
    built = digest_of(
        quotas=[
            QuotaUse("nlp", "hpc", "H100", 16, 16, 24),
            QuotaUse("nlp", "cloud", "A100", 4, 8),
            QuotaUse("vision", "hpc", "H100", 0, 0, 8),
        ],
        burns=[Burn(budget, "2026-12", 17000.0), Burn(Budget(team="vision", gpu_hours=10), "2026-12", 1.0)],
    )
    text = text_of(built)
    assert built.counts == {"Quota and budget pressure": 2}
    assert "`nlp` H100 in `hpc`: 16 of 16 quota GPUs (100 %), hard limit 24" in text
    assert "`nlp` budget for 2026-12: 17,000 of 20,000 GPU-hours (85 %), 3,000 left" in text
    assert "A100" not in text.split("Free capacity")[0]


def test_unreadable_budgets_are_said() -> None:
    assert "GPU-hour budgets could not be read" in text_of(digest_of(burns=None))


def test_a_large_farm_is_cut_per_section_and_slack_takes_the_blocks() -> None:
    many = [lease(Phase.WAITING, waiting_since=NOW - timedelta(minutes=i), purpose="x" * 400) for i in range(40)]
    built = digest_of(many)
    section = next(b["text"]["text"] for b in built.message.blocks if "Waiting requests" in b["text"]["text"])
    assert section.count("\n• ") == MAX_LINES
    assert section.endswith(f"… and {40 - MAX_LINES} more")
    assert len(section) <= 3000
    assert block_errors(built.message.blocks) == []
    assert built.message.text.startswith("GPU farm digest, Tue 2026-12-01 08:00 UTC: waiting requests: 40")


def test_times_are_shown_in_the_digest_timezone() -> None:
    berlin = DigestSettings(timezone="Europe/Berlin")
    ending = lease(expires_at=NOW + timedelta(hours=2))
    built = build(facts([ending]), berlin, LINKS)
    assert built is not None
    text = text_of(built)
    assert "GPU farm digest, Tue 2026-12-01 09:00 CET" in text
    assert "ends in 2 h 0 m (2026-12-01 11:00)" in text


# -- the schedule ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "slot"),
    [
        ("2026-12-01T08:00:00+00:00", "2026-12-01T08:00:00+00:00"),
        ("2026-12-01T08:14:59+00:00", "2026-12-01T08:00:00+00:00"),
        ("2026-12-01T08:15:00+00:00", None),
        ("2026-12-01T07:59:00+00:00", None),
        ("2026-12-01T20:00:00+00:00", None),
    ],
)
def test_a_run_posts_within_one_tick_of_the_digest_time(moment: str, slot: str | None) -> None:
    found = run.due_slot(datetime.fromisoformat(moment), SETTINGS)
    assert (found.isoformat() if found else None) == slot


def test_local_time_holds_across_daylight_saving_and_odd_offsets() -> None:
    berlin = DigestSettings(time="08:00", timezone="Europe/Berlin")
    # 2026-03-29: Berlin moves from UTC+1 to UTC+2; 08:00 local is 06:00 UTC that day, 07:00 UTC the day before.
    slot = run.due_slot(datetime(2026, 3, 29, 6, 0, tzinfo=UTC), berlin)
    assert slot is not None and slot.astimezone(UTC) == datetime(2026, 3, 29, 6, 0, tzinfo=UTC)
    previous = run.previous_slot(slot, berlin)
    assert previous.astimezone(UTC) == datetime(2026, 3, 28, 7, 0, tzinfo=UTC)
    assert slot - previous == timedelta(hours=23)
    kolkata = DigestSettings(time="09:00", timezone="Asia/Kolkata")  # UTC+5:30: lands on a quarter hour
    assert run.due_slot(datetime(2026, 12, 1, 3, 30, tzinfo=UTC), kolkata) is not None


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("digest: {time: '8am'}", "HH:MM"),
        ("digest: {time: '24:00'}", "HH:MM"),
        ("digest: {timezone: Mars/Olympus}", "not a known IANA timezone"),
        ("digest: {timezone: ../../etc/passwd}", "IANA timezone name"),
        ("digest: {horizon_hours: 0}", "horizon_hours"),
        ("digest: {budget_percent: 120}", "budget_percent"),
        ("digest: {when: daily}", "when"),
    ],
)
def test_a_bad_digest_section_is_refused_with_its_reason(section: str, problem: str) -> None:
    with pytest.raises(FarmConfigError, match=problem):
        parse_farm(FARM_YAML + section + "\n")


# -- the run through the service ---------------------------------------------------------------------------------


class Query:
    """A MetricsQuery answering the unattributed gauge's peak."""

    def __init__(self, results: Sequence[ScalarResult] = (), fail: bool = False) -> None:
        self.results = list(results)
        self.fail = fail
        self.asked: list[tuple[str, str]] = []

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        self.asked.append((query, aggregator))
        if self.fail:
            raise UpstreamError("query failed")
        return self.results


class FailingChat(FakeChat):
    def post_message(self, channel: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None) -> str:
        raise UpstreamError("slack chat.postMessage failed: ratelimited")


def service(chat: FakeChat | None = None, usage: Query | None = None, extra: str = "") -> tuple[GpuFarm, FakeChat]:
    clock = FakeClock(NOW)
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc")
    chat = chat or FakeChat(operators=frozenset({"U0000000OPS"}))
    farm = parse_farm(FARM_YAML + extra)
    svc = GpuFarm(incidents=FakeIncidents(clock), hosts=hosts, chat=chat, clock=clock, farm=farm, usage=usage)
    return svc, chat


def ask(svc: GpuFarm, gpus: int = 24) -> int:
    """A request past the quota: it waits for an operator."""
    values = {"gpu_count": str(gpus), "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "p"}
    request = build_request(
        values, svc.context.farm, requester="U0000000001", channel=None, request_id=f"d-{next(_irs):06d}"
    )
    alloc, _ = svc.create_request(request)
    return alloc.ir


def test_the_run_posts_once_a_day_to_the_operators_channel() -> None:
    usage = Query([ScalarResult(("host:hpc-9", "team:nlp", "environment:hpc"), 2.0)])
    svc, chat = service(usage=usage)
    ir = ask(svc, 8)
    svc.context.clock.current = NOW - timedelta(hours=1)  # type: ignore[attr-defined]
    assert run.run(svc.context).reason.startswith("not digest time (the digest is at 08:00 UTC)")
    svc.context.clock.current = NOW + timedelta(minutes=3)  # type: ignore[attr-defined]
    result = run.run(svc.context)
    assert result.posted and result.slot == NOW and result.since == SINCE
    [post] = [s for s in chat.sent if s.kind == "post" and "GPU farm digest" in s.text]
    assert post.target == "C0000000001"
    assert result.ts == post.ts
    shown = json.dumps(post.blocks)
    assert f"incidents/{ir}|IR-{ir}>" in shown and "hpc-9" in shown
    assert usage.asked == [(run.UNATTRIBUTED_QUERY, "max")]
    assert result.sections["Unattributed use (busy GPUs no lease claims)"] == 1


def test_nothing_to_say_posts_nothing_and_a_failed_read_is_not_news() -> None:
    svc, chat = service(usage=Query(fail=True))
    result = run.run(svc.context, at=NOW)
    assert (result.posted, result.reason) == (False, "nothing to say")
    assert [s for s in chat.sent if s.kind == "post"] == []


def test_force_posts_now_with_the_window_since_the_last_digest() -> None:
    svc, _ = service()
    ask(svc)
    svc.context.clock.current = NOW + timedelta(hours=5)  # type: ignore[attr-defined]
    result = run.run(svc.context, force=True)
    assert result.posted and result.slot == NOW + timedelta(hours=5) and result.since == NOW


def test_a_failed_post_raises_so_the_scheduler_retries() -> None:
    svc, _ = service(chat=FailingChat())
    ask(svc)
    with pytest.raises(UpstreamError):
        run.run(svc.context, at=NOW)


def test_no_operators_channel_no_digest() -> None:
    svc, _ = service()
    svc.context.operators_channel = None
    ask(svc)
    assert run.run(svc.context, at=NOW).reason == "no operators channel is configured"


# -- the handler ---------------------------------------------------------------------------------------------------


@pytest.fixture
def wired() -> Iterator[FakeChat]:
    clock = FakeClock(NOW + timedelta(seconds=30))
    chat = FakeChat(operators=frozenset({"U0000000OPS"}))
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc")
    runtime.reset()
    runtime.override(
        clock=clock,
        incidents=FakeIncidents(clock),
        hosts=hosts,
        chat=chat,
        farm=FARM,
        queue=None,
        metrics=FakeMetrics(),
        metrics_query=Query(),
    )
    svc = runtime.current().service()
    ask(svc)
    yield chat
    runtime.reset()


def test_the_handler_runs_the_scheduled_event(wired: FakeChat) -> None:
    scheduled = json.loads((EVENTS / "daily_digest_schedule.json").read_text())
    answer = daily_digest.handle(scheduled)
    assert answer["posted"] is True and answer["slot"] == NOW.isoformat()
    assert [s.target for s in wired.sent if s.kind == "post" and "digest" in s.text] == ["C0000000001"]


def test_the_handler_decides_on_the_clock_when_the_schedule_time_is_unusable(wired: FakeChat) -> None:
    # An Input whose placeholder was not filled in, or a time far from the clock: the clock's now decides.
    assert daily_digest.handle({"job": "daily_digest", "scheduled_time": "<aws.scheduler.scheduled-time>"})["posted"]
    far = daily_digest.handle({"scheduled_time": "2026-11-01T08:00:00Z"})
    assert far["posted"] is True and far["slot"] == NOW.isoformat()


@pytest.mark.parametrize(
    ("event", "error"),
    [
        ({"job": "quota_sync"}, "job must be"),
        ({"force": "yes"}, "force must be"),
        ({"scheduled_time": 12}, "scheduled_time"),
        ({"scheduled_time": "x" * 500}, "scheduled_time"),
        ({"job": "daily_digest", "extra": 1}, "unknown keys: extra"),
    ],
)
def test_a_malformed_event_is_refused_and_posts_nothing(wired: FakeChat, event: dict[str, Any], error: str) -> None:
    answer = daily_digest.handle(event)
    assert answer["posted"] is False and error in answer["error"]
    assert [s for s in wired.sent if s.kind == "post" and "digest" in s.text] == []


# -- the local host's schedule ---------------------------------------------------------------------------------


def test_the_local_schedule_fills_in_the_scheduled_time_of_the_last_tick_due() -> None:
    from types import SimpleNamespace

    from gpufarm_sandbox.localhost.schedule import Expression
    from gpufarm_sandbox.localhost.scheduler import ScheduledTrigger, Scheduler
    from gpufarm_sandbox.localhost.template import ScheduleSpec

    spec = ScheduleSpec(
        "EveryQuarterHour",
        "ScheduleV2",
        "cron(0/15 * * * ? *)",
        '{"job": "daily_digest", "scheduled_time": "<aws.scheduler.scheduled-time>"}',
    )
    expression = Expression.parse(spec.expression)
    start = datetime(2026, 12, 1, 7, 50, tzinfo=UTC).timestamp()
    function: Any = SimpleNamespace(spec=SimpleNamespace(logical_id="DailyDigestFunction"))
    trigger = ScheduledTrigger(function, spec, expression, start, expression.next_after(start, start=start))
    # The clock jumps from 07:50 to 08:20: the ticks at 08:00 and 08:15 are due; one fires, as the later.
    now = datetime(2026, 12, 1, 8, 20, tzinfo=UTC).timestamp()
    scheduled = Scheduler._latest_due(trigger, now)
    event = Scheduler._schedule_event(cast("Any", None), trigger, now, scheduled)
    assert event == {"job": "daily_digest", "scheduled_time": "2026-12-01T08:15:00Z"}


def _end_with_squatting(svc: GpuFarm, ir: int, began: datetime, ended: datetime, month: str) -> None:
    """IR-`ir` squatted from `began`, its squatter stopped, and the lease resolved at `ended` (accrued in `month`)."""
    from gpufarm.core.kernel import fields as f
    from gpufarm.core.kernel import history

    part = "on hpc-1/gpu-00000000-0000-4000-8000-000000000001"
    lines = [
        history.entry(began, history.MONITOR, history.Step.SQUATTED, part, "pid 7").line(),
        history.entry(began + timedelta(minutes=20), history.MONITOR, history.Step.SQUATTER_STOPPED, part).line(),
    ]
    incidents = svc.context.incidents
    record = incidents.get_by_ir(ir)
    svc.context.clock.current = ended  # type: ignore[attr-defined]
    old = record.fields.get(f.HISTORY) or []
    fields = {f.HISTORY: [*old, *lines], f.STATE: "resolved", f.GPU_HOURS_MONTHS: [month]}
    incidents.update(record.id, fields)


def test_squatting_on_a_lease_that_ended_since_the_last_digest_is_counted() -> None:
    svc, chat = service()
    ended_today = ask(svc, 8)
    ended_before = ask(svc, 8)
    _end_with_squatting(svc, ended_today, NOW - timedelta(hours=3), NOW - timedelta(hours=1), "2026-12")
    _end_with_squatting(svc, ended_before, SINCE - timedelta(hours=5), SINCE - timedelta(hours=2), "2026-11")
    searches = svc.context.incidents.searches  # type: ignore[attr-defined]
    before = len(searches)
    result = run.run(svc.context, at=NOW)
    assert result.posted and result.sections["Squatters on leased devices"] >= 1
    [post] = [s for s in chat.sent if s.kind == "post" and "GPU farm digest" in s.text]
    shown = json.dumps(post.blocks)
    # The lease that ended in the window counts (one episode, its stop); the one that ended before does not.
    assert "1 episode(s), 1 stopped" in shown
    # One search of the ended leases, narrowed to the window's months (the window crosses November's end).
    ended = [q for q in searches[before:] if q.states == frozenset({State.RESOLVED}) and not q.fields]
    assert [q.months for q in ended] == [("2026-11", "2026-12")]
    # Only what ended since the window began is kept from that read.
    assert [a.ir for a in run.ended_squatted(svc.context, SINCE, NOW)] == [ended_today]


def test_the_ended_leases_read_for_the_digest_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    svc, _ = service()
    for _ in range(3):
        _end_with_squatting(svc, ask(svc, 8), NOW - timedelta(hours=3), NOW - timedelta(hours=1), "2026-12")
    assert len(run.ended_squatted(svc.context, SINCE, NOW)) == 3
    monkeypatch.setattr(run, "MAX_ENDED", 2)
    assert len(run.ended_squatted(svc.context, SINCE, NOW)) == 2
    assert run.window_months(SINCE, NOW) == ["2026-11", "2026-12"]


# -- the outlook beside the news (gpufarm.core.digest.outlook) -----------------------------------------------------


def test_the_outlook_names_the_pool_with_the_most_unmet_demand_and_when_capacity_runs_out() -> None:
    from gpufarm.core.kernel.lease_facts import LeaseFacts

    queued = lease(
        Phase.WAITING,
        waiting_since=NOW - timedelta(hours=5),
        history=(f"{isoformat(NOW - timedelta(hours=5))} gpufarm waiting: 1 of 1 [queued-capacity]",),
    )
    # Two leases of 8 until day 10 fill the 16 GPUs: this week has none free.
    held = [lease(expires_at=NOW + timedelta(days=10)) for _ in range(2)]
    refused = LeaseFacts(
        ir=7,
        state=State.RESOLVED,
        phase=Phase.REJECTED,
        environment="cloud",
        gpu_model="A100",
        gpu_count=2,
        history=(f"{isoformat(NOW - timedelta(hours=1))} policy refused: over the hard limit [refused-policy]",),
    )
    text = text_of(digest_of([queued, *held], unmet=[refused]))
    outlook = text.split("*Outlook*\n")[1]
    assert outlook.startswith("• Most unmet demand: `hpc` H100, 40.0 GPU-hours waited by 1 request(s), 0 refused")
    assert "• Capacity runs out first in `hpc` H100 the week of 2026-12-01 (0 free at its busiest moment)" in outlook


def test_the_outlook_says_when_nothing_is_unmet_and_capacity_lasts() -> None:
    warned = lease(Phase.IDLE_WARNED, idle_warned_at=NOW - timedelta(minutes=20))
    text = text_of(digest_of([warned]))
    assert "• No unmet demand since the last digest" in text
    assert "• Capacity does not run out in the next four weeks in any pool" in text


# -- the day in money ----------------------------------------------------------------------------------------------


def test_the_day_in_money_names_the_top_wasted_cost_beside_the_news_never_as_news() -> None:
    card = RateCard(
        parse_farm(
            FARM_YAML + "rates:\n  currency: USD\n  environments:\n    hpc: {per_gpu_hour: {H100: 2.00}}\n"
        ).rates
    )
    held = {"hosts": ("hpc-1",), "host_gpus": {"hpc-1": 8}, "allocated_at": SINCE, "hours_until": NOW}
    day = ("2026-11=192.000",)
    # 192 GPU-h each over the day: the first wasted 60 idle + 20 idle-held, the second 10 idle; the third is unpriced.
    wasteful = lease(
        team="nlp", hours_held=192, hours_busy=112, hours_idle=80, hours_idle_held=20, hours_by_month=day, **held
    )
    careful = lease(team="vision", hours_held=192, hours_busy=182, hours_idle=10, hours_by_month=day, **held)
    cloud = lease(team="vision", environment="cloud", hours_held=192, hours_idle=192, hours_by_month=day, **held)
    # Money alone is no news: a farm with nothing else to say posts nothing.
    assert build(facts([wasteful, careful, cloud], card=card), SETTINGS, LINKS) is None
    text = text_of(digest_of([wasteful, careful, cloud, lease(Phase.REQUESTED)], card=card))
    assert "*The day in money (idle + idle-held is wasted)*" in text
    assert (
        "576.0 GPU-h held (768.00 USD): 294.0 busy (588.00), 262.0 idle (140.00), 20.0 idle-held (40.00), "
        "0.0 unmeasured (0.00); 1 lease(s) unpriced" in text
    )
    first = text.index(f"IR-{wasteful.ir} nlp/llm: 160.00 USD wasted (80.0 idle and idle-held GPU-h)")
    assert first < text.index(f"IR-{careful.ir} vision/llm: 20.00 USD wasted")
    assert "Teams by wasted cost: `nlp` 160.00 USD (80.0 GPU-h), `vision` 20.00 USD (202.0 GPU-h)" in text
    # Without a rate card the section is left out.
    assert "The day in money" not in text_of(digest_of([wasteful, lease(Phase.REQUESTED)]))
