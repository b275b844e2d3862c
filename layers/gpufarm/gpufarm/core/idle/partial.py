"""Idle state per host (or device) of a lease, and partial reclaim: the idle part of a busy lease goes back.

gpufarm's idle monitors judge each lease per host (per device on shared pools, gpufarm.setup.monitors), so a
16-GPU lease whose second host sits idle while the first trains is caught on that host alone. What then happens is
the farm's idle policy (`idle.partial`, per environment and team, gpufarm.core.config.farm.PartialIdle):

- every idle part is warned once, and the time of its warning is kept in the incident (`gpufarm_idle_parts`,
  `part=time`; state lives only in incident fields, docs/design.md, rule 1);
- a part still idle when its grace is over: with `reclaim` it leaves the lease (on a dedicated pool the host's
  `ir:` tags go, the lease's hosts, GPUs per host and GPU count shrink, so the quota counts the smaller lease, the
  requester and the operators are told which hosts went, and waiting requests get them); with `warn` the lease
  keeps it;
- when every part of the lease is idle past its grace the whole lease is reclaimed (reason idle), as before;
- a Recovered for one part clears that part only; the warning stands while another part is still idle;
- Keep clears every part's warning.

A part is a host name, or `host/uuid` for one device of a lease on a shared pool (the monitors there group by
device): a shared lease gives back the idle devices' units (its GPU count on that host), and the host's `ir:` tag
only once it holds nothing there. Returned parts are recorded (`gpufarm_idle_returned`, `part=gpus@time`) so a
later alert for a device already given back is not counted twice. Every step runs as an idle or busy incident
command in the pool's queue group (gpufarm.core.commands.executor), one writer per incident; a redelivered command finds
its id in the incident (gpufarm.core.commands.record), and an alert repeated for a part already warned warns no one.

The decisions (`decide_idle`, `decide_busy`, `every_part_due`) are pure; `idle` and `busy` carry them out
through the lease context (gpufarm.core.context.lease_context).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from gpufarm.core.chat import idle_notices, messages
from gpufarm.core.config.farm import FarmConfig, IdlePolicy, PartialIdle, PoolKind
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.idle import lease_window
from gpufarm.core.idle.delivery import deliver_warning
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history, units
from gpufarm.core.kernel.bounded import ascii_digits
from gpufarm.core.kernel.hosts import GpuUnit, assign_tag
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, encode_host_gpus, isoformat, parse_time
from gpufarm.core.kernel.serial import IdleScope
from gpufarm.core.leases import allocation, ending, metrics

log = logging.getLogger(__name__)

DEVICE_SEP = "/"
# A lease holds a bounded number of parts; a field past this many entries is cut (oldest parts kept first).
MAX_PARTS = 512
ALREADY_WARNED = "already warned"


class Step(StrEnum):
    """What an idle alert does to a lease."""

    NOTHING = "nothing"  # already warned and not yet due, or due but the policy only warns about a partial idle
    WARN = "warn"  # parts newly idle: record them and warn
    SHRINK = "shrink"  # parts idle past the grace leave the lease (policy reclaim); newly idle ones are warned
    RECLAIM = "reclaim"  # every part idle past the grace: the whole lease is reclaimed


@dataclass(frozen=True)
class IdleDecision:
    """The step, the parts it warns about and returns, and the per-part idle state to write."""

    step: Step
    why: str
    warned: tuple[str, ...] = ()
    returned: tuple[str, ...] = ()
    idle: dict[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class BusyDecision:
    """Which warned parts a recovery clears and what stays idle."""

    cleared: tuple[str, ...]
    idle: dict[str, datetime]


# -- encoding ------------------------------------------------------------------------------------------------


def decode_idle(items: Iterable[str]) -> dict[str, datetime]:
    """`["gpu-a-01=2026-03-02T09:00:00Z"]` → `{"gpu-a-01": datetime}`; malformed entries are skipped."""
    out: dict[str, datetime] = {}
    for item in list(items)[:MAX_PARTS]:
        part, sep, when = item.rpartition("=")
        moment = parse_time(when) if sep else None
        if part and moment is not None:
            out.setdefault(part, moment)
    return out


def encode_idle(idle: Mapping[str, datetime]) -> list[str]:
    """Inverse of decode_idle, sorted for stable diffs."""
    return [f"{part}={isoformat(when)}" for part, when in sorted(idle.items())][:MAX_PARTS]


def returned_parts(items: Iterable[str]) -> dict[str, int]:
    """`["gpu-a-01=8@2026-03-02T10:00:00Z"]` → `{"gpu-a-01": 8}`: parts a lease gave back idle, with their GPUs."""
    out: dict[str, int] = {}
    for item in list(items)[:MAX_PARTS]:
        part, sep, rest = item.rpartition("=")
        gpus = ascii_digits(rest.partition("@")[0], max_digits=6) if sep else None
        if part and gpus is not None:
            out[part] = out.get(part, 0) + gpus
    return out


def returned_entry(part: str, gpus: int, when: datetime) -> str:
    """One `gpufarm_idle_returned` entry."""
    return f"{part}={gpus}@{isoformat(when)}"


def host_of(part: str) -> str:
    """The host a part is on (a host is its own)."""
    return part.split(DEVICE_SEP, 1)[0]


# -- pure decisions ------------------------------------------------------------------------------------------


def named_parts(alloc: Allocation, scope: IdleScope | None, kind: PoolKind) -> list[str]:
    """The lease's parts an alert names, in the lease's spelling of its hosts; every host when it names none.

    On a shared pool an alert for one device on one host (the monitors' group there) names `host/uuid`; a device
    the lease's recorded units (gpufarm.core.kernel.units) do not include is not its own. Parts the lease already gave
    back are left out: their alerts change nothing.
    """
    gone = returned_parts(alloc.idle_returned)
    hosts = _named_hosts(alloc, scope)
    if not hosts:
        parts = list(alloc.hosts)
    elif kind is PoolKind.SHARED and scope is not None and scope.devices and len(hosts) == 1:
        parts = _device_parts(alloc, hosts[0], scope.devices)
    else:
        parts = hosts
    return [p for p in dict.fromkeys(parts) if p not in gone]


def _named_hosts(alloc: Allocation, scope: IdleScope | None) -> list[str]:
    """The scope's hosts the lease holds, in the lease's spelling (alerts may differ in case); others are dropped."""
    held = {h.lower(): h for h in alloc.hosts}
    return [held[h.lower()] for h in (scope.hosts if scope is not None else ()) if h.lower() in held]


def _device_parts(alloc: Allocation, host: str, devices: Sequence[str]) -> list[str]:
    """`host/uuid` parts for the named devices the lease holds on `host`.

    A lease that records no units there (allocated before units were kept) owns every device named, since there is
    nothing to check them against.
    """
    recorded = {u.uuid.lower() for u in units.lease_devices(alloc).get(host, ()) if u.uuid}
    return [f"{host}{DEVICE_SEP}{d}" for d in devices if not recorded or d.lower() in recorded]


def current_idle(alloc: Allocation) -> dict[str, datetime]:
    """The lease's per-part idle state, kept to the hosts it still holds.

    A lease warned before per-part state existed (phase idle-warned, no parts recorded) counts every host as
    warned at its warning time, so its reclaim waits the grace it was promised. A lease not in phase idle-warned
    has no warning standing, whatever its field still says.
    """
    if alloc.phase is not Phase.IDLE_WARNED:
        return {}
    held = set(alloc.hosts)
    idle = {p: t for p, t in decode_idle(alloc.idle_parts).items() if host_of(p) in held}
    if not idle and alloc.phase is Phase.IDLE_WARNED and alloc.idle_warned_at is not None:
        idle = dict.fromkeys(alloc.hosts, alloc.idle_warned_at)
    return idle


def idle_gpus(alloc: Allocation, parts: Iterable[str]) -> dict[str, int]:
    """GPUs per host that the parts cover: a whole host's GPUs, or one per device (at most what the lease holds)."""
    out: dict[str, int] = {}
    whole: set[str] = set()
    for part in parts:
        host = host_of(part)
        held = alloc.host_gpus.get(host, 0)
        if part == host:
            whole.add(host)
            out[host] = held
        elif host not in whole:
            out[host] = min(held, out.get(host, 0) + 1)
    return out


def _covers_lease(alloc: Allocation, parts: Iterable[str]) -> bool:
    """Whether the parts are all of the lease: every host whole, or all the GPUs it holds there."""
    covered = idle_gpus(alloc, parts)
    whole = {host_of(p) for p in parts if p == host_of(p)}
    return bool(alloc.hosts) and all(
        h in whole or (alloc.host_gpus.get(h, 0) > 0 and covered.get(h, 0) >= alloc.host_gpus[h]) for h in alloc.hosts
    )


def _due(idle: Mapping[str, datetime], now: datetime, grace_minutes: int) -> list[str]:
    grace = timedelta(minutes=grace_minutes)
    return sorted(p for p, since in idle.items() if now - since >= grace)


def every_part_due(alloc: Allocation, now: datetime, policy: IdlePolicy) -> bool:
    """Whether the whole lease is idle past its grace (the sync's idle reclaim, and the last part of a lease)."""
    if alloc.state is State.RESOLVED or alloc.phase is not Phase.IDLE_WARNED:
        return False
    return _covers_lease(alloc, _due(current_idle(alloc), now, policy.grace_minutes))


def decide_idle(alloc: Allocation, parts: Sequence[str], now: datetime, policy: IdlePolicy) -> IdleDecision:
    """What an idle alert naming `parts` of the lease does now (pure)."""
    if alloc.state is State.RESOLVED or alloc.phase not in (Phase.ALLOCATED, Phase.IDLE_WARNED):
        return IdleDecision(Step.NOTHING, ALREADY_WARNED)
    idle = current_idle(alloc)
    warned = tuple(p for p in parts if p not in idle)
    for part in warned:
        idle[part] = now
    due = _due(idle, now, policy.grace_minutes)
    if due and _covers_lease(alloc, due):
        return IdleDecision(Step.RECLAIM, "every part idle past the grace", idle=idle)
    if due and policy.partial is PartialIdle.RECLAIM:
        rest = {p: t for p, t in idle.items() if p not in due}
        return IdleDecision(Step.SHRINK, "idle past the grace", warned, tuple(due), rest)
    if warned:
        return IdleDecision(Step.WARN, "newly idle", warned, idle=idle)
    if due:
        return IdleDecision(Step.NOTHING, "partly idle past the grace; the policy only warns", idle=idle)
    return IdleDecision(Step.NOTHING, ALREADY_WARNED, idle=idle)


def decide_busy(alloc: Allocation, parts: Sequence[str], *, whole: bool) -> BusyDecision:
    """Which warnings a recovery clears: the parts it names (every part when it named the whole lease)."""
    idle = current_idle(alloc)
    if whole:
        return BusyDecision(tuple(sorted(idle)), {})
    hosts = set(parts)
    # A host's recovery clears its devices too; a device's clears that device.
    cleared = tuple(sorted(p for p in idle if p in hosts or host_of(p) in hosts))
    return BusyDecision(cleared, {p: t for p, t in idle.items() if p not in cleared})


def shrunk(alloc: Allocation, returned: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    """The lease's GPUs per host once `returned` parts leave it, and the GPUs each part gave back."""
    gone = idle_gpus(alloc, returned)
    remaining = {h: n - gone.get(h, 0) for h, n in alloc.host_gpus.items() if n - gone.get(h, 0) > 0}
    given: dict[str, int] = {}
    for part in returned:
        host = host_of(part)
        given[part] = alloc.host_gpus.get(host, 0) if part == host else 1
    return remaining, given


# -- carried out through the service -------------------------------------------------------------------------


def idle(ctx: LeaseContext, alloc: Allocation, scope: IdleScope | None) -> Outcome | None:
    """An idle alert for a lease that holds hosts: warn, shrink, or reclaim; None leaves the lease to the caller.

    None only for a lease holding no hosts (nothing per host to judge): the caller's whole-lease rules apply.
    """
    if not alloc.hosts:
        return None
    policy = lease_window.policy_for(ctx.farm, alloc)  # the grace the lease chose, else its pool's and team's
    parts = named_parts(alloc, scope, _kind(ctx, alloc))
    if not parts:
        return Outcome(alloc.ir, "ignored: the alert names only parts the lease already gave back")
    now = ctx.now()
    decision = decide_idle(alloc, parts, now, policy)
    where = f" {scope.describe()}" if scope is not None and scope.describe() else ""
    if decision.step is Step.NOTHING:
        why = "" if decision.why == ALREADY_WARNED else f": {decision.why}"
        return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value}){why}")
    if decision.step is Step.RECLAIM:
        ending.resolve(ctx, alloc, ReclaimReason.IDLE, by=None)
        return Outcome(alloc.ir, f"resolved (idle){where}")
    if decision.step is Step.SHRINK:
        alloc, returned = _shrink(ctx, alloc, decision, policy)
        outcome = f"returned {', '.join(returned)}"
        if decision.warned:
            _warn(ctx, alloc, decision, scope, policy=policy, now=now)
            outcome += f"; warned {', '.join(decision.warned)}"
        waiting = allocation.allocate_waiting(ctx, alloc.environment) if alloc.environment else []
        placed = [str(o) for o in waiting if o.action == "allocated"]
        return Outcome(alloc.ir, outcome + (f"; then {'; '.join(placed)}" if placed else ""), tuple(returned))
    _warn(ctx, alloc, decision, scope, policy=policy, now=now)
    return Outcome(alloc.ir, f"warned{where}")


def busy(ctx: LeaseContext, alloc: Allocation, scope: IdleScope | None) -> Outcome | None:
    """A recovery: clear the named parts' warnings; back to allocated when nothing is idle any more.

    None for a lease holding no hosts (the caller's whole-lease rules apply).
    """
    if not alloc.hosts:
        return None
    if alloc.phase is not Phase.IDLE_WARNED or alloc.state is State.RESOLVED:
        return Outcome(alloc.ir, f"nothing to do ({alloc.phase.value})")
    whole = scope is None or not scope.hosts
    decision = decide_busy(alloc, named_parts(alloc, scope, _kind(ctx, alloc)), whole=whole)
    if not decision.cleared:
        return Outcome(alloc.ir, "nothing to do (no warning on those parts)")
    step = ctx.step(history.MONITOR, history.Step.RECOVERED, ", ".join(decision.cleared))
    if decision.idle:
        values: dict[str, object] = {f.IDLE_PARTS: encode_idle(decision.idle)}
        updated = ctx.write(alloc, Phase.IDLE_WARNED, values, step=step)
        still = sorted(decision.idle)
        ctx.tell(
            updated.requester, idle_notices.partly_busy_again(updated, decision.cleared, still, ctx.links_for(updated))
        )
        return Outcome(alloc.ir, f"recovered {', '.join(decision.cleared)}; still idle {', '.join(decision.idle)}")
    updated = ctx.write(alloc, Phase.ALLOCATED, {f.IDLE_WARNED_AT: None, f.IDLE_PARTS: []}, step=step)
    ctx.tell(updated.requester, messages.busy_again(updated, ctx.links_for(updated)))
    return Outcome(alloc.ir, "recovered")


def _kind(ctx: LeaseContext, alloc: Allocation) -> PoolKind:
    env = ctx.farm.environments.get(alloc.environment or "")
    return env.kind if env is not None else PoolKind.DEDICATED


def _warn(
    ctx: LeaseContext,
    alloc: Allocation,
    decision: IdleDecision,
    scope: IdleScope | None,
    *,
    policy: IdlePolicy,
    now: datetime,
) -> Allocation:
    """Record the newly idle parts (and the warning's time) and warn the requester about them."""
    values: dict[str, object] = {f.IDLE_WARNED_AT: isoformat(now), f.IDLE_PARTS: encode_idle(decision.idle)}
    kind = f"kind {(scope.kind if scope is not None else None) or 'idle'}"
    evidence = scope.describe() if scope is not None and scope.describe() else "on " + ", ".join(decision.warned)
    step = ctx.step(history.MONITOR, history.Step.WARNED, kind, evidence)
    part_of = not _covers_lease(alloc, decision.idle)
    links = ctx.links_for(alloc)
    warning = idle_notices.idle_warning(alloc, policy, now, scope, links, partial=policy.partial if part_of else None)
    # Told first, recorded after: the grace (and so the reclaim) starts from a warning the holder got.
    deliver_warning(ctx.chat, alloc.requester, warning)
    updated = ctx.write(alloc, Phase.IDLE_WARNED, values, step=step)
    metrics.warned(ctx, alloc)
    return updated


def _shrink(
    ctx: LeaseContext, alloc: Allocation, decision: IdleDecision, policy: IdlePolicy
) -> tuple[Allocation, list[str]]:
    """Untag the hosts the lease gives back, then write the smaller lease; tell the requester and the operators.

    Tags go first and the incident write is the commit: a run that fails in between is redelivered and, the
    incident unchanged, decides the same again (untagging twice removes nothing twice).
    """
    remaining, given = shrunk(alloc, decision.returned)
    gone_hosts = sorted(h for h in alloc.hosts if h not in remaining)
    for host in gone_hosts:
        ctx.untag_host(host, alloc)
    kept_units = _kept_units(ctx, alloc, given, remaining)
    now = ctx.now()
    values: dict[str, object] = {
        f.HOSTS: [h for h in alloc.hosts if h in remaining],
        f.HOST_GPUS: encode_host_gpus(remaining),
        f.GPU_COUNT: str(sum(remaining.values())),
        **({f.DEVICES: units.encode_devices(kept_units)} if kept_units is not None else {}),
        f.IDLE_PARTS: encode_idle(decision.idle),
        f.IDLE_RETURNED: [*alloc.idle_returned, *(returned_entry(p, n, now) for p, n in sorted(given.items()))][
            -MAX_PARTS:
        ],
    }
    still_idle = bool(decision.idle) or bool(decision.warned)
    if not still_idle:
        values[f.IDLE_WARNED_AT] = None
    gave = ", ".join(f"{p} ({n} GPUs)" for p, n in sorted(given.items()))
    step = ctx.step(history.MONITOR, history.Step.SHRUNK, f"idle past the grace: {gave}", f"now {values[f.GPU_COUNT]}")
    updated = ctx.write(alloc, Phase.IDLE_WARNED if still_idle else Phase.ALLOCATED, values, step=step)
    metrics.reclaimed(ctx, alloc, metrics.PARTIAL_IDLE, sum(given.values()))
    message = idle_notices.partly_reclaimed(updated, given, gone_hosts, policy.grace_minutes, ctx.links_for(updated))
    ctx.tell(updated.requester, message)
    ctx.post_operators(message)
    log.info("%s gave back %s idle past the grace", alloc.ir_label, ", ".join(given))
    return updated, sorted(given)


def _kept_units(
    ctx: LeaseContext, alloc: Allocation, given: Mapping[str, int], remaining: Mapping[str, int]
) -> units.Devices | None:
    """The recorded units (shared pools) the lease keeps; the returned devices' `gpu_assign` tags are removed.

    None when the lease records no units (a dedicated lease, or one allocated before units were kept): its GPU
    count per host says all there is.
    """
    recorded = units.lease_devices(alloc)
    if not recorded:
        return None
    returned = {p.lower() for p in given}
    me = ir_tag_value(alloc.ir)
    kept: dict[str, tuple[GpuUnit, ...]] = {}
    for host, held in recorded.items():
        if host not in remaining:
            continue  # untagged whole by _untag_host, its gpu_assign tags with it
        stays = _staying_units(host, held, returned, remaining[host])
        kept[host] = stays
        _drop_assign_tags(ctx, host, me, held, stays)
    return {h: v for h, v in kept.items() if v}


def _staying_units(host: str, held: Sequence[GpuUnit], returned: set[str], count: int) -> tuple[GpuUnit, ...]:
    """The units on `host` that stay: those whose `host/uuid` part was not returned, at most `count` of them."""
    stays = tuple(u for u in held if f"{host}{DEVICE_SEP}{u.uuid}".lower() not in returned)
    # Units known by index only (an agent that publishes none) cannot be matched: the count decides.
    return stays[:count]


def _drop_assign_tags(ctx: LeaseContext, host: str, me: str, held: Sequence[GpuUnit], stays: Sequence[GpuUnit]) -> None:
    """Remove the `gpu_assign` tags of the held units that do not stay; the host's tags are read only if some go.

    Tags are written back only when one of them is actually there, so a redelivered run writes nothing.
    """
    drop = {assign_tag(me, u.uuid) for u in held if u.uuid and u not in stays}
    current = ctx.user_tags(host) if drop else None
    if current is not None and drop & set(current):
        ctx.put_tags(host, [t for t in current if t not in drop])


def grace_over(farm: FarmConfig, alloc: Allocation, now: datetime) -> bool:
    """True once the lease's idle warning is older than its grace period (its own, else its pool's and team's)."""
    warned = alloc.idle_warned_at
    return warned is not None and now - warned >= timedelta(minutes=lease_window.policy_for(farm, alloc).grace_minutes)
