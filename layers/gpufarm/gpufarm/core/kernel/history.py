"""The audit trail of a lease: an append-only incident field, one compact line per step.

Datadog's incident API has no public timeline endpoint (only `initial_cells` at creation; docs/datadog.md,
"Incidents (v2)"), so the trail lives in the textarray field `gpufarm_history` (docs/design.md, "The audit
trail"). Every entry is `<time> <actor> <step>: <details>` (`2026-12-01T14:00:00Z U0DANA rejected: reason: no
budget left`), written in the same PATCH as the state change it records, by the pool's one writer (rule 7); a
redelivered command is answered from the ledger and appends nothing (gpufarm.core.commands.record).

Bounded: an entry is at most MAX_ENTRY_CHARS, the field at most MAX_ENTRIES entries and MAX_CHARS characters.
Past either bound the oldest entries after the first (the request) are folded into one `summary` entry that
counts them by step and names the span they covered; nothing is dropped without a trace and no kept entry is
ever changed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpufarm.core.kernel.field_values import isoformat, parse_time

MAX_ENTRY_CHARS = 300
MAX_ENTRIES = 64
MAX_CHARS = 12_000
# Folding leaves room for this many more entries, so a long lease does not fold on every write.
FOLD_TO_ENTRIES = 48
FOLD_TO_CHARS = 9_000

# Actors that are not people: the policy, the idle monitors, the scheduled sync, Datadog itself.
POLICY = "policy"
MONITOR = "monitor"
SYNC = "sync"
DATADOG = "datadog"
GPUFARM = "gpufarm"
SYSTEM_ACTORS = frozenset({POLICY, MONITOR, SYNC, DATADOG, GPUFARM})

_ACTOR_RE = re.compile(r"^(?:[UW][A-Z0-9]{2,20}|[a-z]{2,20})$")
_SUMMARY_RE = re.compile(r"^(\d{1,6}) earlier entries to (\S+)(?:: (.*))?$")


class Step(StrEnum):
    """What happened to a lease."""

    REQUESTED = "requested"
    REFUSED = "refused"
    ASKED = "asked-operators"
    APPROVED = "approved"
    REJECTED = "rejected"
    WAITING = "waiting"
    ALLOCATED = "allocated"
    WARNED = "warned"
    RECOVERED = "recovered"
    KEPT = "kept"
    EXEMPTED = "exempted"
    EXTENDED = "extended"
    RELEASED = "released"
    CANCELLED = "cancelled"
    RECLAIMED = "reclaimed"
    SHRUNK = (
        "shrunk"  # idle hosts (or devices) given back while the rest of the lease stays (gpufarm.core.idle.partial)
    )
    FREED = "freed"
    REPAIRED = "repaired"
    REMINDED = "reminded"  # the one reminder before a lease's end (gpufarm.core.leases.terms)
    WITHDRAWN = "withdrawn"  # a waiting request past its waiting limit
    PROFILED = "profiled"  # a profiler run uploaded to the lease, with its page link (gpufarm.core.leases.profile_runs)
    SQUATTED = "squatted"  # a squatting episode on a device of the lease began (gpufarm.core.squatters)
    SQUATTER_STOPPED = "squatter-stopped"  # its squatter outlasted the grace: the stop was published on the host
    SQUATTER_CLEARED = "squatter-cleared"  # the episode ended (the squatter monitor's group recovered)
    PROBED = "probed"  # a `gpufarm doctor` probe reached the incident webhook (gpufarm.core.leases.probe)
    PREEMPTING = "preempting"  # a borrowing lease told it is taken back, by when and for whom (leases.preemption)
    BORROWING = "borrowing"  # a lending team's request waits for borrowers, and why (gpufarm.core.leases.preemption)
    EXPIRED = "expired"  # a quota override at its end (gpufarm.core.accounting.overrides)
    SUMMARY = "summary"


@dataclass(frozen=True)
class Entry:
    """One step of a lease's history."""

    at: datetime
    actor: str
    step: str
    details: str = ""

    def line(self, limit: int = MAX_ENTRY_CHARS) -> str:
        """The entry as the field stores it: one line, at most `limit` characters."""
        head = f"{isoformat(self.at)} {_actor(self.actor)} {self.step}"
        details = _one_line(self.details)
        text = f"{head}: {details}" if details else head
        return text if len(text) <= limit else text[: limit - 1] + "…"


def entry(at: datetime, actor: str | None, step: Step, *details: str) -> Entry:
    """An entry whose details are the non-empty parts, joined by '; '."""
    return Entry(at, actor or GPUFARM, step.value, "; ".join(d for d in details if d))


def parse(line: str) -> Entry | None:
    """The entry a stored line holds; None for a line gpufarm did not write."""
    stamp, _, rest = line.partition(" ")
    at = parse_time(stamp)
    actor, _, rest = rest.partition(" ")
    step, _, details = rest.partition(": ")
    if at is None or not _ACTOR_RE.match(actor) or not step or " " in step:
        return None
    return Entry(at, actor, step, details)


def appended(existing: Sequence[str], new: Entry) -> list[str]:
    """The field's value once `new` is added: never an entry changed, the oldest folded past the bounds."""
    lines = [*existing, new.line()]
    if len(lines) <= MAX_ENTRIES and sum(map(len, lines)) <= MAX_CHARS:
        return lines
    return _fold(lines, new.at)


def _fold(lines: list[str], now: datetime) -> list[str]:
    """The first line, one summary of the oldest others, and the newest that fit FOLD_TO_ENTRIES and FOLD_TO_CHARS."""
    first, rest = lines[0], lines[1:]
    folded, counts, start, rest = _earlier_summary(rest)
    newest = _newest_that_fit(first, rest)
    older = rest[: len(rest) - len(newest)]
    if not older and not folded:
        return lines
    return [first, _summary(older, folded, counts, start, now), *newest]


def _earlier_summary(rest: list[str]) -> tuple[int, Counter[str], datetime | None, list[str]]:
    """A summary left by an earlier fold, at the head of `rest`: its count, step counts, start, and what follows it.

    Folding again adds to that summary instead of summarising a summary; with none, nothing is folded yet.
    """
    head = parse(rest[0]) if rest else None
    if head is None or head.step != Step.SUMMARY.value:
        return 0, Counter[str](), None, rest
    folded, counts = _summary_counts(head.details)
    return folded, counts, head.at, rest[1:]


def _newest_that_fit(first: str, rest: list[str]) -> list[str]:
    """The newest lines kept after a fold: at most FOLD_TO_ENTRIES in all, and within FOLD_TO_CHARS.

    Room is left for the first line and a summary of at most MAX_ENTRY_CHARS.
    """
    newest = rest[-(FOLD_TO_ENTRIES - 2) :]
    while newest and len(first) + MAX_ENTRY_CHARS + sum(map(len, newest)) > FOLD_TO_CHARS:
        newest = newest[1:]
    return newest


def _summary(older: list[str], folded: int, counts: Counter[str], start: datetime | None, now: datetime) -> str:
    """The summary line for the `older` lines folded on top of `folded` ones already counted (`counts`).

    It starts at the earlier summary's start, else the first folded entry's time, else now; lines gpufarm did not
    write count as `other`.
    """
    parsed = [parse(line) for line in older]
    counts.update(e.step if e is not None else "other" for e in parsed)
    stamps = [e.at for e in parsed if e is not None]
    start = start or (stamps[0] if stamps else now)
    end = stamps[-1] if stamps else start
    text = f"{folded + len(older)} earlier entries to {isoformat(end)}: " + ", ".join(
        f"{step} {n}" for step, n in sorted(counts.items())
    )
    return Entry(start, GPUFARM, Step.SUMMARY.value, text).line(2 * MAX_ENTRY_CHARS)


def _summary_counts(details: str) -> tuple[int, Counter[str]]:
    """How many entries a summary folded and how many of each step."""
    match = _SUMMARY_RE.match(details)
    counts: Counter[str] = Counter()
    if match is None:
        return 0, counts
    for part in (match.group(3) or "").split(", "):
        step, _, n = part.rpartition(" ")
        if step and n.isascii() and n.isdigit() and len(n) < 7:
            counts[step] += int(n)
    return int(match.group(1)), counts


def shown(lines: Iterable[str], inert: Callable[[str], str], mention: Callable[[str], str]) -> list[str]:
    """Entries as people read them: `2026-12-01 14:00Z @dana rejected: reason: ...` (Slack mrkdwn).

    The field may be edited by hand and its details quote what people typed, so every part of an entry goes
    through `inert` and its actor through `mention` (gpufarm.core.chat.escape, which this package cannot import).
    """
    out: list[str] = []
    for line in lines:
        e = parse(line)
        if e is None:
            out.append(inert(_one_line(line)[:MAX_ENTRY_CHARS]))
            continue
        who = e.actor if e.actor in SYSTEM_ACTORS else mention(e.actor)
        when = isoformat(e.at).replace("T", " ")[:16] + "Z"
        out.append(f"{when} {who} *{inert(e.step)}*" + (f": {inert(e.details)}" if e.details else ""))
    return out


def _actor(actor: str) -> str:
    return actor if _ACTOR_RE.match(actor) else GPUFARM


def _one_line(text: str) -> str:
    """Control characters (newlines included) become spaces, so one entry is one line."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
