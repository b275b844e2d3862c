"""The façade the handlers call: one method per use case, each a function of the lease context.

`GpuFarm` is built once per container by the handlers (gpufarm.handlers.runtime) and holds the `LeaseContext`
(gpufarm.core.context.lease_context): the ports, the farm, and one invocation's reads. It decides nothing itself:
each method is the use case of a capability package (gpufarm.core.leases, .idle, .accounting, .sync, .commands),
which reads the incident fresh, decides, and writes the incident. Code inside the core takes the context, never
this façade.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from gpufarm.core.accounting import budget_alerts, budget_view, gpu_hours, quota
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.home import HomeData
from gpufarm.core.chat.links import Links
from gpufarm.core.config.accounting import BudgetPeriod
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.governance.policy import Decision
from gpufarm.core.idle import alerts, keeps
from gpufarm.core.kernel.model import Allocation, GpuRequest
from gpufarm.core.kernel.ports import (
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
from gpufarm.core.kernel.serial import IdleScope, IncidentCommand
from gpufarm.core.leases import allocation, ending, extension, home, process, queries, requests, upload_tokens
from gpufarm.core.money.prices import PriceBook, PriceFeed
from gpufarm.core.sync import expiry, gauges, repair, run, sweep

T = TypeVar("T")


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
        prices: PriceBook | None = None,
        price_feed: PriceFeed | None = None,
    ) -> None:
        self.context = LeaseContext(
            incidents=incidents,
            hosts=hosts,
            chat=chat,
            clock=clock,
            farm=farm,
            operators_usergroup=operators_usergroup,
            operators_channel=operators_channel,
            metrics=metrics,
            queue=queue,
            links=links,
            usage=usage,
            sources=sources,
            events=events,
            prices=prices,
            price_feed=price_feed,
        )

    # ==== Slack-facing use cases (slack_worker) ==========================================================

    def check_requester(self, request: GpuRequest) -> None:
        """NotAllowed unless the requester may charge the request's team; MembershipUnavailable when Slack fails."""
        requests.check_requester(self.context, request)

    def submit_request(self, request: GpuRequest) -> Message:
        """Create the incident for a request (once per request_id) and decide it now (no queue: one writer)."""
        return requests.submit_request(self.context, request)

    def precheck(self, request: GpuRequest) -> Decision:
        """The policy's verdict against what is granted now: a refusal here creates no incident."""
        return requests.precheck(self.context, request)

    def create_request(self, request: GpuRequest) -> tuple[Allocation, bool]:
        """The request's incident, created once per request_id; True when it awaits a decision."""
        return requests.create_request(self.context, request)

    def decide_request(self, ir: int) -> Message:
        """The policy decision that counts, in the pool's queue group after every grant committed before it."""
        return requests.decide_request(self.context, ir)

    def approve(self, ir: int, actor: str) -> Message:
        """An operator approves a request beyond quota; the webhook then allocates."""
        return requests.approve(self.context, ir, actor)

    def reject(self, ir: int, actor: str, reason: str | None = None) -> Message:
        """An operator rejects a request; the incident is resolved with phase rejected."""
        return requests.reject(self.context, ir, actor, reason)

    def release(self, ir: int, actor: str) -> Message:
        """The requester (or an operator) gives the GPUs back: the incident is resolved; the webhook reclaims."""
        return ending.release(self.context, ir, actor)

    def force_reclaim(self, ir: int, actor: str, reason: str | None = None) -> Message:
        """An operator takes an allocation back."""
        return ending.force_reclaim(self.context, ir, actor, reason)

    def extend(self, ir: int, actor: str, days: int | None = None) -> Message:
        """Push the expiry out, within the team's max_days."""
        return extension.extend(self.context, ir, actor, days)

    def keep(self, ir: int, actor: str) -> Message:
        """The requester answers an idle warning with Keep, within the keep policy's bounds."""
        return keeps.keep(self.context, ir, actor)

    def exempt(self, ir: int, actor: str, days: int | None, reason: str | None) -> Message:
        """An operator exempts a lease from idle reclaim until an end date, with a reason."""
        return keeps.exempt(self.context, ir, actor, days, reason)

    def allocation(self, ir: int) -> Allocation:
        """One allocation by IR; NotFound naming the IR."""
        return queries.allocation(self.context, ir)

    def visible_allocation(self, ir: int, user: str) -> Allocation:
        """One allocation by IR for a user who may see it; NotAllowed ("IR-n belongs to another team") otherwise."""
        return queries.visible_allocation(self.context, ir, user)

    def status(self, ir: int, user: str) -> Message:
        """One allocation in detail, for its requester, its team's members and the operators."""
        return queries.status(self.context, ir, user)

    def list_allocations(self, scope: str, user: str, team: str | None = None) -> Message:
        """Live allocations: the user's own, a team's, or all; other teams' leases are counted, never shown."""
        return queries.list_allocations(self.context, scope, user, team)

    def profile_token(self, ir: int, user: str, key: bytes) -> Message:
        """An upload token for a lease, for its requester or a member of its team, signed with `key`."""
        return upload_tokens.profile_token(self.context, ir, user, key)

    def home(self, user: str) -> HomeData:
        """What a user's App Home shows now."""
        return home.home(self.context, user)

    def publish_home(self, user: str) -> None:
        """Publish a user's App Home (views.publish)."""
        home.publish(self.context, user)

    def refreshing_homes(self, work: Callable[[], T], command: IncidentCommand | None = None) -> T:
        """Run a unit of pool work (`command`, when it is one), then publish once the Home of each requester whose
        lease it wrote (gpufarm.core.leases.home; not after the sync's hourly accruals)."""
        if not home.refreshes(command):
            return work()
        return home.refreshed(self.context, work)

    def budget(self, user: str, team: str | None = None) -> Message:
        """`/gpu budget [team]`: the budgets' burn, forecast and what each live lease costs to its end."""
        return budget_view.budget(self.context, user, team)

    def quota(self, team: str | None = None) -> Message:
        """Quotas and use per team, and free/total GPUs per pool."""
        return quota.quota(self.context, team)

    # ==== Incident-driven steps (incident_webhook's queue consumer) ======================================

    def process(self, incident_id: str, arrival: str | None = None) -> list[Outcome]:
        """Act on an incident's current state: allocate when approved/waiting, reclaim when resolved (a doctor's
        probe only notes how its webhook `arrival`-ed)."""
        return process.process(self.context, incident_id, arrival)

    def allocate(self, alloc: Allocation) -> Outcome:
        """Pick hosts, tag them, write them into the incident; waiting when the pool is full."""
        return allocation.allocate(self.context, alloc)

    def reclaim(self, alloc: Allocation) -> Outcome:
        """Remove exactly this IR's tags, clear its hosts, phase reclaimed, tell the requester and operators."""
        return ending.reclaim(self.context, alloc)

    def allocate_waiting(self, environment: str) -> list[Outcome]:
        """After capacity frees: allocate approved/waiting incidents of a pool, oldest first per model."""
        return allocation.allocate_waiting(self.context, environment)

    # ==== Idle alerts (idle_alert) ========================================================================

    def idle_triggered(self, ir: int, scope: IdleScope | None = None) -> Outcome:
        """A monitor says the IR's GPUs are idle: warn once, reclaim if still idle after the grace period."""
        return alerts.idle_triggered(self.context, ir, scope)

    def idle_recovered(self, ir: int, scope: IdleScope | None = None) -> Outcome:
        """The GPUs are busy again: drop the warning."""
        return alerts.idle_recovered(self.context, ir, scope)

    # ==== Scheduled sync (quota_sync) =====================================================================

    def expire(self, ir: int) -> Outcome:
        """The sync's verdict, re-checked on the incident as it is now: resolve when expired or idle past grace."""
        return expiry.expire(self.context, ir)

    def accrue(
        self,
        ir: int,
        until: datetime,
        busy_of: Mapping[str, float | None],
        held_of: Mapping[str, float] | None = None,
    ) -> Outcome:
        """The sync's accrual of a lease's GPU-hours (idle-held devices per host in `held_of`), re-checked."""
        return gpu_hours.record_accrual(self.context, ir, until, busy_of, held_of)

    def remind(self, ir: int) -> Outcome:
        """Once per end, before it: tell the holder when the lease ends, with Extend and Release."""
        return expiry.remind(self.context, ir)

    def budget_alert(self, team: str, project: str | None, period: BudgetPeriod) -> str:
        """In the team's budget group: tell the budget's thresholds crossed and not yet told, once."""
        return budget_alerts.tell(self.context, team, project, period)

    def sync(self) -> run.SyncReport:
        """Expire, reclaim idle past grace, repair drift per pool or shard, publish gauges."""
        return run.sync(self.context)

    def sweep(self) -> sweep.SweepReport:
        """Bring every incident whose step waits on a side effect to its pool's writer (every minute)."""
        return sweep.sweep(self.context)

    def reconcile_pool(self, environment: str, shard: int = 0, shards: int = 1) -> repair.Repair:
        """Make host tags agree with incidents in one pool (or one shard of it), then allocate what fits."""
        return repair.reconcile_pool(self.context, environment, shard, shards)

    def publish_gauges(self) -> int:
        """Quota and inventory gauges; returns how many series were sent."""
        return gauges.publish_gauges(self.context)
