"""A topology-driven stand-in for the `pynvml` functions the agent calls.

`FakeNvml` exposes those functions under their pynvml names with pynvml's exact signatures (a test compares
`inspect.signature` for every `nvml*` function of the fake; besides the agent's calls it answers those of
Datadog's `nvml` check, which benchmarks/node.py runs on it), returns pynvml's own ctypes structs where they
hold no device handle, and raises the real `pynvml.NVMLError_*` classes: pynvml imports without a driver, only
its calls fail (docs/nvml.md §7). It and its field values (`gpufarm_node.fake_fields`) are the only modules outside
`gpufarm_node.nvml` that import pynvml, because they *are* pynvml's double.

Values follow the topology's workload profiles on the given clock, so a simulation on the sandbox's virtual
clock sees consistent utilization samples, energy counters and process tables. `FakeHost`
(gpufarm_node.fake_host) materialises the matching host files (a fake /proc tree, kubelet's pod list) so
attribution runs for real.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pynvml

from gpufarm_node.fake_fields import field_values
from gpufarm_node.fake_host import FakeHost
from gpufarm_node.topology_spec import GpuSpec, ProcessSpec, Topology

# FakeHost is imported from here too (gpufarm_sandbox): the fake and its host files go together.
__all__ = ["FakeHandle", "FakeHost", "FakeNvml"]

# NVML keeps a bounded sample buffer; asking for samples after a long gap returns only the newest ones.
SAMPLE_BUFFER = 120
_NOT_MIG = 0xFFFFFFFF
# The video engines' sampling period NVML reports with their utilization (µs).
_CODEC_PERIOD_US = 167_000
_GPM_FACTORS = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0.92,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 0.55,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.6,
}


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """A device handle: a physical GPU (`mig` None) or one of its MIG slices."""

    gpu: int
    mig: int | None = None


@dataclass
class _EventSet:
    # GPU index -> when it was registered (seconds after t0): NVML reports only events after registration.
    gpus: dict[int, float] = field(default_factory=dict)
    delivered: set[int] = field(default_factory=set)


@dataclass
class _GpmSample:
    gpu: int
    gpu_instance_id: int
    time: float | None = None


class FakeNvml:
    """pynvml's function surface over a `Topology`, on a clock (epoch seconds)."""

    def __init__(self, topology: Topology, *, clock: Callable[[], float] = time.time, t0: float | None = None) -> None:
        self.topology = topology
        self._clock = clock
        self.t0 = clock() if t0 is None else t0
        self._lock = threading.RLock()
        self._init_count = 0
        self._processes: list[ProcessSpec] = list(topology.processes)
        self._energy: dict[int, tuple[float, float]] = {}
        self._gpm_samples: dict[int, tuple[_GpmSample, Any]] = {}
        self._errors: dict[tuple[str, int | None], list[tuple[float, float, str]]] = {}
        for spec in topology.errors:
            self._errors.setdefault((spec.function, spec.gpu), []).append((spec.start, spec.end, spec.error))
        self.host: FakeHost | None = None
        # Counts every fake call, so tests can assert what the agent did (and did not) ask for.
        self.calls: dict[str, int] = {}

    # -- simulation controls (not part of pynvml) ----------------------------------------------------------

    def now(self) -> float:
        """Seconds since the fake started."""
        return self._clock() - self.t0

    def processes(self) -> list[ProcessSpec]:
        """The process table (past, present and future)."""
        with self._lock:
            return list(self._processes)

    def add_process(self, spec: ProcessSpec) -> None:
        """Start a process (its `start` is relative to t0; use `now()`)."""
        with self._lock:
            for other in self._processes:
                if other.pid == spec.pid and other.alive(spec.start):
                    raise ValueError(f"pid {spec.pid} is already running")
            self._processes.append(spec)

    def end_process(self, pid: int) -> None:
        """Stop a running process now."""
        t = self.now()
        with self._lock:
            self._processes = [replace(p, end=t) if p.pid == pid and p.alive(t) else p for p in self._processes]

    def alive(self, t: float | None = None) -> list[ProcessSpec]:
        """Processes running at `t` (default: now)."""
        t = self.now() if t is None else t
        with self._lock:
            return [p for p in self._processes if p.alive(t)]

    def gpu_spec(self, index: int) -> GpuSpec:
        """The topology entry of a GPU."""
        return self.topology.gpus[index]

    # -- init ---------------------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.topology.library_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        with self._lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        with self._lock:
            if self._init_count == 0:
                raise pynvml.NVMLError_Uninitialized()
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready("nvmlSystemGetDriverVersion")
        return self.topology.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._ready("nvmlDeviceGetCount")
        return len(self.topology.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._ready("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.topology.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        self._inject("nvmlDeviceGetHandleByIndex", index)
        return FakeHandle(index)

    # -- identity -------------------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        gpu = self._device("nvmlDeviceGetName", handle)
        if handle.mig is not None and gpu.mig is not None:
            return f"{gpu.name} MIG {gpu.mig[handle.mig].profile}"
        return gpu.name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        gpu = self._device("nvmlDeviceGetUUID", handle)
        return gpu.mig_uuids[handle.mig] if handle.mig is not None else gpu.uuid

    # -- utilization -----------------------------------------------------------------------------------------

    def nvmlDeviceGetSamples(self, device: FakeHandle, sampling_type: int, timeStamp: int) -> tuple[int, list[Any]]:
        gpu = self._physical("nvmlDeviceGetSamples", device, mig_ok=False)
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError_NotSupported()
        samples = []
        for t in self._sample_times(timeStamp):
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = self._us(t)
            sample.sampleValue.uiVal = round(self._gpu_util(gpu.index, t))
            samples.append(sample)
        if not samples:
            raise pynvml.NVMLError_NotFound()
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, samples

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu = self._physical("nvmlDeviceGetUtilizationRates", handle, mig_ok=False)
        rates = pynvml.c_nvmlUtilization_t()
        util = self._gpu_util(gpu.index, self.now())
        rates.gpu = round(util)
        rates.memory = round(util * 0.6)
        return rates

    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timeStamp: int) -> list[Any]:
        gpu = self._physical("nvmlDeviceGetProcessUtilization", handle, mig_ok=False)
        times = self._sample_times(timeStamp)
        out = []
        # One sample per process, aggregated since timeStamp (nvml.h: the count returned is the number of
        # processes; nvtop#91: an old timestamp widens the period), and only for processes that did something.
        for proc in self._on_device(gpu.index, None, self.now()):
            active = [t for t in times if proc.alive(t)]
            sm = sum(min(proc.sm.at(t - proc.start), 100.0) for t in active) / len(active) if active else 0.0
            if sm <= 0:
                continue
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid = proc.pid
            sample.timeStamp = self._us(active[-1])
            sample.smUtil = round(sm)
            sample.memUtil = round(sm * 0.5)
            out.append(sample)
        if not out:
            raise pynvml.NVMLError_NotFound()
        return out

    # -- memory, power, thermals, clocks -----------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        if version:
            self._inject("nvmlDeviceGetMemoryInfo_v2", gpu.index)
        t = self.now()
        total_mib = gpu.mig[handle.mig].memory_mib if handle.mig is not None and gpu.mig else gpu.memory_mib
        mig_filter = handle.mig if handle.mig is not None else ...
        used_mib = sum(p.memory_mib.at(t - p.start) for p in self._on_device(gpu.index, mig_filter, t))
        reserved_mib = min(512.0, total_mib * 0.01)
        total, reserved = total_mib << 20, int(reserved_mib) << 20
        used = min(int(used_mib * (1 << 20)), total - reserved)
        memory = pynvml.c_nvmlMemory_v2_t() if version else pynvml.c_nvmlMemory_t()
        if version:
            memory.version = version
            memory.reserved = reserved
        memory.total = total
        memory.used = used
        memory.free = total - used - (reserved if version else 0)
        return memory

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        gpu = self._physical("nvmlDeviceGetPowerUsage", handle)
        return round(self._power_w(gpu, self.now()) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        gpu = self._physical("nvmlDeviceGetEnforcedPowerLimit", handle)
        return round(gpu.power_limit_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._physical("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self._energy_mj(gpu)

    def nvmlDeviceGetTemperatureV(self, handle: FakeHandle, sensor: int, version: int = 16777228) -> int:
        gpu = self._physical("nvmlDeviceGetTemperatureV", handle)
        if version != pynvml.nvmlTemperature_v1:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        return self._temperature(gpu, sensor)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._physical("nvmlDeviceGetTemperature", handle)
        return self._temperature(gpu, sensor)

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:  # noqa: A002 - pynvml's name
        gpu = self._physical("nvmlDeviceGetClockInfo", handle)
        util = self._load(gpu, self.now())
        if type == pynvml.NVML_CLOCK_MEM:
            return gpu.max_mem_mhz
        if type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return 345 if util <= 0 else round(gpu.max_sm_mhz * (0.75 + 0.25 * util / 100))
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        gpu = self._physical("nvmlDeviceGetCurrentClocksEventReasons", handle)
        util = self._load(gpu, self.now())
        if util <= 0:
            return int(pynvml.nvmlClocksEventReasonGpuIdle)
        if util >= 95:
            return int(pynvml.nvmlClocksEventReasonSwPowerCap)
        return 0

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int, counterType: int) -> int:
        gpu = self._physical("nvmlDeviceGetTotalEccErrors", handle)
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return gpu.ecc_uncorrected
        return 0

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:
        gpu = self._physical("nvmlDeviceGetRemappedRows", device)
        return gpu.remapped_rows

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: list[Any]) -> Any:
        # One answer per field, each as its own function answers it (gpufarm_node.fake_fields).
        gpu = self._physical("nvmlDeviceGetFieldValues", handle)
        return field_values(fieldIds, partial(self._field, gpu), self._us(self.now()))

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        gpu = self._physical("nvmlDeviceGetPcieThroughput", device)
        util = self._load(gpu, self.now())
        return round(util * (1200 if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES else 300))

    def nvmlDeviceGetEncoderUtilization(self, handle: FakeHandle) -> list[int]:
        gpu = self._physical("nvmlDeviceGetEncoderUtilization", handle)
        del gpu  # the topology's workloads are compute only: the video engines idle, over NVML's sampling period
        return [0, _CODEC_PERIOD_US]

    def nvmlDeviceGetDecoderUtilization(self, handle: FakeHandle) -> list[int]:
        gpu = self._physical("nvmlDeviceGetDecoderUtilization", handle)
        del gpu
        return [0, _CODEC_PERIOD_US]

    def nvmlDeviceGetFanSpeed(self, handle: FakeHandle) -> int:
        self._physical("nvmlDeviceGetFanSpeed", handle)
        # The topologies' boards are SXM modules, cooled by the chassis: NVML has no fan to read on them.
        raise pynvml.NVMLError_NotSupported()

    # -- processes ------------------------------------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        t = self.now()
        if self.host is not None:
            self.host.sync(t)
        mig_filter = handle.mig if handle.mig is not None else ...
        out = []
        for proc in self._on_device(gpu.index, mig_filter, t):
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid = proc.pid
            info.usedGpuMemory = int(proc.memory_mib.at(t - proc.start) * (1 << 20))
            slice_spec = gpu.mig[proc.mig] if gpu.mig is not None and proc.mig is not None else None
            info.gpuInstanceId = slice_spec.gpu_instance_id if slice_spec else _NOT_MIG
            info.computeInstanceId = slice_spec.compute_instance_id if slice_spec else _NOT_MIG
            obj = pynvml.nvmlStructToFriendlyObject(info)
            if proc.memory_unavailable:
                obj.usedGpuMemory = None
            out.append(obj)
        return out

    # -- MIG ---------------------------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        gpu = self._physical("nvmlDeviceGetMigMode", device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeHandle) -> int:
        gpu = self._physical("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7 if gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeHandle:
        gpu = self._physical("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if gpu.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        if not 0 <= index < len(gpu.mig):
            raise pynvml.NVMLError_NotFound()
        return FakeHandle(gpu.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: FakeHandle) -> int:
        gpu = self._device("nvmlDeviceGetGpuInstanceId", device)
        if device.mig is None or gpu.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.mig[device.mig].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: FakeHandle) -> int:
        gpu = self._device("nvmlDeviceGetComputeInstanceId", device)
        if device.mig is None or gpu.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.mig[device.mig].compute_instance_id

    # -- GPM ----------------------------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: FakeHandle) -> Any:
        gpu = self._physical("nvmlGpmQueryDeviceSupport", device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._ready("nvmlGpmSampleAlloc")
        # A real opaque pointer, so it can sit in pynvml's c_nvmlGpmMetricsGet_t like NVML's own samples.
        buffer = ctypes.create_string_buffer(8)
        pointer = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        with self._lock:
            self._gpm_samples[ctypes.addressof(buffer)] = (_GpmSample(-1, 0), buffer)
        return pointer

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._ready("nvmlGpmSampleFree")
        with self._lock:
            if self._gpm_samples.pop(_address(gpmSample), None) is None:
                raise pynvml.NVMLError_InvalidArgument()

    def nvmlGpmMigSampleGet(self, device: FakeHandle, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu = self._physical("nvmlGpmMigSampleGet", device)
        if not gpu.gpm or gpu.mig is None:
            raise pynvml.NVMLError_NotSupported()
        if not any(s.gpu_instance_id == gpuInstanceId for s in gpu.mig):
            raise pynvml.NVMLError_InvalidArgument()
        with self._lock:
            entry = self._gpm_samples.get(_address(gpmSample))
            if entry is None:
                raise pynvml.NVMLError_InvalidArgument()
            self._gpm_samples[_address(gpmSample)] = (_GpmSample(gpu.index, gpuInstanceId, self.now()), entry[1])
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._ready("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        with self._lock:
            first = self._gpm_samples.get(_address(metricsGet.sample1))
            second = self._gpm_samples.get(_address(metricsGet.sample2))
        if first is None or second is None:
            raise pynvml.NVMLError_InvalidArgument()
        a, b = first[0], second[0]
        if a.time is None or b.time is None or (a.gpu, a.gpu_instance_id) != (b.gpu, b.gpu_instance_id):
            raise pynvml.NVMLError_InvalidArgument()
        self._inject("nvmlGpmMetricsGet", a.gpu)
        activity = self._slice_activity(a.gpu, a.gpu_instance_id, min(a.time, b.time), max(a.time, b.time))
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            factor = _GPM_FACTORS.get(metric.metricId)
            if factor is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = activity * factor
        return metricsGet

    # -- events -------------------------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._ready("nvmlEventSetCreate")
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int, eventSet: _EventSet) -> None:
        gpu = self._physical("nvmlDeviceRegisterEvents", handle)
        if eventTypes & pynvml.nvmlEventTypeXidCriticalError:
            with self._lock:
                eventSet.gpus.setdefault(gpu.index, self.now())

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> Any:
        self._ready("nvmlEventSetWait")
        deadline = time.monotonic() + timeoutms / 1000
        while True:
            event = self._next_event(eventSet)
            if event is not None:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise pynvml.NVMLError_Timeout()
            time.sleep(min(0.02, remaining))

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._ready("nvmlEventSetFree")
        with self._lock:
            eventSet.gpus.clear()

    # -- internals -------------------------------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _ready(self, name: str) -> None:
        self._count(name)
        if self._init_count <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _inject(self, name: str, gpu: int | None) -> None:
        if not self._errors:
            return
        t = self.now()
        for key in ((name, gpu), (name, None), ("*", gpu), ("*", None)):
            for start, end, error in self._errors.get(key, ()):
                if start <= t < end:
                    raise getattr(pynvml, f"NVMLError_{error}")()

    def _device(self, name: str, handle: Any) -> GpuSpec:
        self._ready(name)
        if not isinstance(handle, FakeHandle) or handle.gpu >= len(self.topology.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        self._inject(name, handle.gpu)
        return self.topology.gpus[handle.gpu]

    def _physical(self, name: str, handle: Any, *, mig_ok: bool = True) -> GpuSpec:
        """A call that only a physical GPU answers (power, clocks, events: 'parent GPU only', docs/nvml.md §4)."""
        gpu = self._device(name, handle)
        if handle.mig is not None:
            raise pynvml.NVMLError_NotSupported()
        if not mig_ok and gpu.mig is not None:
            # Utilization and per-process utilization are not supported on MIG-enabled GPUs (nvml.h).
            raise pynvml.NVMLError_NotSupported()
        return gpu

    def _us(self, t: float) -> int:
        return int((self.t0 + t) * 1_000_000)

    def _sample_times(self, since_us: int) -> list[float]:
        """Sample instants on the period grid after `since_us` (epoch µs) up to now, newest SAMPLE_BUFFER."""
        period = self.topology.sample_period
        now = self.now()
        last = math.floor(now / period)
        first = max(math.floor((since_us / 1_000_000 - self.t0) / period) + 1, last - SAMPLE_BUFFER + 1, 0)
        return [k * period for k in range(first, last + 1)]

    def _on_device(self, gpu: int, mig: Any, t: float) -> Iterable[ProcessSpec]:
        """Processes on a GPU at t; `mig` is a slice index, None (whole GPU), or Ellipsis (all slices)."""
        with self._lock:
            procs = self._processes
        for proc in procs:
            if proc.gpu == gpu and proc.alive(t) and (mig is ... or proc.mig == mig):
                yield proc

    def _gpu_util(self, gpu: int, t: float) -> float:
        return min(100.0, sum(p.sm.at(t - p.start) for p in self._on_device(gpu, None, t)))

    def _slice_util(self, gpu: int, mig: int, t: float) -> float:
        return min(100.0, sum(p.sm.at(t - p.start) for p in self._on_device(gpu, mig, t)))

    def _load(self, gpu: GpuSpec, t: float) -> float:
        """How busy the whole board is: its utilization, or the mean over its MIG slices."""
        if gpu.mig is None:
            return self._gpu_util(gpu.index, t)
        return sum(self._slice_util(gpu.index, s, t) for s in range(len(gpu.mig))) / len(gpu.mig)

    def _energy_mj(self, gpu: GpuSpec) -> int:
        t = self.now()
        with self._lock:
            last_t, energy_mj = self._energy.get(gpu.index, (t, 3.6e9))
            if t > last_t:
                energy_mj += self._power_w(gpu, t) * (t - last_t) * 1000
            self._energy[gpu.index] = (max(t, last_t), energy_mj)
        return int(energy_mj)

    def _field(self, gpu: GpuSpec, field_id: int, function: str) -> int:
        """The value of one field fake_fields.FIELD_SOURCES lists, as its single-value `function` answers it."""
        self._inject(function, gpu.index)
        if field_id == pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            return self._energy_mj(gpu)
        if field_id == pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
            return gpu.ecc_uncorrected
        return gpu.remapped_rows[field_id - pynvml.NVML_FI_DEV_REMAPPED_COR]

    def _power_w(self, gpu: GpuSpec, t: float) -> float:
        return gpu.idle_power_w + (gpu.power_limit_w * 0.9 - gpu.idle_power_w) * self._load(gpu, t) / 100

    def _temperature(self, gpu: GpuSpec, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_NotSupported()
        return round(31 + 0.5 * self._load(gpu, self.now()))

    def _slice_activity(self, gpu: int, gpu_instance_id: int, start: float, end: float) -> float:
        spec = self.topology.gpus[gpu]
        assert spec.mig is not None
        slot = next(i for i, s in enumerate(spec.mig) if s.gpu_instance_id == gpu_instance_id)
        points = 16
        return sum(self._slice_util(gpu, slot, start + (end - start) * i / points) for i in range(points)) / points

    def _next_event(self, event_set: _EventSet) -> Any:
        t = self.now()
        with self._lock:
            for number, xid in enumerate(self.topology.xid_events):
                registered = event_set.gpus.get(xid.gpu)
                if registered is not None and registered <= xid.at <= t and number not in event_set.delivered:
                    event_set.delivered.add(number)
                    return pynvml.nvmlFriendlyObject(
                        {
                            "device": FakeHandle(xid.gpu),
                            "eventType": pynvml.nvmlEventTypeXidCriticalError,
                            "eventData": xid.xid,
                            "gpuInstanceId": _NOT_MIG,
                            "computeInstanceId": _NOT_MIG,
                        }
                    )
        return None


def _address(sample: Any) -> int:
    value = ctypes.cast(sample, ctypes.c_void_p).value
    return int(value or 0)
