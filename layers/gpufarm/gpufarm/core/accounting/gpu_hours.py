"""The true ledger: what each lease holds, how much of it the agents saw busy, and the GPU-hours it accrued.

**Used** is measured, never assumed: the sync makes one metrics query (`avg:gpufarm.ir.gpus_busy{*} by
{gpu_ir,host}` over `ledger.window_minutes`), so the read stays one call whatever the farm's size, and one more
when the farm has `datadog-agent` pools: their devices' `gpu.sm_active` by host and `ir` host tag, merged into the
same measurement (gpufarm.core.accounting.agent_usage). Of a lease's idle devices, those **idle-held** (memory held,
no work: `gpufarm.ir.gpus_idle_held`, by the same groups) are read by one more query (`IDLE_HELD_QUERY`): a scalar
request may carry several queries, but how Datadog lines their groups up in one answer is shown by no answer this
project recorded, so each metric is its own call. A failed idle-held read leaves the split out (idle counted as
idle, no process), never the measurement; the Agent's pools cannot tell idle-held (its check reads activity, not
memory held by an idle process), so their idle-held hours stay 0.

A lease's GPUs on a host that reported nothing in the window, or every GPU a failed query should have measured,
are **unmeasured**: counted apart, never as idle (an outage of the metrics must not read as a farm of idle GPUs).
Busy devices the agent attributed to no lease (`gpu_ir:none`, or an Agent host without an `ir` tag) are
**unattributed** usage, per host and team.

**GPU-hours** accrue into the incidents (gpufarm.core.kernel.fields: held, busy, idle, idle-held, unmeasured, to when,
and held per calendar month for the budgets), so a report is rebuilt from incidents alone after metrics retention.
Each interval since the lease's last accrual is charged what it held, split into busy / idle / unmeasured by the
window's measurement. A lease accrues at most once per `ledger.accrue_hours` (leases come due at their own
times, from their allocation, so one sync writes about N / k of them, and at most `ledger.max_accruals`), as an
accrue command in its pool's FIFO group (gpufarm.core.kernel.serial), and once more when it ends (release, reclaim,
expiry: the final held hours, the stretch since the last accrual unmeasured since nothing measured it then).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpufarm.core.accounting import agent_usage
from gpufarm.core.accounting.agent_usage import AgentPools
from gpufarm.core.config.accounting import LedgerSettings
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.accrued import accrued_since as accrued_since  # noqa: PLC0414
from gpufarm.core.kernel.accrued import by_month as by_month  # noqa: PLC0414
from gpufarm.core.kernel.accrued import held_by_host as held_by_host  # noqa: PLC0414
from gpufarm.core.kernel.accrued import month_spans as month_spans  # noqa: PLC0414
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.hosts import TEAM_KEY, GpuHost, tag_value
from gpufarm.core.kernel.ir import ir_tag_value
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.ports import MetricsQuery, ScalarResult
from gpufarm.core.kernel.serial import MAX_ACCRUE_HOSTS, AccrueScope, IncidentCommand, Op, pool_group

log = logging.getLogger(__name__)

BUSY_METRIC = "gpufarm.ir.gpus_busy"
DEVICE_IR_KEY = "gpu_ir"
NO_LEASE = "none"
USAGE_QUERY = f"avg:{BUSY_METRIC}{{*}} by {{{DEVICE_IR_KEY},host}}"
IDLE_HELD_METRIC = "gpufarm.ir.gpus_idle_held"
IDLE_HELD_QUERY = f"avg:{IDLE_HELD_METRIC}{{*}} by {{{DEVICE_IR_KEY},host}}"
# An answer bigger than this is cut (a farm of 20,000 hosts with a few leases each stays far below it).
MAX_GROUPS = 200_000
# Busy devices on one host for one IR above this are not a reading but garbage, and are dropped.
MAX_DEVICES = 1024
HOURS_DIGITS = 3


@dataclass(frozen=True)
class Usage:
    """One sync's measurement: busy and idle-held devices per (gpu_ir value, host), and the hosts that reported."""

    measured: bool
    busy: Mapping[tuple[str, str], float] = field(default_factory=dict)
    hosts: frozenset[str] = frozenset()
    idle_held: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def lease_busy(self, ir: int, host: str) -> float | None:
        """Busy devices of the lease on the host, or None when nothing measured the host."""
        if not self.measured or host not in self.hosts:
            return None
        return self.busy.get((ir_tag_value(ir), host), 0.0)

    def lease_idle_held(self, ir: int, host: str) -> float:
        """Idle-held devices of the lease on the host (0 when nothing measured them)."""
        return self.idle_held.get((ir_tag_value(ir), host), 0.0) if self.measured else 0.0

    def unattributed(self) -> dict[str, float]:
        """Busy devices no lease claims, per host."""
        return {host: v for (irv, host), v in self.busy.items() if irv == NO_LEASE and v > 0}


UNMEASURED = Usage(measured=False)


def measure(
    query: MetricsQuery | None, now: datetime, settings: LedgerSettings, agent: AgentPools | None = None
) -> Usage:
    """The sync's metrics query, and one more with `agent` pools; a failing or absent query is unmeasured (never idle).

    `agent` (gpufarm.core.accounting.agent_usage.for_farm): the `datadog-agent` pools, measured from the Agent's GPU
    check; a failure of either query leaves only its own hosts unmeasured.
    """
    if query is None:
        return UNMEASURED
    start = now - timedelta(minutes=settings.window_minutes)
    node = _node_usage(query, start, now)
    extra = agent_usage.measure(query, agent, start, now, skip=node.hosts) if agent is not None else None
    if extra is None:
        return node
    return Usage(True, {**node.busy, **extra.busy}, node.hosts | extra.hosts, node.idle_held)


def _node_usage(query: MetricsQuery, start: datetime, now: datetime) -> Usage:
    """gpufarm-node's busy devices per (gpu_ir, host): one query, whatever the farm's size; then its idle-held ones."""
    try:
        results = query.scalar(USAGE_QUERY, start, now)
    except GpufarmError as exc:
        log.warning("busy GPUs could not be measured (ledger unmeasured this sync): %s", exc)
        return UNMEASURED
    busy = _devices(results, "busy")
    hosts = frozenset(host for _, host in busy)
    try:
        held = _devices(query.scalar(IDLE_HELD_QUERY, start, now), "idle-held")
    except GpufarmError as exc:
        log.warning("idle-held GPUs could not be read (idle not split this sync): %s", exc)
        held = {}
    return Usage(True, busy, hosts, {k: v for k, v in held.items() if k[1] in hosts})


def _devices(results: Sequence[ScalarResult], what: str) -> dict[tuple[str, str], float]:
    """Devices per (gpu_ir, host) of one answer; garbage (no tags, not a count of devices) dropped."""
    out: dict[tuple[str, str], float] = {}
    for result in results[:MAX_GROUPS]:
        tags = dict(t.partition(":")[::2] for t in result.group_tags)
        irv, host = tags.get(DEVICE_IR_KEY, ""), tags.get("host", "")
        value = result.value
        if not irv or not host or value is None or not math.isfinite(value) or not 0 <= value <= MAX_DEVICES:
            continue
        out[(irv, host)] = out.get((irv, host), 0.0) + value
    if len(results) > MAX_GROUPS:
        log.warning("%s GPU answer cut at %d groups of %d", what, MAX_GROUPS, len(results))
    return out


# -- the ledger now ------------------------------------------------------------------------------------------


@dataclass
class LedgerLine:
    """GPUs of one team, project, environment and model: held, and of those busy, idle, unmeasured (and of the
    idle, those idle-held: memory held, no work)."""

    allocated: int = 0
    used: float = 0.0
    idle: float = 0.0
    unmeasured: int = 0
    idle_held: float = 0.0


LineKey = tuple[str, str, str, str]


@dataclass
class Accounts:
    """The ledger's measured part: per team / project / environment / model, per pool, and unattributed use."""

    lines: dict[LineKey, LedgerLine] = field(default_factory=dict)
    allocated: dict[tuple[str, str], int] = field(default_factory=dict)
    # (host, team, environment) -> busy devices no lease claims.
    unattributed: dict[tuple[str, str, str], float] = field(default_factory=dict)
    measured: bool = False


def accounts(live: Iterable[Allocation], usage: Usage, hosts: Sequence[GpuHost]) -> Accounts:
    """The ledger from the live leases and one measurement (see the module docstring)."""
    out = Accounts(measured=usage.measured)
    for alloc in live:
        if alloc.phase in HOLDING:
            _add_lease(out, alloc, usage)
    _add_unattributed(out, usage, hosts)
    return out


def _add_lease(out: Accounts, alloc: Allocation, usage: Usage) -> None:
    """Count one holding lease's GPUs into its ledger line and its pool's total."""
    model = (alloc.gpu_model or "").upper()
    key = (alloc.team or NO_LEASE, alloc.project or NO_LEASE, alloc.environment or NO_LEASE, model)
    line = out.lines.setdefault(key, LedgerLine())
    for host, gpus in held_by_host(alloc).items():
        _add_host(line, gpus, usage.lease_busy(alloc.ir, host), usage.lease_idle_held(alloc.ir, host))
    pool = (alloc.environment or NO_LEASE, model)
    out.allocated[pool] = out.allocated.get(pool, 0) + sum(held_by_host(alloc).values())


def _add_host(line: LedgerLine, gpus: int, busy: float | None, idle_held: float = 0.0) -> None:
    """Add a host's held GPUs to a ledger line: busy ones (at most those held) as used, the rest idle, of those
    the idle-held ones (at most the idle).

    A host nothing measured (busy None) counts its GPUs as unmeasured, never as idle.
    """
    line.allocated += gpus
    if busy is None:
        line.unmeasured += gpus
    else:
        line.used += min(busy, gpus)
        line.idle += gpus - min(busy, gpus)
        line.idle_held += min(max(idle_held, 0.0), gpus - min(busy, gpus))


def _add_unattributed(out: Accounts, usage: Usage, hosts: Sequence[GpuHost]) -> None:
    """Busy devices no lease claims, per host with the team and pool its tags name (NO_LEASE when unknown)."""
    by_name = {h.name: h for h in hosts}
    for host, busy in sorted(usage.unattributed().items()):
        known = by_name.get(host)
        team = (tag_value(known.tags, TEAM_KEY) if known is not None else None) or NO_LEASE
        env = known.environment if known is not None and known.environment else NO_LEASE
        out.unattributed[(host, team, env)] = busy


# -- GPU-hours into the incidents ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hours:
    """A lease's accrued GPU-hours (idle_held: of the idle ones, those with memory held and no work)."""

    held: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    unmeasured: float = 0.0
    by_month: Mapping[str, float] = field(default_factory=dict)
    idle_held: float = 0.0

    @classmethod
    def of(cls, alloc: Allocation) -> Hours:
        """What the incident records."""
        return cls(
            alloc.hours_held,
            alloc.hours_busy,
            alloc.hours_idle,
            alloc.hours_unmeasured,
            by_month(alloc),
            alloc.hours_idle_held,
        )


def due(alloc: Allocation, now: datetime, settings: LedgerSettings) -> bool:
    """True when a holding lease has not accrued for `accrue_hours`."""
    start = accrued_since(alloc)
    return alloc.phase in HOLDING and start is not None and now - start >= timedelta(hours=settings.accrue_hours)


def due_leases(live: Iterable[Allocation], now: datetime, settings: LedgerSettings) -> list[Allocation]:
    """The leases this sync accrues: those due, the longest waiting first, at most `max_accruals`."""
    waiting = [a for a in live if due(a, now, settings)]
    waiting.sort(key=lambda a: (accrued_since(a) or now, a.ir))
    return waiting[: settings.max_accruals]


def accrue(
    alloc: Allocation,
    until: datetime,
    busy_of: Mapping[str, float | None],
    held_of: Mapping[str, float] | None = None,
) -> Hours | None:
    """The lease's hours with the interval up to `until` added, or None when there is nothing to add.

    busy_of: busy devices per host over the interval, None for a host nothing measured (unmeasured, never idle).
    held_of: idle-held devices per host (none when absent): counted among the idle, at most the idle ones.
    """
    start = accrued_since(alloc)
    if start is None or until <= start:
        return None
    hours = (until - start).total_seconds() / 3600
    before = Hours.of(alloc)
    held = sum(held_by_host(alloc).values())
    busy = idle = idle_held = unmeasured = 0.0
    for host, gpus in held_by_host(alloc).items():
        measured = busy_of.get(host)
        if measured is None:
            unmeasured += gpus * hours
        else:
            used = min(max(measured, 0.0), gpus)
            busy += used * hours
            idle += (gpus - used) * hours
            idle_held += min(max((held_of or {}).get(host, 0.0), 0.0), gpus - used) * hours
    months = dict(before.by_month)
    for month, span in month_spans(start, until):
        months[month] = months.get(month, 0.0) + held * span
    return Hours(
        before.held + held * hours,
        before.busy + busy,
        before.idle + idle,
        before.unmeasured + unmeasured,
        months,
        before.idle_held + idle_held,
    )


def hours_fields(hours: Hours, until: datetime) -> dict[str, object]:
    """The incident fields that record these hours up to `until`."""

    def text(value: float) -> str:
        return f"{round(value, HOURS_DIGITS):.{HOURS_DIGITS}f}"

    return {
        f.GPU_HOURS_HELD: text(hours.held),
        f.GPU_HOURS_BUSY: text(hours.busy),
        f.GPU_HOURS_IDLE: text(hours.idle),
        f.GPU_HOURS_IDLE_HELD: text(hours.idle_held),
        f.GPU_HOURS_UNMEASURED: text(hours.unmeasured),
        f.GPU_HOURS_UNTIL: isoformat(until),
        f.GPU_HOURS_BY_MONTH: [f"{m}={text(v)}" for m, v in sorted(hours.by_month.items())],
        f.GPU_HOURS_MONTHS: sorted(hours.by_month),
    }


def final_fields(alloc: Allocation, now: datetime) -> dict[str, object]:
    """The fields a lease's end writes with its change: held hours up to now, the last stretch unmeasured."""
    if alloc.phase not in HOLDING:
        return {}
    hours = accrue(alloc, now, {})
    return hours_fields(hours, now) if hours is not None else {}


def busy_for(alloc: Allocation, usage: Usage) -> dict[str, float | None]:
    """Busy devices per host of the lease in this measurement (None: unmeasured)."""
    return {host: usage.lease_busy(alloc.ir, host) for host in held_by_host(alloc)}


def idle_held_for(alloc: Allocation, usage: Usage) -> dict[str, float]:
    """Idle-held devices per host of the lease in this measurement (hosts with none left out)."""
    found = {host: usage.lease_idle_held(alloc.ir, host) for host in held_by_host(alloc)}
    return {host: value for host, value in found.items() if value > 0}


def scope_busy(scope: AccrueScope) -> dict[str, float | None]:
    """An accrue command's measurement per host (`host=busy`, `host=?` for unmeasured)."""
    out: dict[str, float | None] = {}
    for entry in scope.busy:
        host, _, value = entry.rpartition("=")
        out[host] = None if value == "?" else float(value)
    return out


def scope_idle_held(scope: AccrueScope) -> dict[str, float]:
    """An accrue command's idle-held devices per host (`host=devices`; a command queued before it carries none)."""
    out: dict[str, float] = {}
    for entry in scope.idle_held:
        host, _, value = entry.rpartition("=")
        if value != "?":
            out[host] = float(value)
    return out


def apply(
    ctx: LeaseContext,
    alloc: Allocation,
    until: datetime,
    busy_of: Mapping[str, float | None],
    held_of: Mapping[str, float] | None = None,
) -> str:
    """Write the lease's GPU-hours up to `until`, unless it holds nothing now or already accrued that far."""
    if alloc.phase not in HOLDING:
        return f"nothing to accrue ({alloc.phase.value})"
    hours = accrue(alloc, until, busy_of, held_of)
    if hours is None:
        return "already accrued"
    # The same phase again, no history line: an hourly accrual is bookkeeping, not a step of the lease.
    ctx.write(alloc, alloc.phase, hours_fields(hours, until), check=False)
    return f"accrued to {hours.held:.1f} GPU-hours held"


@invocation
def record_accrual(
    ctx: LeaseContext,
    ir: int,
    until: datetime,
    busy_of: Mapping[str, float | None],
    held_of: Mapping[str, float] | None = None,
) -> Outcome:
    """The sync's accrual of a lease's GPU-hours, re-checked on the incident as it is now."""
    return Outcome(ir, apply(ctx, ctx.get(ir), until, busy_of, held_of))


# -- queued accruals ------------------------------------------------------------------------------


def queue_accruals(ctx: LeaseContext, usage: Usage, origin: str, *, skip: Collection[int] = ()) -> list[int]:
    """Accrue the leases due now: an accrue command each in its pool's group (run at once without a queue).

    `skip`: leases this sync is ending, whose end writes their final hours anyway.
    """
    now = ctx.now()
    done = []
    live = [a for a in ctx.live() if a.ir not in skip]
    for alloc in due_leases(live, now, ctx.farm.ledger):
        busy, held = busy_for(alloc, usage), idle_held_for(alloc, usage)
        if ctx.queue is None:
            record_accrual(ctx, alloc.ir, now, busy, held)
        else:
            # Hosts past the bound go unmeasured (their GPUs are still held and charged).
            entries = [f"{h}={'?' if b is None else f'{min(b, MAX_DEVICES):.3f}'}" for h, b in sorted(busy.items())]
            kept = {e.rpartition("=")[0] for e in entries[:MAX_ACCRUE_HOSTS]}
            held_entries = tuple(f"{h}={min(v, MAX_DEVICES):.3f}" for h, v in sorted(held.items()) if h in kept)
            scope = AccrueScope(until=now, busy=tuple(entries[:MAX_ACCRUE_HOSTS]), idle_held=held_entries)
            command = IncidentCommand(op=Op.ACCRUE, ir=alloc.ir, origin=origin, accrue=scope)
            ctx.queue.send(command.to_body(), group=pool_group(alloc.environment), dedup_id=command.dedup_id())
        done.append(alloc.ir)
    return done
