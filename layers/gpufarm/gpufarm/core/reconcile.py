"""The scheduled sync: expiries as commands, tag drift repaired per pool (and per shard of a large pool), gauges.

Work per invocation is bounded by the farm's pools, not by the farm: the sync itself reads the live incidents and
the host list once (GpuFarm.reading), queues each expiry as a command in its incident's pool group, and queues one
repair per pool, or one per shard of a pool holding more than SHARD_HOSTS hosts (shards by a stable hash of the
host name, so a host is always repaired by the same shard). Each repair runs in the pool's FIFO group, after every
allocation queued before it, and decides from the host list's `user` tags (`tags_by_source`): a host that needs
nothing costs no request of its own, and a host about to be written is read again first (the one-writer rules in
gpufarm.core.service).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufarm.core import accounting, agent_source, agent_usage, budgets, history, leases, lifecycle_metrics
from gpufarm.core.bounded import ascii_digits
from gpufarm.core.farm import PoolKind
from gpufarm.core.history import Step
from gpufarm.core.inventory import GPU_ASSIGN_KEY, IR_KEY, PROJECT_KEY, TEAM_KEY, normalize_tag, tag_values
from gpufarm.core.ir import ir_tag_value
from gpufarm.core.lifecycle import Phase, ReclaimReason
from gpufarm.core.model import Allocation
from gpufarm.core.ports import InventorySource, MetricPoint, MetricSeries, SourceReading
from gpufarm.core.serial import IncidentCommand, Op, pool_group
from gpufarm.core.sources import (
    Ledger,
    StaticSource,
    agent_node,
    ledger_series,
    merge,
    post_source_events,
    read_all,
    read_in_background,
)
from gpufarm.core.units import assign_tags, lease_devices, stale_assignments, wanted_assign_tags
from gpufarm.core.views import Message

if TYPE_CHECKING:
    from gpufarm.core.service import GpuFarm, Outcome

log = logging.getLogger(__name__)

HOLDING_PHASES = frozenset({Phase.ALLOCATED, Phase.IDLE_WARNED})
# A pool holding more hosts than this is repaired in shards of about this many, one queue message each, so one
# repair invocation stays far inside its timeout and memory whatever the pool's size (benchmarks/scale.py).
SHARD_HOSTS = 10_000
MAX_SHARDS = 64
SYNC_BUCKET_S = 300


@dataclass
class Repair:
    """What reconciling one pool (or one shard of it) did."""

    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


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
    # busy-GPU query answered (gpufarm.core.accounting).
    accrued: list[int] = field(default_factory=list)
    measured: bool = False
    # What the inventory sources found: nodes without an agent, down hosts, unknown nodes, sources skipped.
    inventory: dict[str, Any] = field(default_factory=dict)


def shards_for(hosts: int) -> int:
    """How many repair messages a pool of this many hosts gets."""
    return max(1, min(MAX_SHARDS, -(-hosts // SHARD_HOSTS)))


def shard_of(host: str, shards: int) -> int:
    """The shard a host belongs to: a stable hash of its name (the same in every container and every sync)."""
    if shards <= 1:
        return 0
    digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def sync(svc: GpuFarm) -> SyncReport:
    """Expire, reclaim idle past grace, repair drift per pool (queued when a queue exists), publish gauges.

    With a queue, expiries go to the incident's pool group as commands that re-check the incident there, so
    an expiry never overwrites a Keep or an extension that ran in between (docs/design.md, rule 7), and each
    pool's repair (or each shard's) goes to the pool's group as its own message.
    """
    report = SyncReport()
    # The inventory sources (clouds) are read on their own threads while this reads Datadog (gpufarm.core.sources).
    pending = read_in_background(inventory_sources(svc))
    bucket = int(svc.clock.now().timestamp()) // SYNC_BUCKET_S
    for alloc in svc._live():
        reason = svc._due(alloc)
        if reason is None:
            if leases.reminder_due(alloc, svc.farm, svc.clock.now()):
                _remind(svc, alloc, bucket)
                report.reminded.append(alloc.ir)
            continue
        if svc.queue is not None:
            command = IncidentCommand(op=Op.EXPIRE, ir=alloc.ir, origin=f"sync-{bucket}")
            svc.queue.send(command.to_body(), group=pool_group(alloc.environment), dedup_id=command.dedup_id())
        else:
            svc._resolve(alloc, reason, by=None)
        if reason is ReclaimReason.WITHDRAWN:
            report.withdrawn.append(alloc.ir)
        else:
            (report.expired if reason is ReclaimReason.EXPIRED else report.idle_reclaimed).append(alloc.ir)
    sizes: dict[str, int] = {}
    for host in svc._inventory():
        sizes[host.environment] = sizes.get(host.environment, 0) + 1
    for env in sorted(svc.farm.environments):
        if svc.queue is not None:
            # Repairs and late allocations run in the pool's FIFO group so they never race an allocation.
            shards = shards_for(sizes.get(env, 0))
            for shard in range(shards):
                body: dict[str, Any] = {"pool": env, "reason": "sync"}
                if shards > 1:
                    body |= {"shard": shard, "shards": shards}
                svc.queue.send(body, group=env, dedup_id=f"sync-{env}-{bucket}-{shard}of{shards}")
            report.pools_queued.append(env if shards == 1 else f"{env} ({shards} shards)")
        else:
            repair = reconcile_pool(svc, env)
            report.tags_removed += repair.removed
            report.tags_restored += repair.restored
            report.conflicts += repair.conflicts
            report.allocated += [o.ir for o in repair.outcomes if o.action == "allocated"]
    ledger = read_ledger(svc, pending())
    report.inventory = ledger.summary()
    post_source_events(svc.events, ledger, int(svc.clock.now().timestamp()))
    # One metrics query measures every lease's busy GPUs; the leases due accrue their GPU-hours from it.
    usage = accounting.measure(svc.usage, svc.clock.now(), svc.farm.ledger, agent_usage.for_farm(svc.farm))
    report.measured = usage.measured
    ending = {*report.expired, *report.withdrawn, *report.idle_reclaimed}  # their end writes their final hours
    report.accrued = accounting.queue_accruals(svc, usage, f"sync-{bucket}", skip=ending)
    report.series = publish_gauges(svc, ledger, usage)
    return report


def inventory_sources(svc: GpuFarm) -> list[InventorySource]:
    """The farm file's static list, the Datadog Agent's GPU check and the sources the runtime built (the clouds; a
    runtime that built the Agent's source itself, a benchmark measuring it, keeps its own)."""
    static = svc.farm.inventory.static
    built = {s.name for s in svc.sources}
    agent = None if agent_source.SOURCE in built else agent_source.for_farm(svc.farm, svc.usage, svc.clock)
    return [*([StaticSource(static)] if static else []), *([agent] if agent else []), *svc.sources]


def read_ledger(svc: GpuFarm, readings: list[SourceReading] | None = None) -> Ledger:
    """Every inventory source read once (unless already read) and merged with the registered hosts."""
    settings = svc.farm.inventory
    if readings is None:
        readings = read_all(inventory_sources(svc))
    reads = svc._reads()
    agents = [agent_node(h, reads.listed_info(h.name)) for h in svc._inventory()]
    now = svc.clock.now().timestamp()
    return merge(
        agents,
        readings,
        now=now,
        down_after_minutes=settings.down_after_minutes,
        environments=svc.farm.environments,
    )


def _remind(svc: GpuFarm, alloc: Allocation, bucket: int) -> None:
    """The reminder before a lease's end, as a command in its pool's group (re-checked there, sent once)."""
    if svc.queue is None:
        svc.remind(alloc.ir)
        return
    command = IncidentCommand(op=Op.REMIND, ir=alloc.ir, origin=f"sync-{bucket}")
    svc.queue.send(command.to_body(), group=pool_group(alloc.environment), dedup_id=command.dedup_id())


def reconcile_pool(svc: GpuFarm, environment: str, shard: int = 0, shards: int = 1) -> Repair:
    """Make host tags agree with incidents in one pool (or one shard of it), then allocate whatever now fits.

    Tags of incidents that are gone, resolved, or do not hold the host are removed; a holding incident whose
    tags are missing gets them back, except on a dedicated host another live incident's tag already holds:
    that double claim is never "repaired" into a shared host but reported to the operators. Waiting requests
    are allocated by the last shard, after every shard of this sync has freed what it found.
    """
    repair = Repair()
    live = {a.ir: a for a in svc._live(environment)}
    env = svc.farm.environments.get(environment)
    dedicated = env is None or env.kind is PoolKind.DEDICATED
    reads = svc._reads()
    pool = [h for h in svc._inventory(environment) if shard_of(h.name, shards) == shard]
    for host in pool:
        stale = [v for v in host.irs if not holds(live, v, host.name)]
        # gpu_assign tags of units no live lease records (gpufarm.core.units), removed like stale ir: tags.
        stray = stale_assignments(host, live, HOLDING_PHASES)
        if not stale and not stray and (host.irs or not alloc_tags(host.tags, {PROJECT_KEY, TEAM_KEY})):
            continue
        current = svc._user_tags(host.name)  # re-read: this host is about to be written
        if current is None:
            continue
        keep_irs = [v for v in tag_values(current, IR_KEY) if v not in stale]
        holders = [live[n] for n in ir_numbers(keep_irs) if n in live]
        wanted = allocation_tags(holders) + wanted_assign_tags(holders, host.name, current, HOLDING_PHASES)
        new = [t for t in current if not is_alloc_tag(t) or t in wanted]
        if new != current:
            svc._put_tags(host.name, new)
            repair.removed += [f"{host.name}:{t}" for t in current if t not in new]
    for alloc in sorted(live.values(), key=lambda a: a.ir):
        if alloc.phase not in HOLDING_PHASES:
            continue
        restored: list[str] = []
        for name in alloc.hosts:
            if shard_of(name, shards) != shard:
                continue
            # Its ir: tag and, on a shared pool, one gpu_assign tag per unit it records on the host.
            need = [alloc.ir_tag, *assign_tags(alloc.ir, lease_devices(alloc).get(name, ()))]
            listed = reads.listed_user_tags(name)
            if listed is not None and all(t in listed for t in need):
                continue  # the host list shows the tags: nothing to restore, nothing to read
            current = svc._user_tags(name)
            if current is None or all(t in current for t in need):
                continue
            others = [v for v in tag_values(current, IR_KEY) if v != ir_tag_value(alloc.ir)]
            if dedicated and others:
                repair.conflicts.append(f"{name}: {alloc.ir_label} and {', '.join(others)}")
                continue
            missing = [t for t in [*allocation_tags([alloc]), *need[1:]] if t not in current]
            svc._put_tags(name, [*current, *missing])
            repair.restored += [f"{name}:{t}" for t in missing]
            restored.append(f"{', '.join(missing)} on {name}")
        if restored:
            # The lease's own record of the drift the sync put right (gpufarm.core.history).
            step = svc._step(history.SYNC, Step.REPAIRED, "restored " + "; ".join(restored))
            svc._write(alloc, alloc.phase, {}, step=step)
    if repair.conflicts:
        log.error("dedicated hosts claimed by two incidents: %s", "; ".join(repair.conflicts))
        svc._post_operators(
            Message(
                ":rotating_light: gpufarm found dedicated hosts claimed by two allocations; "
                "resolve one of them: " + "; ".join(repair.conflicts)
            )
        )
    if shard == shards - 1:
        repair.outcomes = svc.allocate_waiting(environment)
    return repair


def publish_gauges(svc: GpuFarm, ledger: Ledger | None = None, usage: accounting.Usage | None = None) -> int:
    """Quota (entitled / allocated per team, pool, model), inventory (total / free per pool, model), waiting requests
    and idle warnings (gpufarm.core.lifecycle_metrics) and ledger gauges.

    The ledger's (gpufarm.core.sources.LEDGER_GAUGES: down, no agent, cloud quotas, source errors) are read here
    when the caller did not read it already.
    """
    if svc.metrics is None:
        return 0
    if ledger is None:
        ledger = read_ledger(svc)
    live = svc._live()
    ts = int(svc.clock.now().timestamp())
    series: list[MetricSeries] = []

    def gauge(name: str, value: float, tags: list[str]) -> None:
        series.append(MetricSeries(name, (MetricPoint(ts, float(value)),), tuple(tags), type=3))

    held: dict[tuple[str | None, str | None, str], int] = {}
    for a in live:
        if a.phase in HOLDING_PHASES:
            key = (a.team, a.environment, (a.gpu_model or "").upper())
            # What the lease holds: whole hosts on dedicated pools (gpufarm.core.charging), not what it asked.
            held[key] = held.get(key, 0) + (sum(a.host_gpus.values()) or a.gpu_count)
    for team, spec in sorted(svc.farm.teams.items()):
        for env, models in sorted(spec.quotas.items()):
            for model, q in sorted(models.items()):
                tags = metric_tags(team=team, environment=env, gpu_model=model)
                gauge("gpufarm.quota.entitled", q.gpus, tags)
                gauge("gpufarm.quota.allocated", held.get((team, env, model), 0), tags)
    for (env, model), (free, total) in sorted(svc._inventory_summary().items()):
        tags = metric_tags(environment=env, gpu_model=model)
        gauge("gpufarm.inventory.gpus.total", total, tags)
        gauge("gpufarm.inventory.gpus.free", free, tags)
    series += ledger_series(ledger, ts)
    # Requests waiting and their age, leases warned as idle: from the same read of the live incidents.
    series += lifecycle_metrics.gauges(live, svc.farm, svc.clock.now())
    if usage is None:
        usage = accounting.measure(svc.usage, svc.clock.now(), svc.farm.ledger, agent_usage.for_farm(svc.farm))
    measured = accounting.accounts(live, usage, svc._inventory())
    series += accounting.ledger_series(measured, budgets.burns(svc, svc.farm.budgets), ts)
    if series:
        svc.metrics.submit(series)
    return len(series)


# -- tag arithmetic shared with allocation and reclaim ---------------------------------------------------------


def allocation_tags(allocs: Iterable[Allocation]) -> list[str]:
    """The ir:, project: and team: tags these allocations put on a host, normalized as Datadog stores them."""
    tags: list[str] = []
    for a in allocs:
        wanted = [a.ir_tag]
        wanted += [f"{PROJECT_KEY}:{a.project}"] if a.project else []
        wanted += [f"{TEAM_KEY}:{a.team}"] if a.team else []
        tags += [t for t in (normalize_tag(w) for w in wanted) if t not in tags]
    return tags


def is_alloc_tag(tag: str) -> bool:
    """True for the tags an allocation puts on a host (ir:, project:, team:, gpu_assign:)."""
    return tag.split(":", 1)[0] in (IR_KEY, PROJECT_KEY, TEAM_KEY, GPU_ASSIGN_KEY)


def alloc_tags(tags: Iterable[str], keys: set[str]) -> list[str]:
    """The tags whose key is one of these."""
    return [t for t in tags if t.split(":", 1)[0] in keys]


def ir_numbers(values: Iterable[str]) -> list[int]:
    """IR numbers of `ir-123` tag values (anything else skipped)."""
    out = []
    for value in values:
        number = ascii_digits(value.removeprefix("ir-"))
        if number is not None:
            out.append(number)
    return out


def holds(live: dict[int, Allocation], tag_value: str, host: str) -> bool:
    """True when the tag's incident is live and either holds the host or may be mid-allocation."""
    numbers = ir_numbers([tag_value])
    alloc = live.get(numbers[0]) if numbers else None
    if alloc is None:
        return False
    if alloc.phase in HOLDING_PHASES:
        return host in alloc.hosts
    return True


def metric_tags(**values: Any) -> list[str]:
    """`key:value` metric tags, normalized as Datadog stores them."""
    return [normalize_tag(f"{k}:{v}") for k, v in values.items()]
