"""Drift repair, per pool or per shard of a large pool: host tags made to agree with the incidents, then the pool's
waiting requests allocated into whatever the repair freed.

A repair runs in the pool's FIFO group after every allocation queued before it, and decides from the host list's
`user` tags (`tags_by_source`): a host that needs nothing costs no request of its own, and a host about to be
written is read again first (the one-writer rules, docs/design.md, rule 7). Its four jobs, in order:

1. stale tags removed: ir: tags of incidents that are gone, resolved or do not hold the host, gpu_assign tags of
   units no live lease records, and project:/team: tags no holder explains;
2. missing tags restored for every lease that holds its hosts, recorded in the lease's history;
3. a dedicated host two live leases claim is never "repaired" into a shared host but reported to the operators;
4. the last shard allocates the pool's waiting requests, after every shard of this sync has freed what it found.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.escape import inert
from gpufarm.core.config.farm import PoolKind
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.hosts import IR_KEY, PROJECT_KEY, TEAM_KEY, GpuHost, tag_values
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.tags import (
    allocation_tags,
    assign_tags,
    ir_numbers,
    is_alloc_tag,
    keyed,
    stale_assignments,
    wanted_assign_tags,
)
from gpufarm.core.kernel.units import lease_devices
from gpufarm.core.leases.allocation import allocate_waiting

log = logging.getLogger(__name__)

# A pool holding more hosts than this is repaired in shards of about this many, one queue message each, so one
# repair invocation stays far inside its timeout and memory whatever the pool's size (benchmarks/scale.py).
SHARD_HOSTS = 10_000
MAX_SHARDS = 64


@dataclass
class Repair:
    """What reconciling one pool (or one shard of it) did."""

    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


def shards_for(hosts: int) -> int:
    """How many repair messages a pool of this many hosts gets."""
    return max(1, min(MAX_SHARDS, -(-hosts // SHARD_HOSTS)))


def shard_of(host: str, shards: int) -> int:
    """The shard a host belongs to: a stable hash of its name (the same in every container and every sync)."""
    if shards <= 1:
        return 0
    digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


@invocation
def reconcile_pool(ctx: LeaseContext, environment: str, shard: int = 0, shards: int = 1) -> Repair:
    """Make host tags agree with incidents in one pool (or one shard of it), then allocate whatever now fits."""
    repair = Repair()
    live = {a.ir: a for a in ctx.live(environment)}
    env = ctx.farm.environments.get(environment)
    dedicated = env is None or env.kind is PoolKind.DEDICATED
    pool = [h for h in ctx.inventory(environment) if shard_of(h.name, shards) == shard]
    for host in pool:
        repair.removed += remove_stale(ctx, host, live)
    for alloc in sorted(live.values(), key=lambda a: a.ir):
        if alloc.phase in HOLDING:
            restore(ctx, alloc, repair, dedicated=dedicated, shard=shard, shards=shards)
    if repair.conflicts:
        report_double_claims(ctx, repair.conflicts)
    if shard == shards - 1:
        repair.outcomes = allocate_waiting(ctx, environment)
    return repair


def remove_stale(ctx: LeaseContext, host: GpuHost, live: Mapping[int, Allocation]) -> list[str]:
    """Remove the host's allocation tags no live lease explains; returns `host:tag` for each removed."""
    stale = [v for v in host.irs if not holds(live, v, host.name)]
    if not _needs_cleaning(host, live, stale):
        return []
    current = ctx.user_tags(host.name)  # re-read: this host is about to be written
    if current is None:
        return []
    keep_irs = [v for v in tag_values(current, IR_KEY) if v not in stale]
    holders = [live[n] for n in ir_numbers(keep_irs) if n in live]
    wanted = allocation_tags(holders) + wanted_assign_tags(holders, host.name, current, HOLDING)
    new = [t for t in current if not is_alloc_tag(t) or t in wanted]
    if new == current:
        return []
    ctx.put_tags(host.name, new)
    return [f"{host.name}:{t}" for t in current if t not in new]


def _needs_cleaning(host: GpuHost, live: Mapping[int, Allocation], stale: list[str]) -> bool:
    """True when the host list shows a tag to remove: a stale ir: tag, a gpu_assign tag of a unit no live lease
    records (gpufarm.core.kernel.units), or project:/team: tags on a host no lease holds."""
    if stale or stale_assignments(host, live, HOLDING):
        return True
    return not host.irs and bool(keyed(host.tags, {PROJECT_KEY, TEAM_KEY}))


def restore(ctx: LeaseContext, alloc: Allocation, repair: Repair, *, dedicated: bool, shard: int, shards: int) -> None:
    """Give a holding lease back its missing tags on its hosts in this shard (a double claim on a dedicated host is
    reported instead), and record what was restored in the lease's history."""
    restored: list[str] = []
    for name in alloc.hosts:
        if shard_of(name, shards) == shard:
            missing = _restore_on(ctx, alloc, name, repair, dedicated=dedicated)
            if missing:
                restored.append(f"{', '.join(missing)} on {name}")
    if restored:
        # The lease's own record of the drift the sync put right (gpufarm.core.kernel.history).
        step = ctx.step(history.SYNC, Step.REPAIRED, "restored " + "; ".join(restored))
        ctx.write(alloc, alloc.phase, {}, step=step)


def _restore_on(ctx: LeaseContext, alloc: Allocation, name: str, repair: Repair, *, dedicated: bool) -> list[str]:
    """The lease's missing tags put back on one host; returns them (none when nothing was missing or the host is
    claimed by another lease on a dedicated pool, which `repair` records as a conflict)."""
    # Its ir: tag and, on a shared pool, one gpu_assign tag per unit it records on the host.
    need = [alloc.ir_tag, *assign_tags(alloc.ir, lease_devices(alloc).get(name, ()))]
    listed = ctx.reads().listed_user_tags(name)
    if listed is not None and all(t in listed for t in need):
        return []  # the host list shows the tags: nothing to restore, nothing to read
    current = ctx.user_tags(name)
    if current is None or all(t in current for t in need):
        return []
    others = [v for v in tag_values(current, IR_KEY) if v != ir_tag_value(alloc.ir)]
    if dedicated and others:
        repair.conflicts.append(f"{name}: {alloc.ir_label} and {', '.join(others)}")
        return []
    missing = [t for t in [*allocation_tags([alloc]), *need[1:]] if t not in current]
    ctx.put_tags(name, [*current, *missing])
    repair.restored += [f"{name}:{t}" for t in missing]
    return missing


def report_double_claims(ctx: LeaseContext, conflicts: list[str]) -> None:
    """Dedicated hosts claimed by two live leases: logged and told to the operators, never repaired by gpufarm."""
    log.error("dedicated hosts claimed by two incidents: %s", "; ".join(conflicts))
    ctx.post_operators(
        Message(
            ":rotating_light: gpufarm found dedicated hosts claimed by two allocations; "
            "resolve one of them: " + inert("; ".join(conflicts))
        )
    )


def holds(live: Mapping[int, Allocation], tag_value: str, host: str) -> bool:
    """True when the tag's incident is live and either holds the host or may be mid-allocation."""
    numbers = ir_numbers([tag_value])
    alloc = live.get(numbers[0]) if numbers else None
    if alloc is None:
        return False
    if alloc.phase in HOLDING:
        return host in alloc.hosts
    return True
