"""The LeaseContext: the ports, the farm and one invocation's reads, with the steps every use case shares.

A use case (gpufarm.core.leases, .idle, .sync, .accounting, .digest, .commands) is a function of a context: it
reads the incident fresh through the invocation's `Reads` (gpufarm.core.context.reads), decides, and writes the
incident through `write`, which records the step in the same PATCH (gpufarm.core.kernel.history); side effects
(host tags, Slack messages) follow from what the incident says, so re-running a use case on the same input
converges instead of doing things twice. Every use case that writes an incident runs one at a time per pool: the
allocation queue's FIFO group (docs/design.md, rule 7). Host tags are re-read before they are written so even a
lapse there never puts a host in two dedicated allocations.

Reads per invocation: `reading()` opens one `Reads` and one `Membership` per thread (the local function host runs
several invocations at once); every use case decorated with `invocation` joins the one open on its thread.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Concatenate, ParamSpec, TypeVar

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.links import Links
from gpufarm.core.config import enforce
from gpufarm.core.config.farm import FarmConfig, PoolKind
from gpufarm.core.context.reads import USER_SOURCE, Reads
from gpufarm.core.governance import charging
from gpufarm.core.governance.membership import Membership
from gpufarm.core.inventory.placement import free_capacity, pool_hosts
from gpufarm.core.inventory.sources import down_hosts
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import NotFound, UpstreamError
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.hosts import GpuHost
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, check_transition, state_for
from gpufarm.core.kernel.model import Allocation
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
from gpufarm.core.kernel.tags import other_holders, untagged
from gpufarm.core.kernel.units import holdings
from gpufarm.core.money.card import RateCard
from gpufarm.core.money.prices import PriceBook, PriceFeed

log = logging.getLogger(__name__)


class LeaseContext:
    """What every use case works through: the ports and the farm, one invocation's reads, writes and tells."""

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
        # Measured GPU utilisation for the operators' cards and the ledger; None: "utilisation unavailable".
        self.usage = usage
        # Inventory sources besides the registered hosts (AWS, Azure): read by the sync (gpufarm.core.sync).
        self.sources: Sequence[InventorySource] = tuple(sources)
        # The Datadog event stream: the sync posts one event per inventory source it skipped.
        self.events = events
        # The clouds' list prices last read (the rate card's cloud half); None: only the farm file's prices.
        self.prices = prices
        # The clouds' price lists and the cache they are kept in: the sync's refresh (gpufarm.core.sync.prices).
        self.price_feed = price_feed
        # The view of the invocation running on each thread (the local function host runs several at once).
        self._local = threading.local()

    def with_incidents(self, incidents: IncidentStore) -> LeaseContext:
        """This context writing through another incident store (one command's record: gpufarm.core.commands.record),
        sharing everything else, the invocation's reads included."""
        other = copy.copy(self)
        other.incidents = incidents
        return other

    def rate_card(self) -> RateCard:
        """The farm's rate card with the list prices last read (gpufarm.core.money.card)."""
        return RateCard(self.farm.rates, self.prices.known() if self.prices is not None else None)

    # -- the invocation ------------------------------------------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[Reads]:
        """One invocation's reads: opened here, or joined when one is open on this thread."""
        current: Reads | None = getattr(self._local, "reads", None)
        if current is not None:
            yield self.reads()
            return
        reads = Reads(self.incidents, self.hosts)
        self._local.reads = reads
        # Team membership is read once per user group per invocation too (gpufarm.core.governance.membership).
        self._local.membership = Membership(self.farm, self.chat, self.operators_usergroup)
        try:
            yield reads
        finally:
            self._local.reads = None
            self._local.membership = None

    @contextmanager
    def changes(self) -> Iterator[dict[int, Allocation]]:
        """The leases this thread writes while the block runs, by IR, as the writes left them (the App Home's
        refresh after a change: gpufarm.core.leases.home). Blocks nest: an inner one collects for itself alone."""
        outer: dict[int, Allocation] | None = getattr(self._local, "changes", None)
        journal: dict[int, Allocation] = {}
        self._local.changes = journal
        try:
            yield journal
        finally:
            self._local.changes = outer
            if outer is not None:
                outer |= journal

    def _changed(self, alloc: Allocation) -> Allocation:
        journal: dict[int, Allocation] | None = getattr(self._local, "changes", None)
        if journal is not None:
            journal[alloc.ir] = alloc
        return alloc

    def reads(self) -> Reads:
        """The open view, or a fresh one for a single step called outside any invocation. A context writing through
        another store (`with_incidents`: one command's record) reads through that store too, sharing what the
        invocation has read."""
        current: Reads | None = getattr(self._local, "reads", None)
        if current is None:
            return Reads(self.incidents, self.hosts)
        return current if current.incidents is self.incidents else current.through(self.incidents)

    def membership(self) -> Membership:
        """The invocation's membership lookups (a fresh one outside any invocation)."""
        current: Membership | None = getattr(self._local, "membership", None)
        return current if current is not None else Membership(self.farm, self.chat, self.operators_usergroup)

    def operators(self) -> frozenset[str]:
        """The GPU operators, as this invocation reads them."""
        return self.membership().operators()

    def now(self) -> datetime:
        """The clock's time."""
        return self.clock.now()

    def links_for(self, alloc: Allocation) -> Links:
        """The links a message about the lease carries: its incident and its pool's dashboard (core.chat.links)."""
        return self.links.for_environment(self.farm, alloc.environment)

    def submit_hint(self, alloc: Allocation) -> str | None:
        """How the lease's holder submits into what enforces its pool (a Slurm reservation, a Kubernetes taint), or
        None."""
        env = self.farm.environments.get(alloc.environment or "")
        if env is None:
            return None
        return enforce.submit_hint(env.enforce, alloc.ir, shared=env.kind is PoolKind.SHARED)

    # -- reads -------------------------------------------------------------------------------------------------

    def get(self, ir: int) -> Allocation:
        """One allocation by IR; NotFound naming the IR."""
        return self.reads().get(ir)

    def live(
        self, environment: str | None = None, team: str | None = None, phases: Iterable[Phase] | None = None
    ) -> list[Allocation]:
        """Live allocations of a pool, a team in a pool, some phases, or all, as this invocation reads them."""
        return self.reads().live(environment, team, phases)

    def inventory(self, environment: str | None = None) -> list[GpuHost]:
        """Managed hosts of a pool, or all, as this invocation lists them."""
        return self.reads().inventory(environment)

    def shared(self, environment: str) -> bool:
        """True for a shared pool (its capacity counts units)."""
        env = self.farm.environments.get(environment)
        return env is not None and env.kind is PoolKind.SHARED

    def down(self, environment: str) -> set[str]:
        """Hosts of a pool silent past the farm's inventory.down_after_minutes (none without that policy)."""
        minutes = self.farm.inventory.down_after_minutes
        if minutes is None:
            return set()
        reads = self.reads()
        infos = [reads.listed_info(h.name) for h in self.inventory(environment)]
        return down_hosts([i for i in infos if i is not None], self.now().timestamp(), minutes)

    def units_used(
        self, environment: str, kind: PoolKind, hosts: Sequence[GpuHost], exclude_ir: int | None = None
    ) -> dict[str, int]:
        """Units (or GPUs) other leases hold per host of a shared pool; nothing to read on a dedicated pool."""
        if kind is PoolKind.DEDICATED:
            return {}  # a dedicated host's ir: tags say all: no incident needs reading
        live = self.live(environment, phases=HOLDING | {Phase.APPROVED})
        holders = [a for a in live if a.ir != exclude_ir]
        # Units by id where leases record them (gpufarm.core.kernel.units), by count where they do not.
        used = {name: held.used for name, held in holdings(hosts, holders, exclude_ir).items()}
        known = {ir_tag_value(a.ir) for a in holders}
        mine = ir_tag_value(exclude_ir) if exclude_ir is not None else None
        for host in hosts:
            # An ir: tag whose incident the search does not show yet (index lag, or a half-finished allocation):
            # count the host as full rather than risk handing out units twice.
            strangers = [v for v in host.irs if v not in known and v != mine]
            if strangers:
                used[host.name] = len(host.units)
        return used

    def inventory_summary(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Free and total GPUs per pool and model (the whole inventory, and the live incidents of shared pools)."""
        inventory = self.inventory()
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for env_name, env in sorted(self.farm.environments.items()):
            for model in env.gpu_models:
                hosts = pool_hosts(inventory, env_name, model)
                used = self.units_used(env_name, env.kind, hosts)
                down = self.down(env_name)  # a down host's GPUs are not free: allocation leaves it out
                up = [h for h in hosts if h.name not in down]
                free = sum(c.free for c in free_capacity(env.kind, up, used))
                size = (lambda h: len(h.units)) if env.kind is PoolKind.SHARED else (lambda h: h.gpu_count)
                out[(env_name, model)] = (free, sum(size(h) for h in hosts))
        return out

    # -- charging ------------------------------------------------------------------------------------------------

    def pool_sizes(self, environment: str, gpu_model: str) -> charging.HostSizes:
        """A dedicated pool's host sizes for one model, which decide what a request is charged (none when shared)."""
        env = self.farm.environments.get(environment)
        if env is None or env.kind is not PoolKind.DEDICATED:
            return {}
        return self.reads().host_sizes(environment, gpu_model)

    def charge(self, environment: str, gpu_model: str, count: int) -> charging.Charge:
        """What a request for `count` GPUs counts against its team's quota (whole hosts on dedicated pools)."""
        return charging.charge(self.farm, environment, self.pool_sizes(environment, gpu_model), count)

    def held(self, alloc: Allocation) -> int:
        """What a granted lease counts against its team's quota: what it holds, or will take once allocated."""
        return charging.held(alloc, self.farm, self.pool_sizes)

    # -- writes --------------------------------------------------------------------------------------------------

    def step(self, actor: str | None, step: Step, *details: str) -> history.Entry:
        """A history entry for a step taken now."""
        return history.entry(self.now(), actor, step, *details)

    def write(
        self,
        alloc: Allocation,
        phase: Phase,
        values: dict[str, object],
        *,
        check: bool = True,
        step: history.Entry | None = None,
    ) -> Allocation:
        """Write the lease's phase (and the state it implies) with `values`, the step recorded in the same PATCH."""
        if check:
            check_transition(alloc.phase, phase)
        if step is not None:
            # The step is recorded in the same PATCH as the change it describes (gpufarm.core.kernel.history).
            values = {**values, f.HISTORY: history.appended(alloc.history, step)}
        record = self.incidents.update(
            alloc.incident_id, {f.STATE: state_for(phase).value, f.PHASE: phase.value, **values}
        )
        return self._changed(self.reads().wrote(record))

    def write_fields(self, alloc: Allocation, values: dict[str, object], *, title: str | None = None) -> Allocation:
        """Write fields (or the title) without a phase change; the invocation's view learns what Datadog answered."""
        return self._changed(self.reads().wrote(self.incidents.update(alloc.incident_id, values, title=title)))

    def user_tags(self, host: str) -> list[str] | None:
        """A host's `user` tags read now (the re-check before a write); None when Datadog does not know it."""
        try:
            return list(self.hosts.get_tags(host, source=USER_SOURCE))
        except NotFound:
            return None

    def put_tags(self, host: str, tags: Sequence[str]) -> None:
        """Replace a host's `user` tags; the invocation's view learns what Datadog answered."""
        self.reads().tagged(host, self.hosts.replace_tags(host, tags, source=USER_SOURCE))

    def untag_host(self, host: str, alloc: Allocation) -> None:
        """Remove this lease's tags from a host, keeping what another live holder of the host put there."""
        listed = self.reads().listed_user_tags(host)
        if listed is not None and self._without(listed, alloc) == listed:
            return  # the host list shows nothing of this IR's to remove: no read, no write
        current = self.user_tags(host)  # re-read: this host is about to be written
        if current is None:
            return
        new = self._without(current, alloc)
        if new != current:
            self.put_tags(host, new)

    def _without(self, current: list[str], alloc: Allocation) -> list[str]:
        # The pool's live incidents are read only when the host has another holder (a shared host).
        others = {a.ir: a for a in self.live(alloc.environment)} if other_holders(current, alloc.ir) else {}
        return untagged(current, alloc, others)

    # -- telling ---------------------------------------------------------------------------------------------------

    def tell(self, user: str | None, message: Message) -> None:
        """DM a user; a lost DM is logged, never fails (and replays) the step: the incident already says it."""
        if not user:
            return
        try:
            self.chat.tell_user(user, message.text, message.blocks)
        except UpstreamError:
            log.warning("could not message %s", user)

    def post_operators(self, message: Message) -> None:
        """Post to the operators' channel, when one is configured; a failed post is logged."""
        if self.operators_channel:
            try:
                self.chat.post_message(self.operators_channel, message.text, message.blocks)
            except UpstreamError:
                log.warning("could not post to the operators' channel")


P = ParamSpec("P")
R = TypeVar("R")


def invocation(use_case: Callable[Concatenate[LeaseContext, P], R]) -> Callable[Concatenate[LeaseContext, P], R]:
    """A use case reads through the invocation's view: the one open on this thread, else its own."""

    @functools.wraps(use_case)
    def wrapper(ctx: LeaseContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with ctx.reading():
            return use_case(ctx, *args, **kwargs)

    return wrapper
