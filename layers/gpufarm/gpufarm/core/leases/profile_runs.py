"""Profiler runs on a lease: who may upload one, how it is recorded, and how the lease lists its runs.

A run is recorded as one `profiled` entry of the incident's history (gpufarm.core.kernel.history), written by the
pool's one writer (an IncidentCommand with op `profile`, docs/design.md rule 7) only after the run's trace and
page are both stored; so an upload that failed halfway leaves the incident as it was, and a redelivered
command appends nothing (gpufarm.core.commands.record). The entry names the run and carries its signed page link:
`profiled: run run-7; 5 steps, 301.2 ms/step; <link>`. `/gpu status` lists these entries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.escape import inert
from gpufarm.core.chat.links import Links
from gpufarm.core.chat.messages import lease_note
from gpufarm.core.governance.membership import Membership
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import Conflict, NotAllowed, ValidationFailed
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.ports import Clock, IncidentStore
from gpufarm.core.kernel.serial import ProfileScope

RUN_PREFIX = "run "
_LINK_RUN = re.compile(r"/profiles/ir-[0-9]+/([a-z0-9][a-z0-9_.-]{0,62})-[0-9]{8}t[0-9]{6}z\?")


def check_uploader(alloc: Allocation, user: str, membership: Membership) -> None:
    """Refuse an upload to a resolved lease, or by someone not on it (its requester or a member of its team)."""
    if alloc.state is State.RESOLVED:
        raise Conflict(f"{alloc.ir_label} has ended ({alloc.phase.value}); profiler runs go on an open lease")
    if user == alloc.requester:
        return
    if alloc.team and membership.farm.membership_checked and membership.is_member(user, alloc.team):
        return
    raise NotAllowed(f"only {alloc.ir_label}'s requester or members of team {alloc.team or '(none)'} can upload runs")


def entry(at: datetime, actor: str, scope: ProfileScope) -> history.Entry:
    """The run's history entry; the brief figures, then the run's name (its link's key names it too) are left out
    before the link would be cut (ValidationFailed when even the link does not fit one entry: the upload checks
    this before storing anything)."""
    named = f"{RUN_PREFIX}{scope.run}"
    for parts in ((named, scope.summary, scope.link), (named, scope.link), (scope.link,)):
        step = history.entry(at, actor, Step.PROFILED, *parts)
        if len(step.line()) < history.MAX_ENTRY_CHARS:
            return step
    raise ValidationFailed("name", "the run's name and link do not fit the lease's history; use a shorter --name")


def record(
    incidents: IncidentStore,
    clock: Clock,
    alloc: Allocation,
    actor: str,
    scope: ProfileScope,
    *,
    links: Links | None = None,
) -> Message:
    """Append the run to the lease's history (the one writer's step for op `profile`); the answer names the link."""
    if alloc.state is State.RESOLVED:
        raise Conflict(f"{alloc.ir_label} has ended ({alloc.phase.value}); the run was stored but not recorded")
    step = entry(clock.now(), actor, scope)
    incidents.update(alloc.incident_id, {f.HISTORY: history.appended(alloc.history, step)})
    return recorded_reply(alloc, scope, links)


def recorded_reply(alloc: Allocation, scope: ProfileScope, links: Links | None = None) -> Message:
    """What the uploader reads once the run is on the lease."""
    # Everything in a profile command comes from the uploader, the link included (Slack links the bare URL, its
    # `&amp;` read back as `&`).
    run, summary, link = inert(scope.run), inert(scope.summary), inert(scope.link)
    text = f"{alloc.ir_label}: profiler run {run} recorded ({summary}). Summary: {link}"
    return lease_note(alloc, text, links)


@dataclass(frozen=True)
class Run:
    """One recorded run, as the history holds it."""

    at: str
    actor: str
    run: str
    details: str
    link: str


def runs(lines: Sequence[str]) -> list[Run]:
    """The lease's recorded runs, oldest first (from its history's `profiled` entries)."""
    out: list[Run] = []
    for line in lines:
        entry = history.parse(line)
        if entry is None or entry.step != Step.PROFILED.value:
            continue
        parts = entry.details.split("; ")
        link = parts[-1] if parts[-1].startswith(("http://", "https://")) else ""
        named = parts[0].startswith(RUN_PREFIX)
        name = parts[0].removeprefix(RUN_PREFIX) if named else _run_of(link)
        middle = "; ".join(parts[1 if named else 0 : -1 if link else None])
        out.append(Run(isoformat(entry.at), entry.actor, name, middle, link))
    return out


def _run_of(link: str) -> str:
    """The run's name from its link (`.../profiles/ir-12/<run>-<stamp>?...`), or '?'."""
    match = _LINK_RUN.search(link)
    return match.group(1) if match else "?"
