"""NodeSnapshot + attribution -> series: device metrics, the idle taxonomy, container and IR rollups.

Pure: no NVML, no I/O. The rules, so monitors and dashboards can rely on them:
- A *device* is a whole GPU or a MIG slice. Parent-only values of a MIG-enabled GPU (power, clocks, thermals,
  ECC, XID) are emitted once for the physical GPU (`gpu_slicing_mode:mig-parent`); slice series carry
  `gpu_parent_uuid` so they join with them.
- Each device is `busy` (activity at or over `idle_util_threshold`), `idle` (no process, or processes holding
  less than `held_memory_bytes`) or `idle_held` (memory held, activity under the threshold), as 0/1 gauges
  `gpufarm.gpu.idle_state{state:...}`. A device whose activity NVML cannot measure (a MIG slice without GPM)
  counts as busy while it has processes: the agent never calls idle what it cannot see.
- A device's IR is the one the allocator assigned it (the host's `gpu_assign:ir-<N>/<uuid>` tags,
  gpufarm_node.hosttags), else its owner's (pod-resources), else that of the processes holding most of its
  memory, else, on a dedicated host, the lease holding the whole host (its one `ir:` tag), else `none`. A
  shared host's device that no `gpu_assign` tag names is `none`, never charged to the host's lease
  (gpufarm_node.tags.host_lease). A process's IR is its own (environment or pod label), else its device's.
- Every MIG slice has one activity series, `gpufarm.gpu.mig.activity` (percent): GPM graphics activity where the
  GPU supports GPM (`activity_source:gpm`), else process presence, 100 while the slice runs compute processes and
  0 without (`activity_source:processes`), so idle monitors can judge every slice with one query.
- That attribution is the `gpu_ir` tag (`ir-123` or `none`) on every device, container, process and IR series,
  plus `ir` when there is one. Datadog attaches host tags to every series, so on a shared sliced host tagged
  with two IRs `ir` carries both; `gpu_ir` is the agent's own key and stays exact: group by it for slices.
- Per-container values are rolled up per (container, device), with zeros for a container that holds a device
  but runs nothing on it (dcgm-exporter's idle pod values). PIDs appear only on opt-in per-process series and
  on squatters' (gpufarm_node.squatters: a busy device's processes that are not of the lease holding it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple, cast

from gpufarm_node.attribution import DeviceOwner, Workload
from gpufarm_node.catalog import CLOCK_EVENT_REASONS, IDLE_STATES
from gpufarm_node.device_values import Device, device_values, measured_activity
from gpufarm_node.gpu_names import gpu_model
from gpufarm_node.model import GpuSnapshot, MigSnapshot, NodeSnapshot, ProcessSample
from gpufarm_node.series_tags import NO_IR, container_tags, ir_tags, owner_tags, reason_flags, with_source
from gpufarm_node.squatters import Squatter, SquatterPlans, device_lease


class Series(NamedTuple):
    """One value of one metric with its tags; type and unit come from the catalogue."""

    metric: str
    value: float
    tags: tuple[str, ...]


# What the agent itself handles: a series as a plain (metric, value, tags) tuple. A NamedTuple instance costs about
# 1,000 instructions more to make than a plain tuple (the subtype's allocation), and a cycle makes hundreds:
# rows() makes rows, build() the same as Series for callers that read fields by name.
Row = tuple[str, float, tuple[str, ...]]
# Tag tuples are built once per device, container or IR and reused every cycle; past this many keys (series
# churn: containers, pids) the caches start over rather than grow.
_TAG_CACHE = 8192


@dataclass(frozen=True)
class CollectOptions:
    """Thresholds of the idle taxonomy and what to emit."""

    idle_util_threshold: float = 5.0
    held_memory_bytes: int = 64 << 20
    per_process: bool = False
    # Squatter detection (gpufarm_node.squatters): a busy device's processes that are not of its lease.
    squatters: bool = True


@dataclass
class AgentStats:
    """What the agent itself reports alongside the GPU data."""

    cycle_time: float = 0.0
    points_dropped: Mapping[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _IrTotals:
    # Devices by state (busy, idle, idle_held, unhealthy): a plain dict, as Counter's constructor is Python code
    # and a cycle makes one of these per IR.
    devices: dict[str, int] = field(default_factory=dict)
    activity: list[float] = field(default_factory=list)
    memory: int = 0
    processes: int = 0


@dataclass(slots=True)
class _Cycle:
    """What one build() works with and accumulates."""

    workloads: Mapping[int, Workload | None]
    owners: Mapping[str, DeviceOwner]
    host_ir: str | None
    # {lower-case device uuid: IR} from the host's gpu_assign tags.
    assigned: Mapping[str, str]
    out: list[Row] = field(default_factory=list)
    irs: dict[str, _IrTotals] = field(default_factory=dict)
    # The squatters found this cycle (gpufarm_node.squatters), and those another source reported, by device.
    squatters: list[Squatter] = field(default_factory=list)
    reported: dict[str, list[Squatter]] = field(default_factory=dict)

    def totals(self, ir: str) -> _IrTotals:
        """The rollup of one IR."""
        found = self.irs.get(ir)
        if found is None:
            found = self.irs[ir] = _IrTotals()
        return found


class SeriesBuilder:
    """Turns snapshots into series; keeps the little state rollups need across cycles (energy counters).

    Every tag tuple is built the first time its device, container or IR is seen and reused on later cycles
    (`_cached`): a cycle then costs a dictionary lookup per tag set and one tuple per series.
    """

    def __init__(
        self,
        common_tags: Sequence[str],
        options: CollectOptions | None = None,
        *,
        user_of: Callable[[int], str | None] | None = None,
    ) -> None:
        self.common = tuple(common_tags)
        self.options = options or CollectOptions()
        self._energy: dict[str, float] = {}
        self._tag_cache: dict[Any, Any] = {}
        # What busy devices' processes come to as squatters; a squatter's user (UserNames) looked up once.
        self._squat = SquatterPlans(self.common, user_of or _no_user)
        # The last cycle's squatters (for the agent's log and tests).
        self.squatters: list[Squatter] = []

    def build(
        self,
        snap: NodeSnapshot,
        workloads: Mapping[int, Workload | None],
        owners: Mapping[str, DeviceOwner],
        host_ir: str | None = None,
        stats: AgentStats | None = None,
        *,
        assigned: Mapping[str, str] | None = None,
        reported: Iterable[Squatter] = (),
    ) -> list[Series]:
        """Every series of one cycle (rows() as Series); `assigned` maps lower-case device uuids to the IR the allocator
        gave them."""
        rows = self.rows(snap, workloads, owners, host_ir, stats, assigned=assigned, reported=reported)
        return list(map(Series._make, rows))

    def rows(
        self,
        snap: NodeSnapshot,
        workloads: Mapping[int, Workload | None],
        owners: Mapping[str, DeviceOwner],
        host_ir: str | None = None,
        stats: AgentStats | None = None,
        *,
        assigned: Mapping[str, str] | None = None,
        reported: Iterable[Squatter] = (),
    ) -> list[Row]:
        """Every series of one cycle, as (metric, value, tags) rows: what the agent sends. `reported`: squatters
        another source found (pods of another lease, by pod-resources), merged into their devices'."""
        if len(self._tag_cache) > _TAG_CACHE:
            self._tag_cache.clear()
        cycle = _Cycle(workloads, owners, host_ir, assigned or _NOTHING)
        for squatter in reported:
            cycle.reported.setdefault(squatter.device, []).append(squatter)
        for gpu in snap.gpus:
            self._gpu(gpu, cycle)
        self._ir_rollups(cycle.irs, cycle.out)
        self._node(snap, stats or AgentStats(), cycle.out)
        self.squatters = cycle.squatters
        return cycle.out

    def _cached(self, key: Any, make: Callable[[], Any]) -> Any:
        found = self._tag_cache.get(key)
        if found is None:
            found = self._tag_cache[key] = make()
        return found

    # -- devices -----------------------------------------------------------------------------------------------

    def _gpu_tags(self, gpu: GpuSnapshot) -> tuple[tuple[str, ...], str, str]:
        """(tags, lower-case uuid, model) of a physical GPU."""
        uuid = gpu.uuid.lower()
        model = gpu_model(gpu.name).lower()
        mode = "mig-parent" if gpu.mig_enabled else "none"
        tags = (
            *self.common,
            f"gpu_uuid:{uuid}",
            f"gpu_index:{gpu.index}",
            f"gpu_model:{model}",
            f"gpu_slicing_mode:{mode}",
        )
        return tags, uuid, model

    def _gpu(self, gpu: GpuSnapshot, cycle: _Cycle) -> None:
        out = cycle.out
        key = ("gpu", gpu.uuid, gpu.index, gpu.name, gpu.mig_enabled)
        found = self._tag_cache.get(key)
        if found is None:
            found = self._tag_cache[key] = self._gpu_tags(gpu)
        tags, uuid, model = found
        if not gpu.healthy:
            owner = cycle.owners.get(gpu.uuid)
            ir = cycle.assigned.get(uuid) or (owner.ir if owner else None) or cycle.host_ir or NO_IR
            out.append(("gpufarm.gpu.unhealthy", 1.0, self._with_ir(tags, ir)))
            devices = cycle.totals(ir).devices
            devices["unhealthy"] = devices.get("unhealthy", 0) + 1
            return
        if not gpu.mig_enabled:
            device = Device(gpu.uuid, uuid, tags, gpu.memory, gpu.utilization, gpu.processes)
            ir = self._device(device, cycle)
            # Whole GPUs carry their IR on parent values too (energy and power per IR); slices share theirs.
            tags = self._with_ir(tags, ir)
            out.append(("gpufarm.gpu.unhealthy", 0.0, tags))
        else:
            out.append(("gpufarm.gpu.unhealthy", 0.0, tags))
            for mig in gpu.migs:
                mig_tags, mig_key = self._cached(
                    ("mig", mig.uuid, gpu.index, model, uuid, mig.profile, mig.gpu_instance_id),
                    partial(self._mig_tags, gpu.index, model, uuid, mig),
                )
                activity = mig.activity.get("graphics") if mig.activity else None
                device = Device(mig.uuid, mig_key, mig_tags, mig.memory, None, mig.processes, activity)
                ir = self._device(device, cycle)
                ir_tags = self._with_ir(mig_tags, ir)
                if mig.activity:
                    for name, value in mig.activity.items():
                        out.append((_ACTIVITY_METRICS.get(name) or f"gpufarm.gpu.activity.{name}", value, ir_tags))
                # One activity per slice whatever the GPU: GPM where it has it, else whether anything runs.
                if activity is not None:
                    source_tags, value = (
                        self._cached(("activity", ir_tags, "gpm"), partial(with_source, ir_tags, "gpm")),
                        activity,
                    )
                else:
                    source_tags = self._cached(
                        ("activity", ir_tags, "processes"), partial(with_source, ir_tags, "processes")
                    )
                    value = 100.0 if mig.processes else 0.0
                out.append(("gpufarm.gpu.mig.activity", value, source_tags))
        self._parent_values(gpu, tags, out)

    def _mig_tags(self, index: int, model: str, parent_uuid: str, mig: MigSnapshot) -> tuple[tuple[str, ...], str]:
        key = mig.uuid.lower()
        tags = (
            *self.common,
            f"gpu_uuid:{key}",
            f"gpu_index:{index}",
            f"gpu_model:{model}",
            "gpu_slicing_mode:mig",
            f"gpu_parent_uuid:{parent_uuid}",
            f"mig_profile:{mig.profile}",
            f"gpu_instance_id:{mig.gpu_instance_id}",
        )
        return tags, key

    def _with_ir(self, tags: tuple[str, ...], ir: str) -> tuple[str, ...]:
        key = ("ir", tags, ir)
        found: tuple[str, ...] | None = self._tag_cache.get(key)
        if found is None:
            found = self._tag_cache[key] = (*tags, *ir_tags(ir))
        return found

    def _device(self, device: Device, cycle: _Cycle) -> str:
        """Emit one device's series and rollups; returns the IR it is attributed to."""
        out = cycle.out
        owner = cycle.owners.get(device.uuid)
        processes = device.processes
        ir = _device_ir(device, owner, cycle)
        tags = self._with_ir(device.tags, ir)
        device_values(device, tags, out)
        measured = measured_activity(device)
        state = self._idle_state(processes, measured)
        key = ("state", tags)
        state_tags = self._tag_cache.get(key)
        if state_tags is None:
            state_tags = self._tag_cache[key] = tuple((*tags, f"state:{name}") for name in IDLE_STATES)
        out.extend(zip(repeat("gpufarm.gpu.idle_state"), _STATE_FLAGS[state], state_tags))
        totals = cycle.totals(ir)
        devices = totals.devices
        devices[state] = devices.get(state, 0) + 1
        if measured is not None:
            totals.activity.append(measured)
        plan = self._containers(ir, device, owner, cycle)
        if self.options.squatters:
            self._squatters(device, state, cycle, plan)
        return ir

    def _squatters(self, device: Device, state: str, cycle: _Cycle, plan: _Plan | None) -> None:
        """A device's squatter count (0 when clean) under the lease holding it, and its squatters; the device's
        container plan, when every process on it is known, stands for its processes (the same object while they
        live), so a cycle that finds what the last one found costs a small lookup."""
        lease = device_lease(device.key, cycle.assigned, cycle.host_ir)
        tags = self._with_ir(device.tags, lease or NO_IR)
        busy = device.processes if state == "busy" else None
        reported = cycle.reported.get(device.key, ()) if cycle.reported else ()
        token = plan if plan is not None and plan.known else None
        found, rows = self._squat.device(
            device.key, lease, tags, busy, cycle.workloads, reported=reported, processes_token=token
        )
        if found:
            cycle.squatters.extend(found)
        cycle.out.extend(rows)

    def _idle_state(self, processes: list[ProcessSample], activity: float | None) -> str:
        opts = self.options
        # Measured activity wins: a busy GPU whose process list came back empty (a failed or partial read)
        # must never look idle to the reclaimer.
        if activity is not None and activity >= opts.idle_util_threshold:
            return "busy"
        if not processes:
            return "idle"
        floor = opts.held_memory_bytes
        held = sum(floor if p.used_memory is None else p.used_memory for p in processes)
        if held < floor:
            return "idle"
        return "busy" if activity is None else "idle_held"

    def _containers(self, device_ir: str, device: Device, owner: DeviceOwner | None, cycle: _Cycle) -> _Plan | None:
        """A device's container series and rollups; returns its plan (None: worked out process by process)."""
        if self.options.per_process:
            self._containers_per_process(device_ir, device, owner, cycle)
            return None
        out = cycle.out
        processes = device.processes
        device_tag = f"gpu_uuid:{device.key}"
        found = list(map(cycle.workloads.get, map(_PID, processes)))
        # Which process goes to which IR and container depends only on the workload objects, in order: the
        # attributor hands out the same one while a process lives, and the plan holds them, so their ids in
        # the key cannot be reused by others while it is cached. A cycle then only adds up values.
        key = ("plan", device_tag, device_ir, *map(id, found))
        plan: _Plan | None = self._tag_cache.get(key)
        if plan is None:
            plan = self._tag_cache[key] = self._plan(device_ir, device_tag, found)
        by_ir, groups, named = plan.by_ir, plan.groups, plan.named
        memory = [p.used_memory or 0 for p in processes]
        for ir, positions in by_ir:
            totals = cycle.totals(ir)
            totals.memory += sum(map(memory.__getitem__, positions))
            totals.processes += len(positions)
        if groups:
            # Each container's values from the device's columns, by position.
            sms = list(map(_SM_UTIL, processes))
            take_memory, take_sm = memory.__getitem__, sms.__getitem__
            for ctags, positions in groups:
                self._container_values(ctags, sum(map(take_memory, positions)), list(map(take_sm, positions)), out)
        self._owner_zeros(owner, device_tag, device_ir, named, out)
        return plan

    def _plan(self, device_ir: str, device_tag: str, found: list[Workload | None]) -> _Plan:
        """Positions of a device's processes by IR and by container (first seen first), and the containers
        named there; what _containers_per_process works out process by process."""
        by_ir: dict[str, list[int]] = {}
        groups: dict[tuple[str, ...], list[int]] = {}
        named: set[tuple[str | None, str | None, str | None]] = set()
        for position, workload in enumerate(found):
            ir = (workload.ir if workload else None) or device_ir
            by_ir.setdefault(ir, []).append(position)
            if workload is None or workload.container_id is None:
                continue
            named.add((workload.namespace, workload.pod_name, workload.container_name))
            groups.setdefault(self._container_group(device_tag, ir, workload), []).append(position)
        return _Plan(found, list(by_ir.items()), list(groups.items()), named)

    def _container_group(self, device_tag: str, ir: str, workload: Workload) -> tuple[str, ...]:
        """The tags of a container's series on one device (cached)."""
        # Keyed by the workload object itself: the attributor hands out the same one while the process lives, and
        # the entry holds it, so its id cannot be reused by another while cached.
        key = ("container", device_tag, ir, id(workload))
        entry = self._tag_cache.get(key)
        if entry is None or entry[0] is not workload:
            entry = self._tag_cache[key] = (
                workload,
                (*self.common, device_tag, *ir_tags(ir), *container_tags(workload)),
            )
        tags: tuple[str, ...] = entry[1]
        return tags

    def _owner_zeros(
        self,
        owner: DeviceOwner | None,
        device_tag: str,
        device_ir: str,
        named: set[tuple[str | None, str | None, str | None]],
        out: list[Row],
    ) -> None:
        """Zeros for the container holding this device when it runs nothing on it: the idle signal (docs/nvml.md
        §9)."""
        if owner is not None and owner.pod and (owner.namespace, owner.pod, owner.container) not in named:
            otags = self._cached(
                ("owner", device_tag, device_ir, owner),
                lambda: (*self.common, device_tag, *ir_tags(owner.ir or device_ir), *owner_tags(owner)),
            )
            self._container_values(otags, 0, [], out)

    def _containers_per_process(self, device_ir: str, device: Device, owner: DeviceOwner | None, cycle: _Cycle) -> None:
        """Per-process series, and the container series _containers makes from a plan, worked out process by
        process."""
        out = cycle.out
        groups: dict[tuple[str, ...], list[ProcessSample]] = {}
        named: set[tuple[str | None, str | None, str | None]] = set()
        device_tag = f"gpu_uuid:{device.key}"
        workloads = cycle.workloads
        for proc in device.processes:
            workload = workloads.get(proc.pid)
            ir = (workload.ir if workload else None) or device_ir
            totals = cycle.totals(ir)
            totals.memory += proc.used_memory or 0
            totals.processes += 1
            ptags = (*self.common, device_tag, f"pid:{proc.pid}", *ir_tags(ir), *container_tags(workload))
            if proc.used_memory is not None:
                out.append(("gpufarm.process.memory.used", float(proc.used_memory), ptags))
            if proc.sm_util is not None:
                out.append(("gpufarm.process.sm_utilization", proc.sm_util, ptags))
            if workload is None or workload.container_id is None:
                continue
            named.add((workload.namespace, workload.pod_name, workload.container_name))
            groups.setdefault(self._container_group(device_tag, ir, workload), []).append(proc)
        for ctags, members in groups.items():
            memory = sum(p.used_memory or 0 for p in members)
            self._container_values(ctags, memory, [p.sm_util for p in members], out)
        self._owner_zeros(owner, device_tag, device_ir, named, out)

    @staticmethod
    def _container_values(tags: tuple[str, ...], memory: int, sms: list[float | None], out: list[Row]) -> None:
        """A container's series on one device: its processes' memory (summed), their number and, when every one
        has it, their SM % summed in order."""
        out.append(("gpufarm.container.memory.used", float(memory), tags))
        out.append(("gpufarm.container.processes", float(len(sms)), tags))
        if None not in sms:
            total = sum(cast("list[float]", sms), 0.0) if sms else 0
            out.append(("gpufarm.container.sm_utilization", total, tags))

    def _parent_values(self, gpu: GpuSnapshot, tags: tuple[str, ...], out: list[Row]) -> None:
        """Values only the physical GPU has (for a MIG GPU, shared by all its slices)."""
        append = out.append
        for metric, value in (
            ("gpufarm.gpu.power.usage", gpu.power_w),
            ("gpufarm.gpu.power.limit", gpu.power_limit_w),
            ("gpufarm.gpu.temperature", gpu.temperature_c),
            ("gpufarm.gpu.clock.sm", gpu.clock_sm_mhz),
            ("gpufarm.gpu.clock.memory", gpu.clock_mem_mhz),
            ("gpufarm.gpu.pcie.tx_throughput", gpu.pcie_tx_kib_s),
            ("gpufarm.gpu.pcie.rx_throughput", gpu.pcie_rx_kib_s),
        ):
            if value is not None:
                append((metric, value, tags))
        if gpu.energy_j is not None:
            previous = self._energy.get(gpu.uuid)
            self._energy[gpu.uuid] = gpu.energy_j
            # The counter restarts when the driver reloads; a drop is a restart, not negative energy.
            if previous is not None and gpu.energy_j >= previous:
                append(("gpufarm.gpu.energy", gpu.energy_j - previous, tags))
        if gpu.clock_event_reasons is not None:
            bits = gpu.clock_event_reasons
            key = ("reasons", tags)
            reasons = self._tag_cache.get(key)
            if reasons is None:
                reasons = self._tag_cache[key] = tuple((*tags, f"reason:{reason}") for _, reason in CLOCK_EVENT_REASONS)
            flags = reason_flags(bits)
            out.extend(zip(repeat("gpufarm.gpu.clock_event_reason"), flags, reasons))
        if gpu.ecc_uncorrected is not None:
            append(("gpufarm.gpu.ecc.uncorrected", float(gpu.ecc_uncorrected), tags))
        if gpu.remapped_rows is not None:
            correctable, uncorrectable, pending, failure = gpu.remapped_rows
            append(("gpufarm.gpu.remapped_rows.correctable", float(correctable), tags))
            append(("gpufarm.gpu.remapped_rows.uncorrectable", float(uncorrectable), tags))
            append(("gpufarm.gpu.remapped_rows.pending", 1.0 if pending else 0.0, tags))
            append(("gpufarm.gpu.remapped_rows.failure", 1.0 if failure else 0.0, tags))
        if gpu.xids:
            for xid, count in sorted(Counter(gpu.xids).items()):
                append(("gpufarm.gpu.xid_errors", float(count), (*tags, f"xid:{xid}")))

    # -- rollups --------------------------------------------------------------------------------------------

    def _ir_rollups(self, irs: dict[str, _IrTotals], out: list[Row]) -> None:
        extend = out.extend
        for ir, totals in sorted(irs.items()):
            tags = self._with_ir(self.common, ir)
            devices = totals.devices
            busy, idle, held = devices.get("busy", 0), devices.get("idle", 0), devices.get("idle_held", 0)
            values = [
                float(busy + idle + held),
                float(busy),
                float(idle),
                float(held),
                float(devices.get("unhealthy", 0)),
                float(totals.memory),
                float(totals.processes),
            ]
            if totals.activity:
                values.append(sum(totals.activity) / len(totals.activity))
            extend(zip(_IR_METRICS, values, repeat(tags)))

    def _node(self, snap: NodeSnapshot, stats: AgentStats, out: list[Row]) -> None:
        common = self.common
        out.append(("gpufarm.node.gpus", float(len(snap.gpus)), common))
        out.append(("gpufarm.node.cycle_time", stats.cycle_time, common))
        for function, count in sorted(snap.errors.items()):
            out.append(("gpufarm.node.nvml_errors", float(count), (*common, f"function:{function.lower()}")))
        for reason, count in sorted(stats.points_dropped.items()):
            if count:
                out.append(("gpufarm.node.points_dropped", float(count), (*common, f"drop_reason:{reason}")))
        if snap.events_dropped:
            out.append(("gpufarm.node.events_dropped", float(snap.events_dropped), common))


_PID = attrgetter("pid")
_SM_UTIL = attrgetter("sm_util")
# The 0/1 values of gpufarm.gpu.idle_state for each state, in IDLE_STATES order.
_STATE_FLAGS = {state: tuple(1.0 if name == state else 0.0 for name in IDLE_STATES) for state in IDLE_STATES}
_NOTHING: Mapping[str, str] = {}


def _no_user(pid: int) -> str | None:
    return None


class _Plan:
    """A device's processes by IR and by container tags (positions in its process list), for one sequence of
    workload objects; `found` keeps those objects alive while the plan is cached. A class, not a tuple: the plan is
    also the squatter detector's token for these processes, compared by identity, and compiled code (mypyc) would
    hand out a new tuple for each use of a fixed-length one."""

    __slots__ = ("by_ir", "found", "groups", "known", "named")

    def __init__(
        self,
        found: list[Workload | None],
        by_ir: list[tuple[str, list[int]]],
        groups: list[tuple[tuple[str, ...], list[int]]],
        named: set[tuple[str | None, str | None, str | None]],
    ) -> None:
        self.found = found
        self.by_ir = by_ir
        self.groups = groups
        self.named = named
        # Whether every process is known (has a workload): then the plan stands for exactly these processes.
        self.known = None not in found


# In the order _ir_rollups lists their values; the last only when some device's activity is known.
_IR_METRICS = (
    "gpufarm.ir.gpus",
    "gpufarm.ir.gpus_busy",
    "gpufarm.ir.gpus_idle",
    "gpufarm.ir.gpus_idle_held",
    "gpufarm.ir.gpus_unhealthy",
    "gpufarm.ir.memory.used",
    "gpufarm.ir.processes",
    "gpufarm.ir.utilization",
)
_ACTIVITY_METRICS: dict[str, str] = {
    name: f"gpufarm.gpu.activity.{name}" for name in ("graphics", "sm", "sm_occupancy", "dram")
}


def _device_ir(device: Device, owner: DeviceOwner | None, cycle: _Cycle) -> str:
    """The allocator's assignment, else the owner's IR, else the processes' majority, else the whole host's lease
    (a dedicated host's only), else none."""
    return (
        (cycle.assigned.get(device.key) if cycle.assigned else None)
        or (owner.ir if owner else None)
        or _majority_ir(device.processes, cycle.workloads)
        or cycle.host_ir
        or NO_IR
    )


def _majority_ir(processes: list[ProcessSample], workloads: Mapping[int, Workload | None]) -> str | None:
    """The IR whose processes hold most of a device's memory; ties go to the lowest IR, for stable answers."""
    # A plain dict: Counter's constructor is Python code, and this runs for every device without an owner's IR.
    held: dict[str, int] = {}
    get = workloads.get
    for proc in processes:
        workload = get(proc.pid)
        if workload is not None and workload.ir:
            held[workload.ir] = held.get(workload.ir, 0) + (proc.used_memory or 0) + 1
    if not held:
        return None
    return min(held, key=lambda ir: (-held[ir], ir))
