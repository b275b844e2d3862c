"""The scheduled sync: expiries and reminders as commands, one drift repair per pool (or per shard of a large
pool), the leases due their GPU-hours accrued, the budgets' thresholds crossed, the gauges, and the clouds' list
prices when due.

Work per invocation is bounded by the farm's pools, not by the farm: the sync reads the live incidents and the host
list once (one invocation's reads, gpufarm.core.context), queues each expiry as a command in its incident's pool
group, and queues one repair per pool, or one per shard of a pool holding more than SHARD_HOSTS hosts (shards by a
stable hash of the host name, so a host is always repaired by the same shard: gpufarm.core.sync.repair). Without
a queue (one writer, the unit tests) each runs at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpufarm.core.accounting import agent_usage, budget_alerts, budgets, gpu_hours
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.inventory.source_events import post_source_events
from gpufarm.core.inventory.sources import read_in_background
from gpufarm.core.kernel.lifecycle import ReclaimReason
from gpufarm.core.kernel.serial import Op
from gpufarm.core.leases import terms
from gpufarm.core.sync import expiry
from gpufarm.core.sync.gauges import publish_gauges
from gpufarm.core.sync.inventory_read import inventory_sources, read_ledger
from gpufarm.core.sync.prices import refresh_prices
from gpufarm.core.sync.repair import reconcile_pool, shards_for

SYNC_BUCKET_S = 300


@dataclass
class SyncReport:
    """What one scheduled sync did."""

    expired: list[int] = field(default_factory=list)
    withdrawn: list[int] = field(default_factory=list)
    reminded: list[int] = field(default_factory=list)
    idle_reclaimed: list[int] = field(default_factory=list)
    tags_removed: list[str] = field(default_factory=list)
    tags_restored: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    pools_queued: list[str] = field(default_factory=list)
    series: int = 0
    # Leases whose GPU-hours this sync accrued (writes of their own, apart from repairs), and whether the
    # busy-GPU query answered (gpufarm.core.accounting.gpu_hours).
    accrued: list[int] = field(default_factory=list)
    measured: bool = False
    # Budget thresholds crossed and not yet told, sent to be told once (gpufarm.core.accounting.budget_alerts).
    budget_alerts: list[str] = field(default_factory=list)
    # What the inventory sources found: nodes without an agent, down hosts, unknown nodes, sources skipped.
    inventory: dict[str, Any] = field(default_factory=dict)
    # The clouds' list prices: refreshed when due, last (gpufarm.core.sync.prices); what the refresh did.
    prices: dict[str, Any] = field(default_factory=dict)


@invocation
def sync(ctx: LeaseContext) -> SyncReport:
    """Expire, reclaim idle past grace, repair drift per pool (queued when a queue exists), publish gauges.

    With a queue, expiries go to the incident's pool group as commands that re-check the incident there, so
    an expiry never overwrites a Keep or an extension that ran in between (docs/design.md, rule 7), and each
    pool's repair (or each shard's) goes to the pool's group as its own message.
    """
    report = SyncReport()
    # The inventory sources (clouds) are read on their own threads while this reads Datadog.
    pending = read_in_background(inventory_sources(ctx))
    bucket = int(ctx.now().timestamp()) // SYNC_BUCKET_S
    _end_due(ctx, report, bucket)
    _repair_pools(ctx, report, bucket)
    ledger = read_ledger(ctx, pending())
    report.inventory = ledger.summary()
    post_source_events(ctx.events, ledger, int(ctx.now().timestamp()))
    # One metrics query measures every lease's busy GPUs; the leases due accrue their GPU-hours from it.
    usage = gpu_hours.measure(ctx.usage, ctx.now(), ctx.farm.ledger, agent_usage.for_farm(ctx.farm))
    report.measured = usage.measured
    ending = {*report.expired, *report.withdrawn, *report.idle_reclaimed}  # their end writes their final hours
    report.accrued = gpu_hours.queue_accruals(ctx, usage, f"sync-{bucket}", skip=ending)
    # The budgets' burn is read once, for their alerts (after the accruals) and their gauges.
    burned = budgets.burns(ctx, ctx.farm.budgets) if ctx.farm.budgets else []
    report.budget_alerts = budget_alerts.check(ctx, burned, f"sync-{bucket}")
    report.series = publish_gauges(ctx, ledger, usage, burned)
    # Last: the sync's own work never waits on a price list, and the refresh never fails the sync.
    report.prices = asdict(refresh_prices(ctx))
    return report


def _end_due(ctx: LeaseContext, report: SyncReport, bucket: int) -> None:
    """Every live lease due to end (expired, withdrawn, idle past grace) ends; one about to end is reminded."""
    for alloc in ctx.live():
        reason = expiry.due(ctx, alloc)
        if reason is None:
            if terms.reminder_due(alloc, ctx.farm, ctx.now()):
                expiry.send(ctx, alloc, Op.REMIND, f"sync-{bucket}")
                report.reminded.append(alloc.ir)
            continue
        expiry.send(ctx, alloc, Op.EXPIRE, f"sync-{bucket}", reason=reason)
        if reason in (ReclaimReason.WITHDRAWN, ReclaimReason.UNAPPROVABLE):
            report.withdrawn.append(alloc.ir)
        else:
            (report.expired if reason is ReclaimReason.EXPIRED else report.idle_reclaimed).append(alloc.ir)


def _repair_pools(ctx: LeaseContext, report: SyncReport, bucket: int) -> None:
    """One repair per pool or shard: queued in the pool's FIFO group, or run at once without a queue."""
    sizes: dict[str, int] = {}
    for host in ctx.inventory():
        sizes[host.environment] = sizes.get(host.environment, 0) + 1
    for env in sorted(ctx.farm.environments):
        if ctx.queue is not None:
            # Repairs and late allocations run in the pool's FIFO group so they never race an allocation.
            shards = shards_for(sizes.get(env, 0))
            for shard in range(shards):
                body: dict[str, Any] = {"pool": env, "reason": "sync"}
                if shards > 1:
                    body |= {"shard": shard, "shards": shards}
                ctx.queue.send(body, group=env, dedup_id=f"sync-{env}-{bucket}-{shard}of{shards}")
            report.pools_queued.append(env if shards == 1 else f"{env} ({shards} shards)")
        else:
            repair = reconcile_pool(ctx, env)
            report.tags_removed += repair.removed
            report.tags_restored += repair.restored
            report.conflicts += repair.conflicts
            report.allocated += [o.ir for o in repair.outcomes if o.action == "allocated"]
