"""Allocation: an approved lease gets hosts (or GPU units on a shared pool), tagged and written into its incident.

Hosts are chosen by model, pool, free capacity and the placement policy (gpufarm.core.inventory.placement), tagged
with what gpufarm.core.kernel.tags says an allocation writes, then written into the incident; the requester is
told. A pool with no room puts the lease in its queue (waiting), in the pool's order per model
(gpufarm.core.leases.ordering: first come first served, or fair share), with the reason it waits. Tags are
re-read before they are written, and on a dedicated pool read again after, so even a lapse in the pool's
serialization never puts a host in two dedicated leases (docs/design.md, rule 4).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpufarm.core.chat import messages
from gpufarm.core.config.farm import PoolKind
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.inventory.placement import free_capacity, place, pool_hosts
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.hosts import IR_KEY, GpuHost, tag_values
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation, encode_host_gpus, isoformat
from gpufarm.core.kernel.tags import allocation_tags, assign_tags, is_assign_of
from gpufarm.core.kernel.units import Devices, assign_units, encode_devices, holdings
from gpufarm.core.leases import fair_share, notices, preemption, terms
from gpufarm.core.leases.ordering import FIFO, Order

log = logging.getLogger(__name__)

# How many times allocation re-plans after finding a chosen host freshly taken (only a lapse in serialization).
MAX_REPLANS = 3


@invocation
def allocate(ctx: LeaseContext, alloc: Allocation, order: Order | None = None) -> Outcome:
    """Pick hosts, tag them, write them into the incident; waiting when the pool is full or its order serves
    others first (`order`: the pool's, gpufarm.core.leases.ordering; read here when not given)."""
    if alloc.phase not in (Phase.APPROVED, Phase.WAITING) or alloc.state is State.RESOLVED:
        return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")
    env = ctx.farm.environments.get(alloc.environment or "")
    if env is None or alloc.gpu_count < 1:
        # Config changed under a live request: nothing can ever be placed; say so rather than loop.
        log.warning("%s names pool %r that the farm configuration lacks", alloc.ir_label, alloc.environment)
        return go_waiting(ctx, alloc, FIFO)
    if order is None:
        order = fair_share.pool_order(ctx, alloc.environment or "", alloc.gpu_model or "")
    # The pool's order per model: a request does not overtake one its pool serves first (first come, first served
    # unless the pool orders by fair share).
    if order.ahead(alloc, terms.queue_of(alloc, ctx.live(alloc.environment, phases={Phase.WAITING}))):
        return go_waiting(ctx, alloc, order, behind=True)
    return _place(ctx, alloc, env.kind, order)


def _place(ctx: LeaseContext, alloc: Allocation, kind: PoolKind, order: Order) -> Outcome:
    """Plan, tag and record; a host found taken meanwhile is left out and the plan made again (MAX_REPLANS)."""
    env_name, model = alloc.environment or "", (alloc.gpu_model or "").upper()
    me = ir_tag_value(alloc.ir)
    excluded: set[str] = ctx.down(env_name)  # silent nodes get nothing (gpufarm.core.inventory.sources)
    for _ in range(MAX_REPLANS):
        hosts = [h for h in pool_hosts(ctx.inventory(env_name), env_name, model) if h.name not in excluded]
        used = ctx.units_used(env_name, kind, hosts, exclude_ir=alloc.ir)
        free = free_capacity(kind, hosts, used, holder_ir=me)
        already = frozenset(h.name for h in hosts if me in h.irs)
        plan = place(kind, free, alloc.gpu_count, prefer=already)
        if not plan:
            _untag_strays(ctx, alloc, already, set())
            return go_waiting(ctx, alloc, order)
        devices = _choose_units(ctx, alloc, kind, hosts, plan)
        taken = _tag_hosts(ctx, alloc, plan, dedicated=kind is PoolKind.DEDICATED, devices=devices)
        if not taken:
            _untag_strays(ctx, alloc, already, set(plan))
            return _allocated(ctx, alloc, plan, devices)
        excluded |= taken
    raise UpstreamError(f"{alloc.ir_label}: hosts kept being taken while allocating; retrying later")


def _untag_strays(ctx: LeaseContext, alloc: Allocation, already: frozenset[str], planned: set[str]) -> None:
    """Hosts an earlier attempt tagged that this plan does not take: this IR does not hold them."""
    for stray in sorted(already - planned):
        ctx.untag_host(stray, alloc)


@invocation
def allocate_waiting(ctx: LeaseContext, environment: str) -> list[Outcome]:
    """After capacity frees: allocate approved/waiting incidents of a pool in its order per model (oldest first,
    or by fair share); the first that waits holds back the rest of its model."""
    live = ctx.live(environment, phases={Phase.APPROVED, Phase.WAITING})
    orders: dict[str, Order] = {}
    for model in sorted({(a.gpu_model or "").upper() for a in live}):
        orders[model] = fair_share.pool_order(ctx, environment, model)
    queue = sorted(live, key=lambda a: (orders[(a.gpu_model or "").upper()].key(a), a.ir))
    outcomes: list[Outcome] = []
    blocked: set[str] = set()
    for alloc in queue:
        model = (alloc.gpu_model or "").upper()
        if model in blocked:
            continue
        outcome = allocate(ctx, alloc, orders[model])
        outcomes.append(outcome)
        if outcome.action.startswith("waiting"):
            blocked.add(model)
    return outcomes


def go_waiting(ctx: LeaseContext, alloc: Allocation, order: Order, *, behind: bool = False) -> Outcome:
    """The lease waits for hosts: its place in the pool's queue for its model and the reason, told to the requester
    once (`behind`: it waits because its pool serves others first, not for want of room)."""
    if alloc.phase is Phase.WAITING:
        _claim(ctx, alloc)
        return Outcome(alloc.ir, "waiting (still)")
    # Its place among the pool's requests waiting for the model, in the pool's order (gpufarm.core.leases.ordering).
    live = ctx.live(alloc.environment, phases=terms.WAITING)
    spot = terms.position(alloc, live, order)
    reason = order.waiting_reason(alloc, order.ranked(terms.queue_of(alloc, live)), behind=behind)
    updated = ctx.write(
        alloc,
        Phase.WAITING,
        {f.WAITING_SINCE: isoformat(ctx.now()), **reason_trail.fields(reason)},
        step=ctx.step(history.GPUFARM, Step.WAITING, reason_trail.detail(reason)),
    )
    deadline = terms.waiting_deadline(updated, ctx.farm)
    ctx.tell(updated.requester, notices.waiting(updated, spot, deadline, ctx.links_for(updated)))
    _claim(ctx, updated)
    return Outcome(alloc.ir, "waiting")


def _claim(ctx: LeaseContext, alloc: Allocation) -> None:
    """A waiting request of a lending team takes back what borrowers hold (gpufarm.core.leases.preemption)."""
    claimed = preemption.claim(ctx, alloc)
    if claimed.reason is not None:
        preemption.record_wait(ctx, ctx.get(alloc.ir), claimed.reason)


def _choose_units(
    ctx: LeaseContext, alloc: Allocation, kind: PoolKind, hosts: Sequence[GpuHost], plan: dict[str, int]
) -> Devices:
    """The GPUs or MIG slices a shared pool's plan takes on each host (none on a dedicated pool)."""
    if kind is PoolKind.DEDICATED:
        return {}
    live = ctx.live(alloc.environment, phases=HOLDING | {Phase.APPROVED})
    by_name = {h.name: h for h in hosts}
    devices = assign_units(by_name, plan, holdings(hosts, live, alloc.ir), alloc.ir)
    if devices is None:
        # Only a host whose units changed under the count (a lapse in serialization): try again later.
        raise UpstreamError(f"{alloc.ir_label}: the units of {', '.join(sorted(plan))} changed while allocating")
    return devices


def _tag_hosts(
    ctx: LeaseContext, alloc: Allocation, plan: dict[str, int], *, dedicated: bool, devices: Devices | None = None
) -> set[str]:
    """Tag the planned hosts; returns hosts found taken by another IR (dedicated pools), which were not tagged.

    On a shared pool each host also gets one `gpu_assign` tag per unit `devices` gives the lease there, and
    loses this lease's others (left by an earlier attempt that chose differently).
    """
    fresh, taken = _read_planned(ctx, alloc, plan, dedicated=dedicated)
    if taken:
        return taken
    wanted = allocation_tags([alloc])
    for host, current in fresh.items():
        units = assign_tags(alloc.ir, (devices or {}).get(host, ()))
        kept = [t for t in current if not is_assign_of(t, alloc.ir) or t in units]
        missing = [t for t in [*wanted, *units] if t not in kept]
        if missing or kept != current:
            ctx.put_tags(host, [*kept, *missing])
    return _verified(ctx, alloc, fresh) if dedicated else set()


def _read_planned(
    ctx: LeaseContext, alloc: Allocation, plan: dict[str, int], *, dedicated: bool
) -> tuple[dict[str, list[str]], set[str]]:
    """Each planned host's `user` tags read now, and the hosts Datadog does not know or (dedicated) another IR holds."""
    me = ir_tag_value(alloc.ir)
    fresh: dict[str, list[str]] = {}
    taken: set[str] = set()
    for host in plan:
        current = ctx.user_tags(host)
        if current is None or (dedicated and any(v != me for v in tag_values(current, IR_KEY))):
            taken.add(host)
        else:
            fresh[host] = current
    return fresh, taken


def _verified(ctx: LeaseContext, alloc: Allocation, tagged: dict[str, list[str]]) -> set[str]:
    """Verify after write: the tag API has no compare-and-set, so a writer outside this pool's queue could have raced
    us. Whoever finds a second ir: tag backs off (the host is returned as taken); a lost tag means try again later."""
    me = ir_tag_value(alloc.ir)
    taken: set[str] = set()
    for host in tagged:
        after = ctx.user_tags(host) or []
        if alloc.ir_tag not in after:
            raise UpstreamError(f"{alloc.ir_label}: the tags of {host} changed while allocating; retrying")
        if any(v != me for v in tag_values(after, IR_KEY)):
            ctx.untag_host(host, alloc)
            taken.add(host)
    return taken


def _allocated(ctx: LeaseContext, alloc: Allocation, plan: dict[str, int], devices: Devices | None = None) -> Outcome:
    hosts = sorted(plan)
    # The lease's days start now, when its hosts are allocated, however long it waited (gpufarm.core.leases.terms).
    expires = terms.lease_end(ctx.now(), alloc.duration_days or ctx.farm.defaults.duration_days)
    where = ", ".join(f"{h} ({plan[h]} GPUs)" for h in hosts)
    updated = ctx.write(
        alloc,
        Phase.ALLOCATED,
        {
            f.ALLOCATED_AT: isoformat(ctx.now()),
            f.WAITING_SINCE: None,
            f.HOSTS: hosts,
            f.HOST_GPUS: encode_host_gpus(plan),
            **({f.DEVICES: encode_devices(devices)} if devices else {}),
            f.EXPIRES_AT: isoformat(expires),
        },
        step=ctx.step(history.GPUFARM, Step.ALLOCATED, f"hosts: {where}", f"until {isoformat(expires)}"),
    )
    ctx.tell(updated.requester, messages.allocated(updated, ctx.links_for(updated), ctx.submit_hint(updated)))
    return Outcome(alloc.ir, "allocated", tuple(hosts))
