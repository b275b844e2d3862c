"""The operators' daily digest: what needs an operator's eye today, built from one read of the farm; pure.

Its news: waiting requests with their age, idle warnings and keeps, exemptions and leases ending within the
horizon, busy GPUs no lease claims, squatting on leased devices (episodes, stops, device-hours, top hosts:
gpufarm.core.squatters.counts; the live leases and those that ended in the window), the drift the sync repaired
since the last digest (the live leases' `repaired` history entries: state lives in incident fields only,
docs/design.md rule 1), and quota and budget pressure. Free capacity per pool is shown beside the news, never as
news itself: **a digest with no news is not posted**. Every lease line links to its incident
(gpufarm.core.chat.links). Each section shows at most MAX_LINES lines and says how many more there are, so the
message stays inside Slack's limits whatever the farm's size.

The reads live in gpufarm.core.digest.run; everything here is a function of `DigestFacts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gpufarm.core.accounting.budget_text import figure
from gpufarm.core.accounting.budgets import Burn
from gpufarm.core.accounting.overrides import Override
from gpufarm.core.chat.block_kit import MAX_SECTION_TEXT, Message, context, section
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.chat.links import Links
from gpufarm.core.config.digest import DigestSettings
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.digest import quota_changes, wasted
from gpufarm.core.digest.outlook import TITLE as OUTLOOK_TITLE
from gpufarm.core.digest.outlook import outlook_lines
from gpufarm.core.kernel import history
from gpufarm.core.kernel.display import visible
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.leases import terms
from gpufarm.core.leases.ordering import FIFO, Order
from gpufarm.core.money.card import RateCard
from gpufarm.core.squatters import counts as squatting

MAX_LINES = 15
MAX_LINE_CHARS = 240
HEADER_CHARS = 150  # Slack's header block takes at most 150 characters
ASKED_PHASES = frozenset({Phase.REQUESTED})


@dataclass(frozen=True)
class QuotaUse:
    """A team's holdings of one model in one pool against its quota."""

    team: str
    environment: str
    gpu_model: str
    used: int
    entitled: int
    hard_limit: int | None = None

    @property
    def percent(self) -> float:
        """Share of the quota held (100 and more: at or past the quota)."""
        return 100.0 * self.used / self.entitled if self.entitled else (100.0 if self.used else 0.0)


@dataclass(frozen=True)
class DigestFacts:
    """Everything one digest is built from, read once (gpufarm.core.digest.run.gather)."""

    now: datetime
    # The window of "since the last digest": the previous digest's time up to this one's.
    since: datetime
    until: datetime
    leases: Sequence[Allocation]
    farm: FarmConfig
    # Leases that ended in the window (their squatting counts with the live ones', their hours with the day's).
    ended: Sequence[Allocation] = ()
    # Free and total GPUs per (pool, model).
    capacity: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    quotas: Sequence[QuotaUse] = ()
    # None: the budgets could not be read (said in the digest, never taken for "no pressure").
    burns: Sequence[Burn] | None = ()
    # Busy GPUs no lease claims, the peak since the last digest per (host, team, pool); None: not measured.
    unattributed: Mapping[tuple[str, str, str], float] | None = field(default_factory=dict)
    # Quota changes in effect (gpufarm.core.accounting.overrides), for their own section.
    changes: Sequence[Override] = ()
    # The order of each fair-share pool's queue per (pool, model) (gpufarm.core.leases.ordering); FIFO where absent.
    orders: Mapping[tuple[str, str], Order] = field(default_factory=dict)
    # Requests that ended with a reason in the window's months (refused, withdrawn), for the outlook's unmet demand.
    unmet: Sequence[LeaseFacts] = ()
    # The rate card, for the day in money (gpufarm.core.digest.wasted); None: no money section.
    card: RateCard | None = None


@dataclass(frozen=True)
class Section:
    """One titled part of the digest; `news` sections decide whether the digest is posted at all."""

    title: str
    lines: list[str]
    news: bool = True
    # How many lines there are when only the first MAX_LINES were formatted (None: all of `lines`).
    total: int | None = None

    @property
    def count(self) -> int:
        """How many lines the section has (shown or not)."""
        return self.total if self.total is not None else len(self.lines)


@dataclass(frozen=True)
class Digest:
    """The message to post and how many lines each of its news sections has."""

    message: Message
    counts: dict[str, int]


def build(facts: DigestFacts, settings: DigestSettings, links: Links) -> Digest | None:
    """The digest, or None when there is nothing to say."""
    clock = _Clock(facts.now, settings.zone())
    horizon = facts.now + timedelta(hours=settings.horizon_hours)
    live = [a for a in facts.leases if a.state is not State.RESOLVED]
    drifted, drift_total = drift_lines(live, facts.since, facts.until, links, clock)
    parts = [
        Section("Waiting requests", waiting_lines(live, facts, links, clock)),
        Section("Idle warnings", idle_lines(live, facts, links, clock)),
        Section("Kept after an idle warning", keep_lines(live, facts, links, clock)),
        Section(f"Exemptions ending within {settings.horizon_hours} h", exemption_lines(live, horizon, links, clock)),
        Section(f"Leases ending within {settings.horizon_hours} h", ending_lines(live, horizon, links, clock)),
        Section("Unattributed use (busy GPUs no lease claims)", unattributed_lines(facts.unattributed)),
        Section("Squatters on leased devices", squatter_lines(squatter_tally(facts))),
        Section("Drift the sync repaired", drifted, total=drift_total),
        Section("Quota and budget pressure", pressure_lines(facts, settings)),
        Section(quota_changes.TITLE, quota_changes.lines(facts.changes, live, facts.now)),
    ]
    news = [p for p in parts if p.count and p.news]
    if not news:
        return None
    capacity = Section("Free capacity (free / total GPUs)", capacity_lines(facts.capacity), news=False)
    money = Section(wasted.TITLE, _money_lines(facts), news=False)
    ahead = outlook_lines(live, facts.unmet, facts.capacity, since=facts.since, until=facts.until, now=facts.now)
    shown = [*news, *(p for p in (money, capacity) if p.lines), Section(OUTLOOK_TITLE, ahead, news=False)]
    title = f"GPU farm digest, {clock.day(facts.until)}"[:HEADER_CHARS]
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": title}}]
    blocks += [section(_text(p)) for p in shown]
    since = clock.moment(facts.since)
    blocks.append(context(f"Since the last digest ({since}); times in {settings.timezone}."))
    summary = ", ".join(f"{p.title.lower()}: {p.count}" for p in news)
    return Digest(Message(f"{title}: {summary}", blocks), {p.title: p.count for p in news})


# -- the sections --------------------------------------------------------------------------------------------------


def waiting_lines(live: Iterable[Allocation], facts: DigestFacts, links: Links, clock: _Clock) -> list[str]:
    """Requests waiting for an operator or for hosts, the longest waiting first."""
    rows: list[tuple[datetime, str]] = []
    pending = [a for a in live if a.phase in ASKED_PHASES or a.phase in terms.WAITING]
    places = queue_places(pending, facts.orders)
    for alloc in pending:
        since = terms.waiting_since(alloc) or facts.now
        if alloc.phase in ASKED_PHASES:
            what = "awaiting an operator's decision"
        elif alloc.phase is Phase.WAITING:
            what = f"waiting for hosts ({inert(places[alloc.ir])})"
        else:
            what = "approved, hosts being allocated"
        rows.append((since, f"{_lease(alloc, links)}: {what} for {clock.age(since)}"))
    return [line for _, line in sorted(rows, key=lambda row: row[0])]


def queue_places(
    pending: Iterable[Allocation], orders: Mapping[tuple[str, str], Order] | None = None
) -> dict[int, terms.Position]:
    """Each waiting request's place in its pool's queue for its model, for all of them at once, in the pool's order
    (`orders`; first come, first served by IR where a pool has none), as gpufarm.core.leases.terms.position counts."""
    queues: dict[tuple[str, str], list[Allocation]] = {}
    for alloc in pending:
        if alloc.phase is Phase.WAITING:
            queues.setdefault((alloc.environment or "", (alloc.gpu_model or "").upper()), []).append(alloc)
    places: dict[int, terms.Position] = {}
    for pool, queue in queues.items():
        ranked = (orders or {}).get(pool, FIFO).ranked(queue)
        for place, alloc in enumerate(ranked, 1):
            places[alloc.ir] = terms.Position(place, len(ranked), pool[1] or "its model")
    return places


def idle_lines(live: Iterable[Allocation], facts: DigestFacts, links: Links, clock: _Clock) -> list[str]:
    """Leases warned as idle, with when the grace ends and they are reclaimed unless kept or busy again."""
    out = []
    warned = sorted((a for a in live if a.phase is Phase.IDLE_WARNED), key=lambda a: a.idle_warned_at or facts.now)
    for alloc in warned:
        at = alloc.idle_warned_at
        if at is None:
            out.append(f"{_lease(alloc, links)}: warned as idle")
            continue
        grace = timedelta(minutes=facts.farm.idle.grace_for(alloc.environment, alloc.team))
        out.append(
            f"{_lease(alloc, links)}: warned {clock.age(at)} ago, reclaimed {clock.until(at + grace)}"
            " unless kept or busy again"
        )
    return out


def keep_lines(live: Iterable[Allocation], facts: DigestFacts, links: Links, clock: _Clock) -> list[str]:
    """Leases whose requester kept them after an idle warning, while the hold lasts."""
    out = []
    kept = [a for a in live if a.kept_until is not None and a.kept_until > facts.now]
    for alloc in sorted(kept, key=lambda a: (a.kept_until, a.ir)):
        assert alloc.kept_until is not None
        most = facts.farm.keeps.policy(alloc.environment, alloc.team).max_keeps
        out.append(
            f"{_lease(alloc, links)}: keep {alloc.keep_count} of {most}, held off {clock.until(alloc.kept_until)}"
        )
    return out


def exemption_lines(live: Iterable[Allocation], horizon: datetime, links: Links, clock: _Clock) -> list[str]:
    """Exemptions from idle reclaim that end before the horizon."""
    out = []
    ending = [a for a in live if a.exempt_until is not None and clock.now < a.exempt_until <= horizon]
    for alloc in sorted(ending, key=lambda a: (a.exempt_until, a.ir)):
        assert alloc.exempt_until is not None
        by = f" (granted by {mention(alloc.exempt_by)})" if alloc.exempt_by else ""
        out.append(f"{_lease(alloc, links)}: exempt from idle reclaim {clock.until(alloc.exempt_until)}{by}")
    return out


def ending_lines(live: Iterable[Allocation], horizon: datetime, links: Links, clock: _Clock) -> list[str]:
    """Leases holding hosts whose end comes before the horizon."""
    out = []
    ending = [
        a for a in live if a.phase in HOLDING and a.expires_at is not None and clock.now < a.expires_at <= horizon
    ]
    for alloc in sorted(ending, key=lambda a: (a.expires_at, a.ir)):
        assert alloc.expires_at is not None
        who = f", {mention(alloc.requester)}" if alloc.requester else ""
        out.append(f"{_lease(alloc, links)}{who}: ends {clock.until(alloc.expires_at)}")
    return out


def unattributed_lines(unattributed: Mapping[tuple[str, str, str], float] | None) -> list[str]:
    """Hosts where busy GPUs carry no lease, the most first; a failed measurement is said, not hidden."""
    if unattributed is None:
        return []
    rows = sorted(
        ((busy, host, team, env) for (host, team, env), busy in unattributed.items() if busy > 0), reverse=True
    )
    out = []
    for busy, host, team, env in rows:
        owner = f"team `{inert(team)}`" if team and team != "none" else "no team tag"
        pool = f"`{inert(env)}`" if env and env != "none" else "no pool"
        out.append(f"`{inert(host)}` ({owner}, {pool}): up to {_gpus(busy)} busy with no lease")
    return out


def squatter_tally(facts: DigestFacts) -> squatting.SquatterTally:
    """The window's squatting on the live leases and on those that ended in it, each lease once (an ended one's
    record wins: it is the later read)."""
    leases = {a.ir: a for a in facts.leases} | {a.ir: a for a in facts.ended}
    return squatting.tally(leases.values(), facts.since, facts.until)


def squatter_lines(day: squatting.SquatterTally) -> list[str]:
    """Squatting episodes begun, stops, squatted device-hours and the hosts with the most (gpufarm.core.squatters)."""
    if not day.episodes and not day.device_hours:
        return []
    top = ", ".join(f"{inert(host)} {hours:.1f} h" for host, hours in day.top_hosts(3))
    lines = [f"{day.episodes} episode(s), {day.stops} stopped, {day.device_hours:.1f} device-hours squatted"]
    return lines + ([f"most on {top}"] if top else [])


def drift_lines(
    live: Iterable[Allocation], since: datetime, until: datetime, links: Links, clock: _Clock
) -> tuple[list[str], int]:
    """What the sync restored on the live leases between the last digest and this one (their history), oldest
    first: the first MAX_LINES formatted, and how many there are."""
    marker = f" {history.Step.REPAIRED.value}"
    # Entries start with their time as isoformat writes it (fixed width, UTC), so text order is time order.
    first, last = isoformat(since), isoformat(until)
    found: list[tuple[datetime, int, str, Allocation]] = []
    for alloc in live:
        for line in alloc.history:
            if marker not in line or not first <= line[: len(first)] <= last:
                continue  # most entries are other steps or other days: not worth parsing
            entry = history.parse(line)
            if entry is None or entry.step != history.Step.REPAIRED.value or not since <= entry.at < until:
                continue
            found.append((entry.at, alloc.ir, entry.details, alloc))
    found.sort(key=lambda row: (row[0], row[1]))
    shown = [f"{_link(a, links)} {clock.moment(at)}: {inert(details)}" for at, _, details, a in found[:MAX_LINES]]
    return shown, len(found)


def pressure_lines(facts: DigestFacts, settings: DigestSettings) -> list[str]:
    """Teams at or past `quota_percent` of a quota, budgets past `budget_percent` (or unreadable)."""
    out = []
    for q in sorted(facts.quotas, key=lambda q: (-q.percent, q.team, q.environment, q.gpu_model)):
        if q.entitled <= 0 or q.percent < settings.quota_percent:
            continue
        hard = f", hard limit {q.hard_limit}" if q.hard_limit is not None else ""
        out.append(
            f"`{inert(q.team)}` {inert(q.gpu_model)} in `{inert(q.environment)}`: {q.used} of {q.entitled} quota GPUs "
            f"({q.percent:.0f} %){hard}"
        )
    if facts.burns is None:
        out.append("GPU-hour budgets could not be read")
        return out
    for b in sorted(facts.burns, key=lambda b: (-b.percent, b.budget.label())):
        if b.percent < settings.budget_percent:
            continue
        if b.budget.in_money:
            out.append(f"`{inert(b.budget.label())}` budget for {b.period}: {figure(b)}")
            continue
        out.append(
            f"`{inert(b.budget.label())}` budget for {b.period}: "
            f"{b.burned:,.0f} of {b.budget.limit:,.0f} GPU-hours "
            f"({b.percent:.0f} %), {b.remaining:,.0f} left"
        )
    return out


def _money_lines(facts: DigestFacts) -> list[str]:
    """The day's hours and cost by kind and its top wasted cost, over the live leases and those that ended."""
    if facts.card is None:
        return []
    return wasted.lines([*facts.ended, *facts.leases], facts.card, facts.since, facts.until, facts.now)


def capacity_lines(capacity: Mapping[tuple[str, str], tuple[int, int]]) -> list[str]:
    """Free / total GPUs per pool, its models on one line."""
    by_pool: dict[str, list[str]] = {}
    for (env, model), (free, total) in sorted(capacity.items()):
        by_pool.setdefault(env, []).append(f"{inert(model)} {free} / {total}")
    return [f"`{inert(env)}`: {', '.join(models)}" for env, models in by_pool.items()]


# -- helpers -------------------------------------------------------------------------------------------------------


def _link(alloc: Allocation, links: Links) -> str:
    return f"<{links.incident(alloc.ir)}|{alloc.ir_label}>"


def _lease(alloc: Allocation, links: Links) -> str:
    """`<incident|IR-12> nlp/llm-ko 8xH100 in onprem-hpc`."""
    who = inert("/".join(p for p in (alloc.team, alloc.project) if p) or "unknown team")
    what = f"{alloc.gpu_count}x{inert(alloc.gpu_model or 'GPU')}"
    where = f" in `{inert(alloc.environment)}`" if alloc.environment else ""
    return f"{_link(alloc, links)} {who} {what}{where}"


def _gpus(value: float) -> str:
    number = f"{value:.1f}".removesuffix(".0")
    return f"{number} GPU" if number == "1" else f"{number} GPUs"


def _text(part: Section) -> str:
    """A section's mrkdwn: its title, at most MAX_LINES bullet lines, and how many more there are."""
    lines = [f"• {_cut(line)}" for line in part.lines[:MAX_LINES]]
    if part.count > len(lines):
        lines.append(f"… and {part.count - len(lines)} more")
    title = f"*{part.title}* ({part.count})" if part.news else f"*{part.title}*"
    text = title + "\n" + "\n".join(lines)
    return text if len(text) <= MAX_SECTION_TEXT else text[: MAX_SECTION_TEXT - 2] + " …"


def _cut(line: str) -> str:
    """One bullet line as data: the incident fields in it (any can be edited by hand in Datadog) cannot start a
    new line, steer the text's direction or run past MAX_LINE_CHARS (gpufarm.core.kernel.display)."""
    return visible(line, MAX_LINE_CHARS)


@dataclass(frozen=True)
class _Clock:
    """Ages and moments as the digest shows them, in the digest's timezone."""

    now: datetime
    zone: ZoneInfo

    def moment(self, at: datetime) -> str:
        """`2026-12-01 08:00`, local."""
        return at.astimezone(self.zone).strftime("%Y-%m-%d %H:%M")

    def day(self, at: datetime) -> str:
        """`Tue 2026-12-01 08:00 UTC`, local with the zone's abbreviation."""
        return at.astimezone(self.zone).strftime("%a %Y-%m-%d %H:%M %Z")

    def age(self, since: datetime) -> str:
        """`3 h 20 m` since a moment (0 m for one in the future)."""
        return _span(self.now - since)

    def until(self, at: datetime) -> str:
        """`in 5 h 10 m (2026-12-01 13:10)`, or `now` once past."""
        if at <= self.now:
            return f"now (due {self.moment(at)})"
        return f"in {_span(at - self.now)} ({self.moment(at)})"


def _span(delta: timedelta) -> str:
    minutes = max(0, int(delta.total_seconds() // 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {mins} m"
    return f"{mins} m"
