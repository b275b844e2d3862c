"""The lifecycle use cases: request, approve, allocate, release, reclaim, expire, idle, sync.

Every method reads the incident fresh, decides, and writes the incident; side effects (host tags, Slack messages)
follow from what the incident says, so re-running a method on the same input converges instead of doing things
twice. Every method that writes an incident must run one at a time per pool: the allocation queue's FIFO group
(the incident webhook's consumer runs allocation, reclaim and the incident commands of gpufarm.core.executor
there; docs/design.md, rule 7). The methods re-check host tags before writing them so even a lapse there never
puts a host in two dedicated allocations.

Reads: each invocation reads through one `Reads` (gpufarm.core.reads; `reading()` opens it, every public method
joins the one open on its thread): live incidents narrowed by facets to the pool or the team in the pool a
decision concerns, the pool's hosts with their tags by source, each searched or listed once and updated by the
invocation's own writes. The sync, its per-pool repairs and the gauges live in gpufarm.core.reconcile.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Concatenate, ParamSpec, TypeVar

from gpufarm.core import (
    accounting,
    agent_usage,
    budgets,
    cards,
    charging,
    history,
    keeps,
    lease_views,
    leases,
    ledger_views,
    lifecycle_metrics,
    partial,
    reconcile,
    views,
)
from gpufarm.core import fields as f
from gpufarm.core.delivery import deliver_warning
from gpufarm.core.errors import Conflict, NotFound, UpstreamError, ValidationFailed
from gpufarm.core.farm import FarmConfig, PoolKind
from gpufarm.core.history import Step
from gpufarm.core.inventory import IR_KEY, GpuHost, tag_values
from gpufarm.core.ir import format_ir, ir_tag_value
from gpufarm.core.lifecycle import Phase, ReclaimReason, State, check_transition, state_for
from gpufarm.core.links import Links
from gpufarm.core.membership import Membership
from gpufarm.core.model import Allocation, GpuRequest, IncidentRecord, encode_host_gpus, isoformat
from gpufarm.core.placement import free_capacity, place, pool_hosts
from gpufarm.core.policy import (
    GRANTED_PHASES,
    POLICY_APPROVER,
    Action,
    Ask,
    Decision,
    Verdict,
    authorize,
    decide_grant,
    extension_days,
    over_hard_limit,
    team_usage,
)
from gpufarm.core.ports import (
    Chat,
    Clock,
    EventSink,
    HostTags,
    IncidentStore,
    InventorySource,
    MetricsQuery,
    MetricsSink,
    WorkQueue,
)
from gpufarm.core.reads import Reads, live_query
from gpufarm.core.reconcile import (
    HOLDING_PHASES,
    Repair,
    SyncReport,
    allocation_tags,
    ir_numbers,
)
from gpufarm.core.serial import IdleScope
from gpufarm.core.sources import down_hosts
from gpufarm.core.units import (
    Devices,
    assign_tags,
    assign_units,
    encode_devices,
    holdings,
    is_assign_of,
    lease_devices,
)
from gpufarm.core.views import Message, QuotaRow

log = logging.getLogger(__name__)

# How many times allocation re-plans after finding a chosen host freshly taken (only a lapse in serialization).
MAX_REPLANS = 3


@dataclass(frozen=True)
class Outcome:
    """What an incident-driven step did, for logs, tests and the sync summary."""

    ir: int
    action: str
    hosts: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{format_ir(self.ir)}: {self.action}" + (f" ({', '.join(self.hosts)})" if self.hosts else "")


P = ParamSpec("P")
R = TypeVar("R")


def _invocation(method: Callable[Concatenate[GpuFarm, P], R]) -> Callable[Concatenate[GpuFarm, P], R]:
    """A use case reads through the invocation's view: the one open on this thread, else its own."""

    @functools.wraps(method)
    def wrapper(self: GpuFarm, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.reading():
            return method(self, *args, **kwargs)

    return wrapper


class GpuFarm:
    """The use cases over the ports; built once per container by the handlers."""

    def __init__(
        self,
        *,
        incidents: IncidentStore,
        hosts: HostTags,
        chat: Chat,
        clock: Clock,
        farm: FarmConfig,
        operators_usergroup: str | None = None,
        operators_channel: str | None = None,
        metrics: MetricsSink | None = None,
        queue: WorkQueue | None = None,
        links: Links | None = None,
        usage: MetricsQuery | None = None,
        sources: Sequence[InventorySource] = (),
        events: EventSink | None = None,
    ) -> None:
        self.incidents = incidents
        self.hosts = hosts
        self.chat = chat
        self.clock = clock
        self.farm = farm
        self.operators_usergroup = operators_usergroup or farm.operators_usergroup
        self.operators_channel = operators_channel or farm.operators_channel
        self.metrics = metrics
        self.queue = queue
        self.links = links or Links()
        # Measured GPU utilisation for the operators' cards (gpufarm.core.cards); None: "utilisation unavailable".
        self.usage = usage
        # Inventory sources besides the registered hosts (AWS, Azure): read by the sync (gpufarm.core.sources).
        self.sources: Sequence[InventorySource] = tuple(sources)
        # The Datadog event stream: the sync posts one event per inventory source it skipped (gpufarm.core.sources).
        self.events = events
        # The view of the invocation running on each thread (the local function host runs several at once).
        self._local = threading.local()

    @contextmanager
    def reading(self) -> Iterator[Reads]:
        """One invocation's reads (gpufarm.core.reads): opened here, or joined when one is open on this thread."""
        current: Reads | None = getattr(self._local, "reads", None)
        if current is not None:
            yield current
            return
        reads = Reads(self.incidents, self.hosts)
        self._local.reads = reads
        # Team membership is read once per user group per invocation too (gpufarm.core.membership).
        self._local.membership = Membership(self.farm, self.chat, self.operators_usergroup)
        try:
            yield reads
        finally:
            self._local.reads = None
            self._local.membership = None

    def membership(self) -> Membership:
        """The invocation's membership lookups (a fresh one outside any invocation)."""
        current: Membership | None = getattr(self._local, "membership", None)
        return current if current is not None else Membership(self.farm, self.chat, self.operators_usergroup)

    def links_for(self, alloc: Allocation) -> Links:
        """The links a message about the lease carries: its incident and its pool's dashboard (core.links)."""
        return self.links.for_environment(self.farm, alloc.environment)

    @_invocation
    def check_requester(self, request: GpuRequest) -> None:
        """NotAllowed unless the requester may charge the request's team; MembershipUnavailable when Slack fails."""
        self.membership().check(request.requester, request.team, f"request GPUs for team {request.team}")

    def _reads(self) -> Reads:
        """The open view, or a fresh one for a single step called outside any invocation."""
        current: Reads | None = getattr(self._local, "reads", None)
        return current if current is not None else Reads(self.incidents, self.hosts)

    # ==== Slack-facing use cases (slack_worker) ==========================================================

    def submit_request(self, request: GpuRequest) -> Message:
        """Create the incident for a request (once per request_id) and decide it now (no queue: one writer)."""
        decision = self.precheck(request)
        if decision.verdict is Verdict.REFUSE:
            return views.refused(decision.reason)
        alloc, undecided = self.create_request(request)
        if not undecided:
            links = self.links_for(alloc)
            granted = alloc.phase is not Phase.REQUESTED
            return views.request_created(alloc, approved=granted, reason="already requested", links=links)
        return self.decide_request(alloc.ir)

    @_invocation
    def precheck(self, request: GpuRequest) -> Decision:
        """The policy's verdict against what is granted now: a refusal here creates no incident (core.policy)."""
        return self._decide(request)

    def create_request(self, request: GpuRequest) -> tuple[Allocation, bool]:
        """The request's incident in phase requested, created once per request_id; True when it awaits a decision.

        A concurrent duplicate of the same request (two worker invocations) is retired at once: the lowest IR
        carrying the request_id wins and only its creator asks for the decision.
        """
        record = self.incidents.find_by_request_id(request.request_id)
        act = record is not None  # a retry of an attempt that may have died before its decision was asked for
        if record is None:
            requested = history.entry(self.clock.now(), request.requester, Step.REQUESTED, _asked(request))
            created = self.incidents.create(
                request.title(),
                {**request.to_fields(Phase.REQUESTED, self.clock.now()), f.HISTORY: [requested.line()]},
                initial_note=f"Requested from Slack by <@{request.requester}>",
            )
            record = self._first_for(request.request_id, created)
            act = record.id == created.id
            if not act:
                self.incidents.update(
                    created.id,
                    {f.STATE: State.RESOLVED.value, f.PHASE: Phase.REJECTED.value},
                    title=f"{request.title()} (duplicate of {format_ir(record.public_id)})"[:250],
                )
        alloc = Allocation.from_record(record)
        return alloc, act and _undecided(alloc)

    @_invocation
    def decide_request(self, ir: int) -> Message:
        """The policy decision that counts, run in the pool's queue group after every grant committed before it.

        Within quota: approved by policy. Beyond quota but within the hard limit: sent to the operators. Over the
        hard limit now (grants committed since the request's up-front check): refused, the incident closed with
        the reason, rather than left waiting for room the team may never be allowed (docs/design.md, rule 7).
        """
        alloc = self._get(ir)
        if not _undecided(alloc):
            if alloc.state is State.RESOLVED:
                return views.ended_reply(alloc, self.links_for(alloc))
            links = self.links_for(alloc)
            granted = alloc.phase is not Phase.REQUESTED
            return views.request_created(alloc, approved=granted, reason="already decided", links=links)
        model = (alloc.gpu_model or "").upper()
        env = alloc.environment or ""
        ask = Ask(alloc.team or "", env, model, alloc.gpu_count, charge=self._charge(env, model, alloc.gpu_count))
        # The team's grants in this pool and the pool's hosts: nothing else decides a request.
        live = [a for a in self._live(env, ask.team) if a.ir != alloc.ir]
        used = team_usage(live, ask.team, env, model, charge=self._held)
        capacity = self._reads().capacity(env, model, ask.gpu_count, units=self._shared(env))
        decision = decide_grant(ask, self.farm, team_used=used, pool_capacity=capacity)
        days = alloc.duration_days or self.farm.defaults.duration_days
        decision = budgets.gate(self, decision, team=ask.team, project=alloc.project, gpus=ask.charged, days=days)
        if decision.verdict is Verdict.REFUSE:
            self._write(alloc, Phase.REJECTED, {}, step=self._step(history.POLICY, Step.REFUSED, decision.reason))
            title = f"{alloc.title} (refused: {decision.reason})"[:250]
            self._reads().wrote(self.incidents.update(alloc.incident_id, {}, title=title))
            log.info("%s refused by policy: %s", alloc.ir_label, decision.reason)
            return views.policy_refused(alloc, decision.reason, self.links_for(alloc))
        if decision.verdict is Verdict.APPROVE:
            approved = self._step(history.POLICY, Step.APPROVED, decision.reason)
            alloc = self._write(alloc, Phase.APPROVED, {f.APPROVED_BY: POLICY_APPROVER}, step=approved)
            outcome = f"Approved by policy: {decision.reason}"
            self._post_operators(cards.decided_card(alloc, outcome, self.links_for(alloc)))
        else:
            self._ask_operators(alloc, decision.reason)
        granted = decision.verdict is Verdict.APPROVE
        return views.request_created(alloc, approved=granted, reason=decision.reason, links=self.links_for(alloc))

    def _decide(self, request: GpuRequest) -> Decision:
        env = request.environment
        model = request.gpu_model
        used = team_usage(self._live(env, request.team), request.team, env, model, charge=self._held)
        ask = Ask(request.team, env, model, request.gpu_count, charge=self._charge(env, model, request.gpu_count))
        capacity = self._reads().capacity(env, request.gpu_model, request.gpu_count, units=self._shared(env))
        decision = decide_grant(ask, self.farm, team_used=used, pool_capacity=capacity)
        return budgets.gate(
            self, decision, team=ask.team, project=request.project, gpus=ask.charged, days=request.duration_days
        )

    def _first_for(self, request_id: str, created: IncidentRecord) -> IncidentRecord:
        """The oldest live incident carrying this request_id (ours when the search does not show it yet)."""
        # Twins of one request share its pool and team: the search is narrowed to them (gpufarm.core.reads).
        mine = Allocation.from_record(created)
        query = live_query(mine.environment, mine.team)
        same = [r for r in self.incidents.search(query) if r.fields.get(f.REQUEST_ID) == request_id]
        if all(r.id != created.id for r in same):
            same.append(created)
        return min(same, key=lambda r: r.public_id)

    @_invocation
    def approve(self, ir: int, actor: str) -> Message:
        """An operator approves a request beyond quota; the webhook then allocates."""
        authorize(Action.APPROVE, actor, self._operators())
        alloc = self._get(ir)
        self._expect_phase(alloc, Phase.REQUESTED, "approved")
        # Serialized with every other grant of the pool (docs/design.md, rule 7): the hard limit holds for operators.
        model = (alloc.gpu_model or "").upper()
        env = alloc.environment or ""
        ask = Ask(alloc.team or "", env, model, alloc.gpu_count, charge=self._charge(env, model, alloc.gpu_count))
        live = [a for a in self._live(ask.environment, ask.team) if a.ir != alloc.ir]
        used = team_usage(live, ask.team, ask.environment, model, charge=self._held)
        over = over_hard_limit(ask, self.farm, team_used=used)
        if over:
            raise Conflict(f"{alloc.ir_label} cannot be approved: {over}; it stays requested")
        updated = self._write(alloc, Phase.APPROVED, {f.APPROVED_BY: actor}, step=self._step(actor, Step.APPROVED))
        self._update_operator_message(updated, f"Approved by <@{actor}>")
        self._tell(updated.requester, views.approved_notice(updated, actor, self.links_for(updated)))
        return views.approved_reply(updated, self.links_for(updated))

    @_invocation
    def reject(self, ir: int, actor: str, reason: str | None = None) -> Message:
        """An operator rejects a request; the incident is resolved with phase rejected."""
        authorize(Action.REJECT, actor, self._operators())
        alloc = self._get(ir)
        self._expect_phase(alloc, Phase.REQUESTED, "rejected")
        rejected = self._step(actor, Step.REJECTED, f"reason: {reason}" if reason else "no reason given")
        updated = self._write(alloc, Phase.REJECTED, {}, step=rejected)
        self._update_operator_message(updated, f"Rejected by <@{actor}>" + (f": {reason}" if reason else ""))
        self._tell(updated.requester, views.rejected_notice(updated, actor, reason, self.links_for(updated)))
        return views.rejected_reply(updated, self.links_for(updated))

    @_invocation
    def release(self, ir: int, actor: str) -> Message:
        """The requester (or an operator) gives the GPUs back: the incident is resolved; the webhook reclaims."""
        alloc = self._get(ir)
        authorize(Action.RELEASE, actor, self._operators(), alloc)
        self.membership().check(actor, alloc.team, f"release {alloc.ir_label}")
        reason = ReclaimReason.CANCELLED if alloc.phase is Phase.REQUESTED else ReclaimReason.RELEASED
        if actor != alloc.requester:
            reason = ReclaimReason.OPERATOR
        return self._resolve(alloc, reason, by=actor)

    @_invocation
    def force_reclaim(self, ir: int, actor: str, reason: str | None = None) -> Message:
        """An operator takes an allocation back."""
        authorize(Action.FORCE_RECLAIM, actor, self._operators())
        alloc = self._get(ir)
        return self._resolve(alloc, ReclaimReason.OPERATOR, by=actor, note=reason)

    def extend(self, ir: int, actor: str, days: int | None = None) -> Message:
        """Push the expiry out, within the team's max_days."""
        alloc = self._get(ir)
        authorize(Action.EXTEND, actor, self._operators(), alloc)
        self.membership().check(actor, alloc.team, f"extend {alloc.ir_label}")
        if alloc.state is State.RESOLVED or alloc.phase not in GRANTED_PHASES | {Phase.REQUESTED}:
            raise Conflict(f"{_ended(alloc)}; nothing to extend (request GPUs again instead)")
        add = extension_days(alloc, self.farm, days)
        base = alloc.expires_at or self.clock.now()
        expires = base + timedelta(days=add)
        was = isoformat(alloc.expires_at) if alloc.expires_at else "unset"
        updated = self._write(
            alloc,
            alloc.phase,
            {f.EXPIRES_AT: isoformat(expires), f.DURATION_DAYS: str((alloc.duration_days or 0) + add)},
            step=self._step(actor, Step.EXTENDED, f"{was} -> {isoformat(expires)} (+{add} days)"),
        )
        return views.extended_reply(updated, add, self.links_for(updated))

    @_invocation
    def keep(self, ir: int, actor: str) -> Message:
        """The requester answers an idle warning with Keep: back to allocated, warning cleared."""
        alloc = self._get(ir)
        authorize(Action.KEEP, actor, self._operators(), alloc)
        if alloc.state is State.RESOLVED:
            return views.lease_note(alloc, f"{_ended(alloc)}; nothing to keep.", self.links_for(alloc))
        if alloc.phase is not Phase.IDLE_WARNED:
            held = keeps.suppressed(alloc, self.clock.now())
            if held is not None:
                return views.lease_note(alloc, f"{alloc.ir_label} is {held}; nothing to keep.", self.links_for(alloc))
            text = f"{alloc.ir_label} has no idle warning to clear ({alloc.phase.value})."
            return views.lease_note(alloc, text, self.links_for(alloc))
        # Bounded per lease by the keep policy (gpufarm.core.keeps); refused past it, nothing written.
        return keeps.keep(self, alloc, actor, self._warning_cleared())

    @_invocation
    def exempt(self, ir: int, actor: str, days: int | None, reason: str | None) -> Message:
        """An operator exempts a lease from idle reclaim until an end date, with a reason (gpufarm.core.keeps)."""
        alloc = self._get(ir)
        if alloc.state is State.RESOLVED:
            return views.lease_note(alloc, f"{_ended(alloc)}; nothing to exempt.", self.links_for(alloc))
        return keeps.exempt(self, alloc, actor, days=days, reason=reason, cleared=self._warning_cleared())

    def _warning_cleared(self) -> dict[str, object]:
        """The fields an idle warning is cleared by (its time and the parts it named)."""
        return {f.IDLE_WARNED_AT: None, f.IDLE_PARTS: []}

    @_invocation
    def allocation(self, ir: int) -> Allocation:
        """One allocation by IR; NotFound naming the IR."""
        return self._get(ir)

    @_invocation
    def status(self, ir: int) -> Message:
        """One allocation in detail (anyone may look)."""
        alloc = self._get(ir)
        return views.status_message(alloc, self.links_for(alloc))

    @_invocation
    def list_allocations(self, scope: str, user: str, team: str | None = None) -> Message:
        """Live allocations: the user's own, a team's, or all."""
        # Each scope reads only what it shows: a user's own through the requester facet, a team's through the team
        # facet, so a user's list costs the same whatever else the farm holds (docs/design.md, "Reads per invocation").
        if scope == "all":
            everything = sorted(self._live(), key=lambda a: -a.ir)
            return views.list_message("All live allocations", everything, self._positions(everything), self.links_for)
        mine = self._reads().requested_by(user)
        if scope == "team":
            if team is not None:
                self.farm.team(team)
            teams = {team} if team else {a.team for a in mine if a.team}
            if not teams:
                raise ValidationFailed("team", "you hold no allocations; say which team: /gpu list team nlp")
            shown = sorted((a for t in teams for a in self._live(team=t)), key=lambda a: -a.ir)
            title = f"Live allocations of team {', '.join(sorted(t for t in teams if t))}"
            return views.list_message(title, shown, self._positions(shown), self.links_for)
        newest = sorted(mine, key=lambda a: -a.ir)
        return views.list_message("Your live allocations", newest, self._positions(mine), self.links_for)

    @_invocation
    def quota(self, team: str | None = None) -> Message:
        """Quotas and use per team, and free/total GPUs per pool."""
        if team is not None:
            self.farm.team(team)
        live = self._live()
        rows = [
            QuotaRow(name, env, model, q.gpus, q.hard_limit, team_usage(live, name, env, model, charge=self._held))
            for name, spec in sorted(self.farm.teams.items())
            if team is None or name == team
            for env, models in sorted(spec.quotas.items())
            for model, q in sorted(models.items())
        ]
        usage = accounting.measure(self.usage, self.clock.now(), self.farm.ledger, agent_usage.for_farm(self.farm))
        acc = accounting.accounts(live, usage, self._inventory())
        burned = budgets.burns(self, [b for b in self.farm.budgets if team is None or b.team == team])
        return views.quota_message(rows, self._inventory_summary(), ledger_views.quota_lines(acc, burned, team))

    # ==== Incident-driven steps (incident_webhook's queue consumer) ======================================

    @_invocation
    def process(self, incident_id: str) -> list[Outcome]:
        """Act on an incident's current state: allocate when approved/waiting, reclaim when resolved, else nothing."""
        alloc = self._reads().get_by_id(incident_id)
        if alloc.state is State.RESOLVED:
            outcomes = [self.reclaim(alloc)]
            if outcomes[0].action == "reclaimed" and alloc.environment:
                outcomes += self.allocate_waiting(alloc.environment)
            return outcomes
        if alloc.phase in (Phase.APPROVED, Phase.WAITING):
            return [self.allocate(alloc)]
        return [Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")]

    @_invocation
    def allocate(self, alloc: Allocation) -> Outcome:
        """Pick hosts, tag them, write them into the incident; waiting when the pool is full."""
        if alloc.phase not in (Phase.APPROVED, Phase.WAITING) or alloc.state is State.RESOLVED:
            return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")
        env_name, model = alloc.environment or "", (alloc.gpu_model or "").upper()
        env = self.farm.environments.get(env_name)
        if env is None or alloc.gpu_count < 1:
            # Config changed under a live request: nothing can ever be placed; say so rather than loop.
            log.warning("%s names pool %r that the farm configuration lacks", alloc.ir_label, env_name)
            return self._go_waiting(alloc)
        older = [a for a in self._live(env_name, phases={Phase.WAITING}) if a.gpu_model == model and a.ir < alloc.ir]
        if older:
            # First come, first served per model: a newer request does not overtake a waiting one.
            return self._go_waiting(alloc)
        me = ir_tag_value(alloc.ir)
        excluded: set[str] = self._down(env_name)  # silent nodes get nothing (gpufarm.core.sources)
        for _ in range(MAX_REPLANS):
            hosts = [h for h in pool_hosts(self._inventory(env_name), env_name, model) if h.name not in excluded]
            used = self._units_used(env_name, env.kind, hosts, exclude_ir=alloc.ir)
            free = free_capacity(env.kind, hosts, used, holder_ir=me)
            already = frozenset(h.name for h in hosts if me in h.irs)
            plan = place(env.kind, free, alloc.gpu_count, prefer=already)
            devices = self._choose_units(env_name, env.kind, hosts, plan, alloc) if plan else {}
            dedicated = env.kind is PoolKind.DEDICATED
            taken = self._tag_hosts(alloc, plan, dedicated=dedicated, devices=devices) if plan else set()
            if not taken:
                for stray in sorted(already - set(plan or ())):
                    # Left by an earlier attempt that chose differently: this IR does not hold it.
                    self._untag_host(stray, alloc)
                return self._allocated(alloc, plan, devices) if plan else self._go_waiting(alloc)
            excluded |= taken
        raise UpstreamError(f"{alloc.ir_label}: hosts kept being taken while allocating; retrying later")

    @_invocation
    def reclaim(self, alloc: Allocation) -> Outcome:
        """Remove exactly this IR's tags, clear its hosts, phase reclaimed, tell the requester and operators."""
        if alloc.phase in (Phase.REJECTED, Phase.RECLAIMED) and not alloc.hosts:
            return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")
        if alloc.state is not State.RESOLVED:
            return Outcome(alloc.ir, f"nothing to do (still {alloc.state.value})")
        check_transition(alloc.phase, Phase.RECLAIMING)
        me = ir_tag_value(alloc.ir)
        tagged = {h.name for h in self._reads().tagged_with(alloc.ir, alloc.environment) if me in h.irs}
        hosts = sorted(set(alloc.hosts) | tagged)
        for host in hosts:
            self._untag_host(host, alloc)
        reason = alloc.reclaim_reason or ReclaimReason.RESOLVED_IN_DATADOG
        check_transition(Phase.RECLAIMING, Phase.RECLAIMED)
        if alloc.phase is Phase.RECLAIMING:
            freed = self._step(history.GPUFARM, Step.FREED, f"hosts: {', '.join(hosts) or 'none'}")
        else:  # resolved in Datadog's UI: nobody went through gpufarm, so this is where the reclaim is recorded
            freed = self._step(history.DATADOG, Step.RECLAIMED, f"reason: {reason.value}", f"hosts: {', '.join(hosts)}")
        updated = self._write(
            alloc,
            Phase.RECLAIMED,
            {f.HOSTS: [], f.HOST_GPUS: [], **_no_devices(alloc), f.RECLAIM_REASON: reason.value},
            check=False,
            step=freed,
        )
        if alloc.phase is not Phase.RECLAIMED:  # counted once, by the write that reclaimed it
            lifecycle_metrics.reclaimed(self, alloc, reason.value, lifecycle_metrics.held_gpus(alloc))
        if reason is ReclaimReason.WITHDRAWN:
            hours = self.farm.leases.policy(alloc.environment, alloc.team).waiting_max_hours
            message = lease_views.withdrawn(updated, hours, self.links_for(updated))
        else:
            message = views.reclaimed(updated, _reason_text(reason), hosts, self.links_for(updated))
        self._tell(updated.requester, message)
        self._post_operators(message)
        return Outcome(alloc.ir, "reclaimed", tuple(hosts))

    @_invocation
    def allocate_waiting(self, environment: str) -> list[Outcome]:
        """After capacity frees: allocate approved/waiting incidents of a pool, oldest first per model."""
        queue = sorted(
            self._live(environment, phases={Phase.APPROVED, Phase.WAITING}),
            key=lambda a: a.ir,
        )
        outcomes: list[Outcome] = []
        blocked: set[str] = set()
        for alloc in queue:
            model = (alloc.gpu_model or "").upper()
            if model in blocked:
                continue
            outcome = self.allocate(alloc)
            outcomes.append(outcome)
            if outcome.action.startswith("waiting"):
                blocked.add(model)
        return outcomes

    # ==== Idle alerts (idle_alert) ========================================================================

    @_invocation
    def idle_triggered(self, ir: int, scope: IdleScope | None = None) -> Outcome:
        """A monitor says the IR's GPUs (on `scope`'s hosts or devices) are idle: warn once, reclaim if still idle
        after the grace period. An alert for hosts the lease does not hold changes nothing."""
        alloc = self._get(ir)
        held = keeps.suppressed(alloc, self.clock.now())
        if held is not None and alloc.state is not State.RESOLVED:
            # A keep or an operator's exemption holds idle reclaim off until its end (gpufarm.core.keeps).
            return Outcome(ir, f"nothing to do: {alloc.ir_label} is {held}")
        foreign = _foreign_hosts(alloc, scope)
        if foreign:
            return Outcome(ir, f"ignored: {', '.join(foreign)[:200]} not held by {alloc.ir_label}")
        judged = partial.idle(self, alloc, scope)  # per host or device: warn, give the idle part back, or reclaim
        if judged is not None:
            return judged
        where = f" {scope.describe()}" if scope is not None and scope.describe() else ""
        if alloc.phase is Phase.ALLOCATED and alloc.state is State.STABLE:
            now = self.clock.now()
            evidence = scope.describe() if scope is not None else ""
            warned = self._step(
                history.MONITOR, Step.WARNED, f"kind {(scope.kind if scope else None) or 'idle'}", evidence
            )
            policy = self.farm.idle.policy(alloc.environment, alloc.team)
            # Told first, recorded after: the grace (and so the reclaim) starts from a warning the holder got.
            warning = views.idle_warning(alloc, policy, now, scope, self.links_for(alloc))
            deliver_warning(self.chat, alloc.requester, warning)
            self._write(alloc, Phase.IDLE_WARNED, {f.IDLE_WARNED_AT: isoformat(now)}, step=warned)
            lifecycle_metrics.warned(self, alloc)
            return Outcome(ir, f"warned{where}")
        if alloc.phase is Phase.IDLE_WARNED and self._grace_over(alloc):
            self._resolve(alloc, ReclaimReason.IDLE, by=None)
            return Outcome(ir, f"resolved (idle){where}")
        return Outcome(ir, f"nothing to do ({alloc.phase.value})")

    @_invocation
    def idle_recovered(self, ir: int, scope: IdleScope | None = None) -> Outcome:
        """The GPUs are busy again: drop the warning (a recovery on hosts the lease does not hold changes nothing)."""
        alloc = self._get(ir)
        foreign = _foreign_hosts(alloc, scope)
        if foreign:
            return Outcome(ir, f"ignored: {', '.join(foreign)[:200]} not held by {alloc.ir_label}")
        cleared = partial.busy(self, alloc, scope)  # per host or device: only the parts the recovery names
        if cleared is not None:
            return cleared
        if alloc.phase is not Phase.IDLE_WARNED or alloc.state is State.RESOLVED:
            return Outcome(ir, f"nothing to do ({alloc.phase.value})")
        busy = self._step(history.MONITOR, Step.RECOVERED, scope.describe() if scope is not None else "")
        updated = self._write(alloc, Phase.ALLOCATED, {f.IDLE_WARNED_AT: None}, step=busy)
        self._tell(updated.requester, views.busy_again(updated, self.links_for(updated)))
        return Outcome(ir, "recovered")

    # ==== Scheduled sync (quota_sync) =====================================================================

    @_invocation
    def expire(self, ir: int) -> Outcome:
        """The sync's verdict, re-checked on the incident as it is now: resolve when expired or idle past grace."""
        alloc = self._get(ir)
        reason = self._due(alloc)
        if reason is None:
            return Outcome(ir, f"nothing to do ({alloc.phase.value})")
        self._resolve(alloc, reason, by=None)
        return Outcome(ir, f"resolved ({reason.value})")

    @_invocation
    def accrue(self, ir: int, until: datetime, busy_of: Mapping[str, float | None]) -> Outcome:
        """The sync's accrual of a lease's GPU-hours, re-checked on the incident as it is now (core.accounting)."""
        return Outcome(ir, accounting.apply(self, self._get(ir), until, busy_of))

    def _due(self, alloc: Allocation) -> ReclaimReason | None:
        if alloc.state is State.RESOLVED:
            return None
        # A lease's days run from its allocation; a request still waiting for hosts has its own limit instead.
        if leases.expired(alloc, self.clock.now()):
            return ReclaimReason.EXPIRED
        if leases.waiting_over(alloc, self.farm, self.clock.now()):
            return ReclaimReason.WITHDRAWN
        if alloc.phase is Phase.IDLE_WARNED and self._grace_over(alloc):
            # A partly idle lease is not reclaimed whole: only once every host (or device) is idle past its grace.
            policy = self.farm.idle.policy(alloc.environment, alloc.team)
            if not alloc.hosts or partial.every_part_due(alloc, self.clock.now(), policy):
                return ReclaimReason.IDLE
        return None

    @_invocation
    def remind(self, ir: int) -> Outcome:
        """Once per end, before it: tell the holder when the lease ends, with Extend and Release (core.leases)."""
        alloc = self._get(ir)
        if not leases.reminder_due(alloc, self.farm, self.clock.now()) or alloc.expires_at is None:
            return Outcome(ir, f"nothing to do ({alloc.phase.value})")
        ends = isoformat(alloc.expires_at)
        reminded = self._step(history.SYNC, Step.REMINDED, f"ends {ends}")
        updated = self._write(alloc, alloc.phase, {f.EXPIRY_REMINDED: ends}, step=reminded)
        self._tell(updated.requester, lease_views.expiry_reminder(updated, self.links_for(updated)))
        return Outcome(ir, f"reminded (ends {isoformat(alloc.expires_at)})")

    @_invocation
    def sync(self) -> SyncReport:
        """Expire, reclaim idle past grace, repair drift per pool or shard, publish gauges (gpufarm.core.reconcile)."""
        return reconcile.sync(self)

    @_invocation
    def reconcile_pool(self, environment: str, shard: int = 0, shards: int = 1) -> Repair:
        """Make host tags agree with incidents in one pool (or one shard of it), then allocate what fits."""
        return reconcile.reconcile_pool(self, environment, shard, shards)

    @_invocation
    def publish_gauges(self) -> int:
        """Quota and inventory gauges; returns how many series were sent."""
        return reconcile.publish_gauges(self)

    # ==== charging and queue positions ====================================================================

    def _pool_sizes(self, environment: str, gpu_model: str) -> charging.HostSizes:
        """A dedicated pool's host sizes for one model, which decide what a request is charged (none when shared)."""
        env = self.farm.environments.get(environment)
        if env is None or env.kind is not PoolKind.DEDICATED:
            return {}
        return self._reads().host_sizes(environment, gpu_model)

    def _charge(self, environment: str, gpu_model: str, count: int) -> charging.Charge:
        """What a request for `count` GPUs counts against its team's quota (whole hosts on dedicated pools)."""
        return charging.charge(self.farm, environment, self._pool_sizes(environment, gpu_model), count)

    def _held(self, alloc: Allocation) -> int:
        """What a granted lease counts against its team's quota: what it holds, or will take once allocated."""
        return charging.held(alloc, self.farm, self._pool_sizes)

    def _positions(self, shown: Iterable[Allocation]) -> dict[int, leases.Position]:
        """Queue positions of the waiting allocations among `shown`, against everything waiting in their pools."""
        waiting = [a for a in shown if a.phase in leases.WAITING]
        out: dict[int, leases.Position] = {}
        for env in sorted({a.environment or "" for a in waiting}):
            queue = self._live(env, phases=leases.WAITING)
            out |= {a.ir: leases.position(a, queue) for a in waiting if a.environment == env}
        return out

    # ==== helpers ==========================================================================================

    def _get(self, ir: int) -> Allocation:
        return self._reads().get(ir)

    def _live(
        self, environment: str | None = None, team: str | None = None, phases: Iterable[Phase] | None = None
    ) -> list[Allocation]:
        """Live allocations of a pool, a team in a pool, some phases, or all, as this invocation reads them."""
        return self._reads().live(environment, team, phases)

    def _inventory(self, environment: str | None = None) -> list[GpuHost]:
        """Managed hosts of a pool, or all, as this invocation lists them."""
        return self._reads().inventory(environment)

    def _down(self, environment: str) -> set[str]:
        """Hosts of a pool silent past the farm's inventory.down_after_minutes (none without that policy)."""
        minutes = self.farm.inventory.down_after_minutes
        if minutes is None:
            return set()
        reads = self._reads()
        infos = [reads.listed_info(h.name) for h in self._inventory(environment)]
        return down_hosts([i for i in infos if i is not None], self.clock.now().timestamp(), minutes)

    def _inventory_summary(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Free and total GPUs per pool and model (the whole inventory, and the live incidents of shared pools)."""
        inventory = self._inventory()
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for env_name, env in sorted(self.farm.environments.items()):
            for model in env.gpu_models:
                hosts = pool_hosts(inventory, env_name, model)
                used = self._units_used(env_name, env.kind, hosts)
                down = self._down(env_name)  # a down host's GPUs are not free: allocation leaves it out
                up = [h for h in hosts if h.name not in down]
                free = sum(c.free for c in free_capacity(env.kind, up, used))
                size = (lambda h: len(h.units)) if env.kind is PoolKind.SHARED else (lambda h: h.gpu_count)
                out[(env_name, model)] = (free, sum(size(h) for h in hosts))
        return out

    def _units_used(
        self, environment: str, kind: PoolKind, hosts: Sequence[GpuHost], exclude_ir: int | None = None
    ) -> dict[str, int]:
        if kind is PoolKind.DEDICATED:
            return {}  # a dedicated host's ir: tags say all: no incident needs reading
        live = self._live(environment, phases=HOLDING_PHASES | {Phase.APPROVED})
        holders = [a for a in live if a.ir != exclude_ir]
        # Units by id where leases record them (gpufarm.core.units), by count where they do not.
        used = {name: held.used for name, held in holdings(hosts, holders, exclude_ir).items()}
        known = {ir_tag_value(a.ir) for a in holders}
        for host in hosts:
            # An ir: tag whose incident the search does not show yet (index lag, or a half-finished allocation):
            # count the host as full rather than risk handing out units twice.
            strangers = [v for v in host.irs if v not in known and v != _tag_of(exclude_ir)]
            if strangers:
                used[host.name] = len(host.units)
        return used

    def _choose_units(
        self, environment: str, kind: PoolKind, hosts: Sequence[GpuHost], plan: dict[str, int], alloc: Allocation
    ) -> Devices:
        """The GPUs or MIG slices a shared pool's plan takes on each host (none on a dedicated pool)."""
        if kind is PoolKind.DEDICATED:
            return {}
        live = self._live(environment, phases=HOLDING_PHASES | {Phase.APPROVED})
        by_name = {h.name: h for h in hosts}
        devices = assign_units(by_name, plan, holdings(hosts, live, alloc.ir), alloc.ir)
        if devices is None:
            # Only a host whose units changed under the count (a lapse in serialization): try again later.
            raise UpstreamError(f"{alloc.ir_label}: the units of {', '.join(sorted(plan))} changed while allocating")
        return devices

    def _shared(self, environment: str) -> bool:
        """True for a shared pool (its capacity counts units)."""
        env = self.farm.environments.get(environment)
        return env is not None and env.kind is PoolKind.SHARED

    def _tag_hosts(
        self, alloc: Allocation, plan: dict[str, int], *, dedicated: bool, devices: Devices | None = None
    ) -> set[str]:
        """Tag the planned hosts; returns hosts found taken by another IR (dedicated pools), which were not tagged.

        On a shared pool each host also gets one `gpu_assign` tag per unit `devices` gives the lease there, and
        loses this lease's others (left by an earlier attempt that chose differently).
        """
        me = ir_tag_value(alloc.ir)
        wanted = allocation_tags([alloc])
        fresh: dict[str, list[str]] = {}
        taken: set[str] = set()
        for host in plan:
            current = self._user_tags(host)
            if current is None or (dedicated and any(v != me for v in tag_values(current, IR_KEY))):
                taken.add(host)
            else:
                fresh[host] = current
        if taken:
            return taken
        for host, current in fresh.items():
            units = assign_tags(alloc.ir, (devices or {}).get(host, ()))
            kept = [t for t in current if not is_assign_of(t, alloc.ir) or t in units]
            missing = [t for t in [*wanted, *units] if t not in kept]
            if missing or kept != current:
                self._put_tags(host, [*kept, *missing])
        if dedicated:
            # Verify after write: the tag API has no compare-and-set, so a writer outside this pool's queue
            # could have raced us. Whoever finds a second ir: tag backs off; a lost tag means try again later.
            for host in fresh:
                after = self._user_tags(host) or []
                if alloc.ir_tag not in after:
                    raise UpstreamError(f"{alloc.ir_label}: the tags of {host} changed while allocating; retrying")
                if any(v != me for v in tag_values(after, IR_KEY)):
                    self._untag_host(host, alloc)
                    taken.add(host)
        return taken

    def _untag_host(self, host: str, alloc: Allocation) -> None:
        """Remove this IR's tags from a host, keeping what another live holder of the host put there."""
        listed = self._reads().listed_user_tags(host)
        if listed is not None and self._untagged(listed, alloc) == listed:
            return  # the host list shows nothing of this IR's to remove: no read, no write
        current = self._user_tags(host)  # re-read: this host is about to be written
        if current is None:
            return
        new = self._untagged(current, alloc)
        if new != current:
            self._put_tags(host, new)

    def _untagged(self, current: list[str], alloc: Allocation) -> list[str]:
        """A host's `user` tags without this IR's: its ir: tag, and project:/team: unless another holder has them."""
        remaining = [n for n in ir_numbers(tag_values(current, IR_KEY)) if n != alloc.ir]
        # The pool's live incidents are read only when the host has another holder (a shared host).
        others = {a.ir: a for a in self._live(alloc.environment)} if remaining else {}
        keep = allocation_tags([others[n] for n in remaining if n in others])
        mine = allocation_tags([alloc])
        return [
            t for t in current if t != alloc.ir_tag and (t not in mine or t in keep) and not is_assign_of(t, alloc.ir)
        ]

    def _user_tags(self, host: str) -> list[str] | None:
        """A host's `user` tags read now (the re-check before a write); None when Datadog does not know it."""
        try:
            return list(self.hosts.get_tags(host, source="user"))
        except NotFound:
            return None

    def _put_tags(self, host: str, tags: Sequence[str]) -> None:
        """Replace a host's `user` tags; the invocation's view learns what Datadog answered."""
        self._reads().tagged(host, self.hosts.replace_tags(host, tags, source="user"))

    def _allocated(self, alloc: Allocation, plan: dict[str, int], devices: Devices | None = None) -> Outcome:
        hosts = sorted(plan)
        # The lease's days start now, when its hosts are allocated, however long it waited (gpufarm.core.leases).
        expires = leases.lease_end(self.clock.now(), alloc.duration_days or self.farm.defaults.duration_days)
        where = ", ".join(f"{h} ({plan[h]} GPUs)" for h in hosts)
        updated = self._write(
            alloc,
            Phase.ALLOCATED,
            {
                f.ALLOCATED_AT: isoformat(self.clock.now()),
                f.WAITING_SINCE: None,
                f.HOSTS: hosts,
                f.HOST_GPUS: encode_host_gpus(plan),
                **({f.DEVICES: encode_devices(devices)} if devices else {}),
                f.EXPIRES_AT: isoformat(expires),
            },
            step=self._step(history.GPUFARM, Step.ALLOCATED, f"hosts: {where}", f"until {isoformat(expires)}"),
        )
        self._tell(updated.requester, views.allocated(updated, self.links_for(updated)))
        return Outcome(alloc.ir, "allocated", tuple(hosts))

    def _go_waiting(self, alloc: Allocation) -> Outcome:
        if alloc.phase is Phase.WAITING:
            return Outcome(alloc.ir, "waiting (still)")
        # Its place among the pool's requests waiting for the model, first come first served (gpufarm.core.leases).
        place = leases.position(alloc, self._live(alloc.environment, phases=leases.WAITING))
        updated = self._write(
            alloc,
            Phase.WAITING,
            {f.WAITING_SINCE: isoformat(self.clock.now())},
            step=self._step(
                history.GPUFARM, Step.WAITING, f"position {place.place} of {place.of} for {place.gpu_model}"
            ),
        )
        deadline = leases.waiting_deadline(updated, self.farm)
        self._tell(updated.requester, lease_views.waiting(updated, place, deadline, self.links_for(updated)))
        return Outcome(alloc.ir, "waiting")

    def _resolve(self, alloc: Allocation, reason: ReclaimReason, *, by: str | None, note: str | None = None) -> Message:
        if alloc.state is State.RESOLVED or alloc.phase in (Phase.RECLAIMING, Phase.RECLAIMED, Phase.REJECTED):
            raise Conflict(f"{alloc.ir_label} has already ended ({alloc.phase.value})")
        # The lease's final GPU-hours land with its end (gpufarm.core.accounting).
        ended = {f.RECLAIM_REASON: reason.value, **accounting.final_fields(alloc, self.clock.now())}
        self._write(alloc, Phase.RECLAIMING, ended, step=self._ended_step(reason, by, note))
        if alloc.phase is Phase.REQUESTED and alloc.slack_message:
            who = f" by <@{by}>" if by else ""
            self._update_operator_message(alloc, f"Cancelled{who}" + (f": {note}" if note else ""))
        log.info("%s resolved (%s)", alloc.ir_label, reason.value)
        return views.releasing_reply(alloc, _reason_text(reason), self.links_for(alloc))

    def _write(
        self,
        alloc: Allocation,
        phase: Phase,
        values: dict[str, object],
        *,
        check: bool = True,
        step: history.Entry | None = None,
    ) -> Allocation:
        if check:
            check_transition(alloc.phase, phase)
        if step is not None:
            # The step is recorded in the same PATCH as the change it describes (gpufarm.core.history).
            values = {**values, f.HISTORY: history.appended(alloc.history, step)}
        record = self.incidents.update(
            alloc.incident_id, {f.STATE: state_for(phase).value, f.PHASE: phase.value, **values}
        )
        return self._reads().wrote(record)

    def _step(self, actor: str | None, step: Step, *details: str) -> history.Entry:
        """A history entry for a step taken now."""
        return history.entry(self.clock.now(), actor, step, *details)

    def _ended_step(self, reason: ReclaimReason, by: str | None, note: str | None) -> history.Entry:
        """The history entry of a lease ending: released, cancelled, or reclaimed with its reason and note."""
        if reason is ReclaimReason.RELEASED:
            return self._step(by, Step.RELEASED)
        if reason is ReclaimReason.CANCELLED:
            return self._step(by, Step.CANCELLED)
        if reason is ReclaimReason.WITHDRAWN:
            return self._step(history.SYNC, Step.WITHDRAWN, "no hosts within the waiting limit")
        actor = by or (history.MONITOR if reason is ReclaimReason.IDLE else history.SYNC)
        return self._step(actor, Step.RECLAIMED, f"reason: {reason.value}", f"note: {note}" if note else "")

    def _expect_phase(self, alloc: Allocation, phase: Phase, verb: str) -> None:
        if alloc.phase is not phase:
            who = alloc.approved_by
            by = f" (approved by {who if who == POLICY_APPROVER else f'<@{who}>'})" if who else ""
            raise Conflict(f"{alloc.ir_label} cannot be {verb}: it is already {alloc.phase.value}{by}")

    def _grace_over(self, alloc: Allocation) -> bool:
        warned = alloc.idle_warned_at
        return warned is not None and self.clock.now() - warned >= timedelta(
            minutes=self.farm.idle.grace_for(alloc.environment, alloc.team)
        )

    def _operators(self) -> frozenset[str]:
        return self.membership().operators()

    def _ask_operators(self, alloc: Allocation, reason: str) -> None:
        if not self.operators_channel:
            log.warning("%s needs an operator but no operators channel is configured", alloc.ir_label)
            return
        name = self.chat.user_name(alloc.requester) if alloc.requester else None
        message = cards.request_card(alloc, reason, name, cards.gather(self, alloc))
        ts = self.chat.post_message(self.operators_channel, message.text, message.blocks)
        asked = history.appended(alloc.history, self._step(history.POLICY, Step.ASKED, reason))
        self._reads().wrote(
            self.incidents.update(
                alloc.incident_id, {f.SLACK_MESSAGE: f"{self.operators_channel}/{ts}", f.HISTORY: asked}
            )
        )

    def _update_operator_message(self, alloc: Allocation, outcome: str) -> None:
        channel, _, ts = (alloc.slack_message or "").partition("/")
        if not channel or not ts:
            return
        message = cards.decided_card(alloc, outcome, self.links_for(alloc))
        try:
            self.chat.update_message(channel, ts, message.text, message.blocks)
        except UpstreamError:
            # The decision is recorded in the incident; a stale button message must not undo it.
            log.warning("could not update the operators' message for %s", alloc.ir_label)

    def _post_operators(self, message: Message) -> None:
        if self.operators_channel:
            try:
                self.chat.post_message(self.operators_channel, message.text, message.blocks)
            except UpstreamError:
                log.warning("could not post to the operators' channel")

    def _tell(self, user: str | None, message: Message) -> None:
        if not user:
            return
        try:
            self.chat.tell_user(user, message.text, message.blocks)
        except UpstreamError:
            # Incident fields already say what happened; a lost DM must not fail (and replay) the step.
            log.warning("could not message %s", user)


def _no_devices(alloc: Allocation) -> dict[str, object]:
    """The devices field emptied on reclaim, for a lease that recorded units (a dedicated lease's PATCH unchanged)."""
    return {f.DEVICES: []} if alloc.devices else {}


def _undecided(alloc: Allocation) -> bool:
    """A request nobody (policy or operator) has decided yet."""
    return (
        alloc.state is not State.RESOLVED
        and alloc.phase is Phase.REQUESTED
        and not alloc.approved_by
        and not alloc.slack_message
    )


def _asked(request: GpuRequest) -> str:
    """`4x H100 in onprem-hpc for 7 days, team nlp, project llm-ko`: what a request asked for, for its history."""
    return (
        f"{request.gpu_count}x {request.gpu_model} in {request.environment} for {request.duration_days} days, "
        f"team {request.team}, project {request.project}"
    )


def _ended(alloc: Allocation) -> str:
    """'IR-n was released by the requester' and the like, for an answer to an action that came too late."""
    reason = alloc.reclaim_reason
    if alloc.phase is Phase.REJECTED:
        return f"{alloc.ir_label} was rejected"
    if reason is None:
        return f"{alloc.ir_label} has ended ({alloc.phase.value})"
    return f"{alloc.ir_label} has ended ({_reason_text(reason)})"


def _reason_text(reason: ReclaimReason) -> str:
    return {
        ReclaimReason.RELEASED: "released by the requester",
        ReclaimReason.EXPIRED: "its time ran out",
        ReclaimReason.IDLE: "its GPUs stayed idle past the grace period",
        ReclaimReason.OPERATOR: "reclaimed by an operator",
        ReclaimReason.RESOLVED_IN_DATADOG: "its incident was resolved in Datadog",
        ReclaimReason.CANCELLED: "the request was cancelled",
        ReclaimReason.WITHDRAWN: "it waited past its limit for hosts and was withdrawn",
    }[reason]


def _tag_of(ir: int | None) -> str | None:
    return ir_tag_value(ir) if ir is not None else None


def _foreign_hosts(alloc: Allocation, scope: IdleScope | None) -> list[str]:
    """Hosts an idle alert names that the allocation does not hold (Datadog lowercases host tags), and devices
    it does not hold where it records its units (a shared pool's lease; gpufarm.core.units)."""
    if scope is None:
        return []
    held = {h.lower() for h in alloc.hosts}
    foreign = [h for h in scope.hosts if h.lower() not in held]
    mine = {u.uuid for units in lease_devices(alloc).values() for u in units if u.uuid}
    return foreign + ([d for d in scope.devices if d not in mine] if mine else [])
