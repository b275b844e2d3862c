"""NVML -> NodeSnapshot: NvmlSource, the reader of every GPU (docs/nvml.md §7, docs/design.md "House style").

How it reads NVML, following docs/nvml.md:
- `nvmlInit` once at start, `nvmlShutdown` at close (§8: re-initialising every cycle is slow without
  persistence mode); a lost GPU triggers a re-init on a later cycle, never on every one.
- One query helper with a sentinel default (`_query`, after nvitop's `nvmlQuery`): `NotSupported` and
  `FunctionNotFound` switch that signal off for that device the first time they are seen (the Datadog Agent
  probes each API once per device), `GpuIsLost`/`ResetRequired` mark the GPU unhealthy while the others go on,
  any other NVML error is counted and logged once per function.
- Utilization is the mean of `nvmlDeviceGetSamples` since the last read, not one instantaneous value; per-process
  SM % uses `nvmlDeviceGetProcessUtilization` with the last seen timestamp, NotFound meaning "all idle".
- MIG instances are re-enumerated each cycle and keyed by UUID; GPM activity comes from two samples taken one
  interval apart (this cycle's sample and the previous one), only on devices that report GPM support.
- XID events are read by a background thread into a bounded queue (or polled each cycle, for simulations).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter
from typing import Any, Final, Literal, cast

import pynvml

from gpufarm_node.model import GpuSnapshot, MemoryInfo, MigSnapshot, NodeSnapshot, ProcessSample
from gpufarm_node.nvml.device import LOST, UNSUPPORTED, Device, GpmPair, GpuLost
from gpufarm_node.nvml.errors import NvmlUnavailable
from gpufarm_node.nvml.fields import (
    COUNTER_FIELDS,
    GPM_ENTRIES,
    GPM_RETURN,
    GPM_SET_SAMPLE1,
    GPM_SET_SAMPLE2,
    GPM_VALUE,
    MEMORY_V2,
    MEMORY_V2_READ,
    VALUE_FIELDS,
    field_numbers,
    fresh_samples,
    process_means,
)
from gpufarm_node.nvml.xid import XidWatcher

log = logging.getLogger("gpufarm_node.nvml")

# Every pynvml function this package calls: the fake must offer each with pynvml's own signature.
USED_FUNCTIONS: Final = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
)

# GPM metrics read per MIG instance, by the name the snapshot uses.
GPM_METRICS: Final = (
    ("graphics", pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL),
    ("sm", pynvml.NVML_GPM_METRIC_SM_UTIL),
    ("sm_occupancy", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY),
    ("dram", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL),
)
_MIG_PROFILE = re.compile(r"(\d+g\.\d+gb)", re.IGNORECASE)
_LOG_ONCE_LIMIT = 1024
_NA: Final = object()
_EMPTY: Final = object()
# The running-process lists come back as pynvml's friendly objects (plain attributes).
_PID: Final = attrgetter("pid")
_USED_MEMORY: Final = attrgetter("usedGpuMemory")


class NvmlSource:
    """Reads every GPU through NVML (or anything with pynvml's function surface, such as FakeNvml)."""

    def __init__(
        self,
        nvml: Any = pynvml,
        *,
        clock: Callable[[], float] = time.time,
        interval: float = 15.0,
        pcie: bool = False,
        xid_mode: Literal["thread", "poll", "off"] = "thread",
        event_queue_size: int = 1000,
        event_wait_ms: int = 1000,
        reinit_after: float = 60.0,
    ) -> None:
        self._n = nvml
        self._event_wait_ms = event_wait_ms
        self._clock = clock
        self._interval = interval
        self._pcie = pcie
        self._xid_mode = xid_mode
        self._queue_size = event_queue_size
        self._reinit_after = reinit_after
        self._devices: list[Device] = []
        self._errors: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._watcher: XidWatcher | None = None
        self._initialised = False
        self._lost_at: float | None = None
        self.driver_version: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML once, enumerate GPUs, probe GPM support and start watching XID events."""
        try:
            self._n.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise NvmlUnavailable(
                "the NVML library (libnvidia-ml.so.1) was not found: this host has no NVIDIA driver, or the "
                "container lacks the NVIDIA runtime (use --fake TOPOLOGY to run without a GPU)"
            ) from exc
        except pynvml.NVMLError_DriverNotLoaded as exc:
            raise NvmlUnavailable("the NVIDIA kernel driver is not loaded") from exc
        except pynvml.NVMLError_LibRmVersionMismatch as exc:
            raise NvmlUnavailable(
                "NVML and the kernel driver differ in version (usually after a driver upgrade without a reboot)"
            ) from exc
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        self._initialised = True
        try:
            self.driver_version = str(self._n.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            self.driver_version = None
        self._enumerate(previous={})
        self._start_watcher()

    def close(self) -> None:
        """Stop the event watcher, free GPM samples and shut NVML down."""
        self._stop_watcher()
        self._free_gpm()
        if self._initialised:
            self._initialised = False
            try:
                self._n.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)

    # -- one cycle -------------------------------------------------------------------------------------

    def snapshot(self) -> NodeSnapshot:
        """Read every GPU; a lost GPU is reported unhealthy and NVML is re-initialised on a later cycle."""
        now = self._clock()
        if self._lost_at is not None and now - self._lost_at >= self._reinit_after:
            self._reinit(now)
        xids, dropped = self._watcher.drain() if self._watcher else ([], 0)
        gpus = [self._read_gpu(dev) for dev in self._devices]
        by_uuid = {g.uuid: g for g in gpus}
        for event in xids:
            target = by_uuid.get(event.gpu_uuid or "")
            if target is not None:
                target.xids.append(event.xid)
        errors = dict(self._errors)
        self._errors.clear()
        return NodeSnapshot(now, gpus, self.driver_version, errors, dropped)

    def _read_gpu(self, dev: Device) -> GpuSnapshot:
        if dev.lost:
            return GpuSnapshot(dev.index, dev.uuid, dev.name, healthy=False)
        snap = GpuSnapshot(dev.index, dev.uuid, dev.name)
        try:
            self._fill(dev, snap)
        except GpuLost as lost:
            dev.lost = True
            if self._lost_at is None:
                self._lost_at = self._clock()
            self._log_once(
                f"lost:{dev.uuid}",
                logging.ERROR,
                "GPU %d (%s) is lost (%s): reported unhealthy; NVML will be re-initialised in %.0fs",
                dev.index,
                dev.uuid,
                lost,
                self._reinit_after,
            )
            return GpuSnapshot(dev.index, dev.uuid, dev.name, healthy=False)
        return snap

    def _fill(self, dev: Device, snap: GpuSnapshot) -> None:
        h = dev.handle
        mode = self._query(dev, "mig_mode", "nvmlDeviceGetMigMode", h)
        snap.mig_enabled = mode is not _NA and int(mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE
        if snap.mig_enabled:
            snap.migs = self._migs(dev)
        else:
            snap.utilization = self._utilization(dev)
            snap.memory = self._memory(dev, h, "")
            snap.processes = self._processes(dev, h, "", with_util=True)
            self._check_process_memory(dev, snap)
        power = self._query(dev, "power", "nvmlDeviceGetPowerUsage", h)
        snap.power_w = None if power is _NA else power / 1000
        limit = self._query(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        snap.power_limit_w = None if limit is _NA else limit / 1000
        energy, ecc, rows = self._counters(dev, h)
        snap.energy_j = None if energy is _NA else energy / 1000
        snap.temperature_c = self._temperature(dev)
        sm_clock = self._query(dev, "clock_sm", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        snap.clock_sm_mhz = None if sm_clock is _NA else float(sm_clock)
        mem_clock = self._query(dev, "clock_mem", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
        snap.clock_mem_mhz = None if mem_clock is _NA else float(mem_clock)
        reasons = self._query(dev, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons", h)
        snap.clock_event_reasons = None if reasons is _NA else int(reasons)
        snap.ecc_uncorrected = None if ecc is _NA else int(ecc)
        snap.remapped_rows = None if rows is _NA else (int(rows[0]), int(rows[1]), int(rows[2]), int(rows[3]))
        if self._pcie:
            tx = self._query(dev, "pcie_tx", "nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._query(dev, "pcie_rx", "nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            snap.pcie_tx_kib_s = None if tx is _NA else float(tx)
            snap.pcie_rx_kib_s = None if rx is _NA else float(rx)

    # -- signals -----------------------------------------------------------------------------------------

    def _counters(self, dev: Device, h: Any) -> tuple[Any, Any, Any]:
        """(energy in mJ, uncorrected ECC errors, remapped rows) or `_NA` each: one nvmlDeviceGetFieldValues for
        the three where the driver offers it; a signal whose fields did not all answer is read by its own
        function, whose answer decides as it always has (a NotSupported switches the signal off, another error is
        counted), and so is every signal on a driver without the batched call."""
        numbers = self._query(dev, "field_values", "nvmlDeviceGetFieldValues", h, COUNTER_FIELDS)
        energy = ecc = rows = None
        if numbers is not _NA:
            energy, ecc, *remapped = field_numbers(numbers)
            rows = None if None in remapped else remapped
        if energy is None:
            energy = self._query(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        if ecc is None:
            ecc = self._query(
                dev,
                "ecc",
                "nvmlDeviceGetTotalEccErrors",
                h,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
        if rows is None:
            rows = self._query(dev, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        return energy, ecc, rows

    def _utilization(self, dev: Device) -> float | None:
        got = self._query(
            dev,
            "samples",
            "nvmlDeviceGetSamples",
            dev.handle,
            pynvml.NVML_GPU_UTILIZATION_SAMPLES,
            dev.util_ts,
            absent=(pynvml.NVMLError_NotFound,),
        )
        if got is not _NA and got is not _EMPTY:
            value_type, samples = got
            fresh = fresh_samples(samples, dev.util_ts, VALUE_FIELDS.get(value_type, "uiVal"))
            if fresh is not None:
                dev.util_ts, total, count = fresh
                return total / count
        # No sample since the last read (or no sampling support): the instantaneous value is the best left.
        rates = self._query(dev, "utilization", "nvmlDeviceGetUtilizationRates", dev.handle)
        return None if rates is _NA else float(rates.gpu)

    def _memory(self, dev: Device, handle: Any, scope: str) -> MemoryInfo | None:
        # v2 carries `reserved`; older drivers lack the symbol, and then v1 answers (gpustat #141).
        info = self._query(dev, scope + "memory_v2", "nvmlDeviceGetMemoryInfo", handle, pynvml.nvmlMemory_v2)
        if info is not _NA:
            if type(info) is MEMORY_V2:
                total, used, free, reserved = MEMORY_V2_READ
                return MemoryInfo(total(info), used(info), free(info), reserved(info))
            return MemoryInfo(int(info.total), int(info.used), int(info.free), int(info.reserved))
        if scope + "memory_v2" not in dev.unsupported:
            return None
        info = self._query(dev, scope + "memory", "nvmlDeviceGetMemoryInfo", handle)
        return None if info is _NA else MemoryInfo(int(info.total), int(info.used), int(info.free))

    def _temperature(self, dev: Device) -> float | None:
        value = self._query(dev, "temperature_v", "nvmlDeviceGetTemperatureV", dev.handle, pynvml.NVML_TEMPERATURE_GPU)
        if value is _NA and "temperature_v" in dev.unsupported:
            # nvmlDeviceGetTemperature is deprecated in NVML 13 but is all that older drivers have.
            value = self._query(dev, "temperature", "nvmlDeviceGetTemperature", dev.handle, pynvml.NVML_TEMPERATURE_GPU)
        return None if value is _NA else float(value)

    def _processes(self, dev: Device, handle: Any, scope: str, *, with_util: bool) -> list[ProcessSample]:
        procs = self._query(dev, scope + "processes", "nvmlDeviceGetComputeRunningProcesses", handle)
        if procs is _NA or not procs:
            return []
        pids = list(map(int, map(_PID, procs)))
        memories: list[int | None] = list(map(_USED_MEMORY, procs))
        if None in memories:
            memories = [None if memory is None else int(memory) for memory in memories]
        else:
            memories = list(map(int, cast("list[int]", memories)))
        if len(set(pids)) < len(pids):
            # A process with several contexts on one GPU is listed once per context: one sample, memory summed.
            summed: dict[int, int | None] = {}
            for pid, memory in zip(pids, memories, strict=True):
                if pid not in summed:
                    summed[pid] = memory
                elif memory is not None:
                    summed[pid] = (summed[pid] or 0) + memory
            pids, memories = list(summed), list(summed.values())
        sm = self._process_util(dev) if with_util else None
        if sm is None:
            return list(map(ProcessSample, pids, memories))
        # A pid NVML did not sample had zero utilization in that period (nvml.h).
        return list(map(ProcessSample, pids, memories, map(sm.get, pids, repeat(0.0))))

    def _process_util(self, dev: Device) -> dict[int, float] | None:
        if not dev.proc_ts:
            dev.proc_ts = int((self._clock() - self._interval) * 1_000_000)
        got = self._query(
            dev,
            "process_util",
            "nvmlDeviceGetProcessUtilization",
            dev.handle,
            dev.proc_ts,
            absent=(pynvml.NVMLError_NotFound,),
        )
        if got is _NA:
            return None
        if got is _EMPTY:
            return {}
        dev.proc_ts, means = process_means(got, dev.proc_ts)
        return means

    def _check_process_memory(self, dev: Device, snap: GpuSnapshot) -> None:
        """Once per GPU: per-process memory must fit in used memory, else the process struct is misread."""
        if dev.memory_checked or snap.memory is None or not snap.processes:
            return
        dev.memory_checked = True
        total = sum(p.used_memory or 0 for p in snap.processes)
        if total > snap.memory.used * 1.05 + (64 << 20):
            self._log_once(
                f"memcheck:{dev.uuid}",
                logging.WARNING,
                "GPU %d: processes hold %d MiB but the GPU reports %d MiB used; nvidia-ml-py and the driver may "
                "disagree on the process struct version (docs/nvml.md §3)",
                dev.index,
                total >> 20,
                snap.memory.used >> 20,
            )

    # -- MIG ---------------------------------------------------------------------------------------------

    def _migs(self, dev: Device) -> list[MigSnapshot]:
        count = self._query(dev, "mig_count", "nvmlDeviceGetMaxMigDeviceCount", dev.handle)
        out: list[MigSnapshot] = []
        seen: set[str] = set()
        for slot in range(0 if count is _NA else int(count)):
            handle = self._query(
                dev,
                "mig_handle",
                "nvmlDeviceGetMigDeviceHandleByIndex",
                dev.handle,
                slot,
                absent=(pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument),
            )
            if handle is _NA or handle is _EMPTY:
                continue  # an empty slot (dcgm-exporter continues too; nitvop's break would hide later slices)
            mig_uuid = self._query(dev, "mig_uuid", "nvmlDeviceGetUUID", handle)
            if mig_uuid is _NA:
                continue
            mig_uuid = str(mig_uuid)
            info = dev.mig_info.get(mig_uuid) or self._mig_identity(dev, handle)
            if info is None:
                continue
            dev.mig_info[mig_uuid] = info
            seen.add(mig_uuid)
            gi, ci, profile = info
            mig = MigSnapshot(mig_uuid, gi, ci, profile)
            mig.memory = self._memory(dev, handle, "mig_")
            mig.processes = self._processes(dev, handle, "mig_", with_util=False)
            if dev.gpm:
                mig.activity = self._gpm_activity(dev, mig_uuid, gi)
            out.append(mig)
        # Instances are keyed by UUID: a destroyed one frees its GPM samples, a recreated one starts afresh.
        for gone in set(dev.mig_info) - seen:
            del dev.mig_info[gone]
            self._free_pair(dev.gpm_pairs.pop(gone, None))
        return out

    def _mig_identity(self, dev: Device, handle: Any) -> tuple[int, int, str] | None:
        gi = self._query(dev, "mig_gi", "nvmlDeviceGetGpuInstanceId", handle)
        ci = self._query(dev, "mig_ci", "nvmlDeviceGetComputeInstanceId", handle)
        if gi is _NA or ci is _NA:
            return None
        name = self._query(dev, "mig_name", "nvmlDeviceGetName", handle)
        match = _MIG_PROFILE.search(str(name)) if name is not _NA else None
        return int(gi), int(ci), match.group(1).lower() if match else "unknown"

    def _gpm_activity(self, dev: Device, mig_uuid: str, gpu_instance_id: int) -> dict[str, float] | None:
        pair = dev.gpm_pairs.get(mig_uuid)
        if pair is None:
            first = self._query(dev, "gpm_alloc", "nvmlGpmSampleAlloc")
            second = self._query(dev, "gpm_alloc", "nvmlGpmSampleAlloc")
            if first is _NA or second is _NA:
                return None
            pair = dev.gpm_pairs[mig_uuid] = GpmPair(first, second)
        current = pair.spare
        got = self._query(dev, "gpm_sample", "nvmlGpmMigSampleGet", dev.handle, gpu_instance_id, current)
        if got is _NA:
            return None
        now = self._clock()
        result: dict[str, float] | None = None
        # nvml.h: the two samples should be more than 100 ms apart.
        if pair.taken_at is not None and now - pair.taken_at > 0.1:
            metrics = dev.metrics_get
            if metrics is None:
                metrics = dev.metrics_get = pynvml.c_nvmlGpmMetricsGet_t()
                metrics.version = pynvml.NVML_GPM_METRICS_GET_VERSION
                metrics.numMetrics = len(GPM_METRICS)
                for i, (_, metric_id) in enumerate(GPM_METRICS):
                    metrics.metrics[i].metricId = metric_id
            GPM_SET_SAMPLE1(metrics, pair.previous)
            GPM_SET_SAMPLE2(metrics, current)
            if self._query(dev, "gpm_metrics", "nvmlGpmMetricsGet", metrics) is not _NA:
                result = {}
                entries = GPM_ENTRIES(metrics)
                for i, (name, _) in enumerate(GPM_METRICS):
                    entry = entries[i]
                    if GPM_RETURN(entry) == pynvml.NVML_SUCCESS:
                        result[name] = float(GPM_VALUE(entry))
        pair.previous, pair.spare, pair.taken_at = current, pair.previous, now
        return result

    def _free_pair(self, pair: GpmPair | None) -> None:
        if pair is None:
            return
        for sample in (pair.previous, pair.spare):
            try:
                self._n.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError as exc:
                log.debug("nvmlGpmSampleFree failed: %s", exc)

    def _free_gpm(self) -> None:
        for dev in self._devices:
            for pair in dev.gpm_pairs.values():
                self._free_pair(pair)
            dev.gpm_pairs.clear()
            dev.metrics_get = None

    # -- the query helper ------------------------------------------------------------------------------------

    def _query(self, dev: Device, cap: str, fn: str, *args: Any, absent: tuple[type, ...] = ()) -> Any:
        """Call `fn`; `_NA` when it failed or the signal `cap` is off, `_EMPTY` for an expected `absent` error."""
        if cap in dev.unsupported:
            return _NA
        try:
            return getattr(self._n, fn)(*args)
        except UNSUPPORTED:
            dev.unsupported.add(cap)
            self._log_once(f"unsupported:{cap}:{dev.uuid}", logging.INFO, "GPU %d: %s unsupported, off", dev.index, cap)
            return _NA
        except LOST as exc:
            raise GpuLost(f"{fn}: {exc}") from exc
        except pynvml.NVMLError as exc:
            if absent and isinstance(exc, absent):
                return _EMPTY
            self._errors[fn] += 1
            self._log_once(
                f"error:{fn}:{type(exc).__name__}",
                logging.WARNING,
                "%s failed on GPU %d: %s (logged once, counted in gpufarm.node.nvml_errors)",
                fn,
                dev.index,
                exc,
            )
            return _NA

    def _log_once(self, key: str, level: int, message: str, *args: Any) -> None:
        if key in self._logged:
            return
        if len(self._logged) < _LOG_ONCE_LIMIT:
            self._logged.add(key)
        log.log(level, message, *args)

    # -- enumeration and recovery ------------------------------------------------------------------------------

    def _enumerate(self, previous: dict[int, Device]) -> None:
        count = int(self._n.nvmlDeviceGetCount())
        devices = []
        for index in range(count):
            old = previous.get(index)
            try:
                handle = self._n.nvmlDeviceGetHandleByIndex(index)
                gpu_uuid = str(self._n.nvmlDeviceGetUUID(handle))
                dev = Device(index, handle, gpu_uuid, str(self._n.nvmlDeviceGetName(handle)))
            except LOST:
                dev = Device(index, None, old.uuid if old else f"unknown-{index}", old.name if old else "unknown")
                dev.lost = True
            except pynvml.NVMLError as exc:
                self._log_once(f"enumerate:{index}", logging.ERROR, "GPU %d cannot be opened: %s", index, exc)
                continue
            if old is not None and old.uuid == dev.uuid:
                # Capabilities and sampling cursors survive a re-init; handles and GPM samples do not.
                dev.unsupported, dev.util_ts, dev.proc_ts = old.unsupported, old.util_ts, old.proc_ts
                dev.memory_checked = old.memory_checked
            if not dev.lost:
                self._logged.discard(f"lost:{dev.uuid}")  # back: a later loss is news again
                support = self._query_quiet(dev, "nvmlGpmQueryDeviceSupport", dev.handle)
                dev.gpm = support is not None and support is not _NA and bool(support.isSupportedDevice)
                dev.util_ts = dev.util_ts or int((self._clock() - self._interval) * 1_000_000)
            devices.append(dev)
        self._devices = devices
        self._lost_at = self._clock() if any(d.lost for d in devices) else None

    def _query_quiet(self, dev: Device, fn: str, *args: Any) -> Any:
        try:
            return self._query(dev, fn, fn, *args)
        except GpuLost:
            dev.lost = True
            return None

    def _reinit(self, now: float) -> None:
        log.warning("re-initialising NVML to recover lost GPUs")
        self._stop_watcher()
        self._free_gpm()
        previous = {d.index: d for d in self._devices}
        try:
            if self._initialised:
                self._initialised = False
                self._n.nvmlShutdown()
            self._n.nvmlInit()
            self._initialised = True
            self._enumerate(previous)
        except pynvml.NVMLError as exc:
            log.error("NVML re-initialisation failed: %s; every GPU is reported unhealthy until it works", exc)  # noqa: TRY400
            for dev in self._devices:
                dev.lost = True
            self._lost_at = now
            return
        self._start_watcher()

    def _start_watcher(self) -> None:
        if self._xid_mode == "off":
            return
        devices = [d for d in self._devices if not d.lost]
        watcher = XidWatcher(self._n, devices, self._queue_size, self._log_once, self._event_wait_ms)
        if watcher.start(threaded=self._xid_mode == "thread"):
            self._watcher = watcher

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
