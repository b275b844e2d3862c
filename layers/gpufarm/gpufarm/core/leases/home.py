"""The App Home tab: read what a user's Home shows, publish it, and refresh it after each change to their leases.

Published when the user opens the tab (Slack's `app_home_opened` event, through the worker) and after every unit
of pool work that wrote a lease (`refreshed`, around the allocation queue's consumer; not after the sync's hourly
accruals, `refreshes`): the Home of each requester
whose lease that work wrote is published once, however many writes the work made, so a change costs at most one
`views.publish` per user it touched (bounded by MAX_REFRESHED_USERS for work that writes many leases, the sync's
repairs). What the work wrote wins over the search, whose index may not show the write yet. A failed publish is
logged and never fails the work: the incident already holds the change, and the next change or opening of the tab
publishes again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from gpufarm.core.accounting import budgets
from gpufarm.core.accounting.quota import budget_lines
from gpufarm.core.chat.home import HomeData, Waiting, home_view
from gpufarm.core.chat.messages import QuotaRow
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance.policy import team_usage
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IncidentCommand, Op
from gpufarm.core.leases import fair_share, queries, terms

log = logging.getLogger(__name__)

MAX_REFRESHED_USERS = 20
T = TypeVar("T")


# What the operators' part of the Home reads: the queue (undecided, approved, waiting) and the leases warned idle.
QUEUE_PHASES = frozenset({Phase.REQUESTED, *terms.WAITING})
WATCHED_PHASES = QUEUE_PHASES | {Phase.IDLE_WARNED}


@invocation
def home(ctx: LeaseContext, user: str, written: Mapping[int, Allocation] | None = None) -> HomeData:
    """What `user`'s Home shows now; `written`: leases just written, which win over the search.

    Each part reads only its own (docs/design.md, "Reads per invocation"): the user's leases through the requester
    facet, each of their teams' leases through the team facet (the quota's use and the budget's burn share it), the
    queue positions of their waiting requests per pool, and for an operator the leases in the queue's and the idle
    warning's phases; so a Home costs the same whatever else the farm holds.
    """
    changed = dict(written or {})
    mine = _merged(ctx.reads().requested_by(user), changed, lambda a: a.requester == user)
    operator, teams, notes = _who(ctx, user, mine)
    quotas = _quotas(ctx, teams, changed)
    spent, unread = _budgets(ctx, user, teams)
    notes = [*notes, *unread]
    watched = _merged(ctx.live(phases=WATCHED_PHASES), changed, lambda a: a.phase in WATCHED_PHASES) if operator else []
    # The user's reservations booked and not begun are listed with their waits (gpufarm.core.calendar).
    waiting_mine = [a for a in mine if a.phase in QUEUE_PHASES or a.phase is Phase.RESERVED]
    return HomeData(
        user=user,
        now=ctx.now(),
        leases=sorted((a for a in mine if a.phase in HOLDING), key=lambda a: -a.ir),
        waiting=_reasons(ctx, waiting_mine, watched if operator else None),
        quotas=quotas,
        budgets=spent,
        operator=operator,
        queue=_reasons(ctx, [a for a in watched if a.phase in QUEUE_PHASES], watched),
        idle_warned=[a for a in watched if a.phase is Phase.IDLE_WARNED],
        links=ctx.links_for,
        notes=notes,
    )


def _quotas(ctx: LeaseContext, teams: Sequence[str], changed: Mapping[int, Allocation]) -> list[QuotaRow]:
    """Each of the teams' quotas with what the team holds now (its live leases, this change's in their place)."""
    rows = []
    for name in teams:
        if name not in ctx.farm.teams:
            continue
        held = _merged(_team_leases(ctx, name), changed, _of_team(name))
        rows += [
            QuotaRow(name, env, model, q.gpus, q.hard_limit, team_usage(held, name, env, model, charge=ctx.held))
            for env, models in sorted(ctx.farm.teams[name].quotas.items())
            for model, q in sorted(models.items())
        ]
    return rows


def _team_leases(ctx: LeaseContext, team: str) -> list[Allocation]:
    """The team's live leases in the pools its quotas name (all a quota row counts): answered from the pools this
    invocation has read already when one of them is (the pool's writer read it whole to decide: a booking), the
    other pools then by one search; else one search through the team facet."""
    pools = sorted(ctx.farm.teams[team].quotas)
    if not any(ctx.reads().holds_scope(env) for env in pools):
        return ctx.live(team=team)
    return ctx.reads().live_in_pools(team, pools)


def _budgets(ctx: LeaseContext, user: str, teams: Sequence[str]) -> tuple[list[str], list[str]]:
    """The teams' budget lines, and a note when the budgets could not be read (the Home shows the rest)."""
    try:
        burned = budgets.burns(ctx, [b for b in ctx.farm.budgets if b.team in teams])
    except UpstreamError as exc:
        log.warning("budgets unavailable for %s's Home: %s", user, exc)
        return [], ["Budgets could not be read now."]
    return [line for team in teams for line in budget_lines(burned, team)], []


def _of_team(team: str) -> Callable[[Allocation], bool]:
    return lambda alloc: alloc.team == team


def _merged(
    found: Iterable[Allocation], changed: Mapping[int, Allocation], keep: Callable[[Allocation], bool]
) -> list[Allocation]:
    """`found` with what this change wrote in its place: a written lease still live and in scope replaces the one
    found, one that ended or left the scope is dropped; in IR order."""
    by_ir = {a.ir: a for a in found}
    for ir, alloc in changed.items():
        if alloc.state is not State.RESOLVED and not alloc.is_probe and keep(alloc):
            by_ir[ir] = alloc
        else:
            by_ir.pop(ir, None)
    return sorted(by_ir.values(), key=lambda a: a.ir)


def _who(ctx: LeaseContext, user: str, mine: Iterable[Allocation]) -> tuple[bool, list[str], list[str]]:
    """Whether the user is an operator, their teams (membership, else the teams of their leases), and notes."""
    membership = ctx.membership()
    notes: list[str] = []
    held = {a.team for a in mine if a.team}
    try:
        operator = membership.is_operator(user)
    except UpstreamError:
        operator, notes = False, ["Slack could not say who the GPU operators are; the queue is not shown."]
    teams = set(held)
    if ctx.farm.membership_checked:
        try:
            teams |= set(membership.teams_of(user))
        except GpufarmError as exc:
            log.warning("teams of %s unavailable: %s", user, exc)
            notes.append("Your teams could not be read now; the teams of your leases are shown.")
    return operator, sorted(teams), notes


def _reasons(ctx: LeaseContext, waiting: list[Allocation], queue: list[Allocation] | None) -> list[Waiting]:
    """Each waiting request with why it waits: its place in its pool's queue, or the operators' decision. `queue`:
    the live leases in the queue's phases when already read, else each pool's queue is read (queries.positions)."""
    places = _places(ctx, waiting, queue)
    out = []
    for alloc in sorted(waiting, key=lambda a: a.ir):
        if alloc.phase is Phase.REQUESTED:
            asked = _last_details(alloc, Step.ASKED)
            reason = "waiting for a GPU operator's decision" + (f" ({asked})" if asked else "")
        elif alloc.phase is Phase.WAITING:
            reason = "waiting for hosts: " + places.get(alloc.ir, "in its pool's queue")
        elif alloc.phase is Phase.RESERVED and alloc.reserved_from and alloc.reserved_until:
            reason = f"reserved {alloc.reserved_from:%Y-%m-%d %H:%M} to {alloc.reserved_until:%Y-%m-%d %H:%M} UTC"
        else:
            reason = "approved; its hosts are being allocated"
        out.append(Waiting(alloc, reason))
    return out


def _places(ctx: LeaseContext, waiting: list[Allocation], queue: list[Allocation] | None) -> dict[int, str]:
    """Each waiting request's place in its pool's queue, in the pool's order."""
    if queue is None:
        return {ir: str(p) for ir, p in queries.positions(ctx, waiting).items()}

    def pool(a: Allocation) -> tuple[str, str]:
        return a.environment or "", (a.gpu_model or "").upper()

    held = [a for a in waiting if a.phase is Phase.WAITING]
    orders = {key: fair_share.pool_order(ctx, *key) for key in sorted({pool(a) for a in held})}
    return {a.ir: str(terms.position(a, queue, orders[pool(a)])) for a in held}


def _last_details(alloc: Allocation, step: Step) -> str:
    for line in reversed(alloc.history):
        entry = history.parse(line)
        if entry is not None and entry.step == step.value:
            return entry.details[:200]
    return ""


def publish(ctx: LeaseContext, user: str, written: Mapping[int, Allocation] | None = None) -> None:
    """Build `user`'s Home and publish it (views.publish); UpstreamError when Slack or Datadog failed."""
    ctx.chat.publish_home(user, home_view(home(ctx, user, written)))


def refreshes(command: IncidentCommand | None) -> bool:
    """Whether a unit of pool work refreshes the Homes it touches: all but the sync's hourly GPU-hour accruals,
    which write every lease once an hour and change nothing a holder acts on (their Home shows the new hours at
    the next change or opening), so the sync's cost stays what it was."""
    return command is None or command.op is not Op.ACCRUE


def refreshed(ctx: LeaseContext, work: Callable[[], T]) -> T:
    """Run `work`, then publish the Home of each requester whose lease it wrote, once each (see the module)."""
    # One invocation's reads for the work and the Homes after it: a pool the work read whole answers the quota rows
    # of its teams (`_team_leases`); the work's writes update what was read, so the Homes show the farm after it.
    with ctx.reading(), ctx.changes() as written:
        result = work()
        users = sorted({a.requester for a in written.values() if a.requester and not a.is_probe})
        if len(users) > MAX_REFRESHED_USERS:
            log.info(
                "%d Homes changed at once; %d refreshed now, the rest at their next change",
                len(users),
                MAX_REFRESHED_USERS,
            )
        for user in users[:MAX_REFRESHED_USERS]:
            try:
                publish(ctx, user, written)
            except GpufarmError as exc:
                log.warning("could not refresh %s's Home: %s", user, exc)
    return result
