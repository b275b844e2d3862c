"""What a fake node is made of: GPUs and their MIG layouts, pods, processes with workload profiles over time,
injected NVML errors and XID events (gpufarm_node.topology reads them from topology files)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# Model shorthand -> (NVML name, memory MiB, power limit W, idle power W, max SM MHz, max memory MHz, GPM support).
# GPM (GPU performance monitoring) exists on Hopper and later only (docs/nvml.md §4).
MODELS: dict[str, tuple[str, int, float, float, int, int, bool]] = {
    "A100": ("NVIDIA A100-SXM4-80GB", 81920, 400.0, 55.0, 1410, 1593, False),
    "H100": ("NVIDIA H100 80GB HBM3", 81559, 700.0, 70.0, 1980, 2619, True),
    "H200": ("NVIDIA H200", 143771, 700.0, 75.0, 1980, 3201, True),
    "B200": ("NVIDIA B200", 183359, 1000.0, 120.0, 1965, 3996, True),
    "L40S": ("NVIDIA L40S", 46068, 350.0, 35.0, 2520, 9001, False),
    "L4": ("NVIDIA L4", 23034, 72.0, 16.0, 2040, 6251, False),
    "A10G": ("NVIDIA A10G", 23028, 300.0, 25.0, 1710, 6251, False),
}
MIG_PROFILE_RE = re.compile(r"^(\d)g\.(\d+)gb$")
ERROR_NAMES = frozenset(
    {
        "NotSupported",
        "FunctionNotFound",
        "GpuIsLost",
        "ResetRequired",
        "NotFound",
        "Timeout",
        "Unknown",
        "NoPermission",
        "InvalidArgument",
    }
)
WORKLOADS = ("busy", "light", "bursty", "idle-held")


class TopologyError(ValueError):
    """A topology file is malformed; the message names the offending entry."""


@dataclass(frozen=True, slots=True)
class Profile:
    """A value over time: constant, square wave, ramp, or steps."""

    kind: str
    value: float = 0.0
    high: float = 0.0
    low: float = 0.0
    period: float = 60.0
    duty: float = 0.5
    phase: float = 0.0
    start: float = 0.0
    end: float = 0.0
    duration: float = 60.0
    steps: tuple[tuple[float, float], ...] = ()

    def at(self, t: float) -> float:
        """The value `t` seconds after the process started."""
        if self.kind == "constant":
            return self.value
        if self.kind == "square":
            position = ((t + self.phase) % self.period) / self.period
            return self.high if position < self.duty else self.low
        if self.kind == "ramp":
            if t >= self.duration:
                return self.end
            return self.start + (self.end - self.start) * max(t, 0.0) / self.duration
        current = self.steps[0][1]
        for when, value in self.steps:
            if t < when:
                break
            current = value
        return current


@dataclass(frozen=True, slots=True)
class MigSlice:
    """A MIG instance layout entry, e.g. 1g.10gb."""

    profile: str
    memory_mib: int
    gpu_instance_id: int
    compute_instance_id: int = 0


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One physical GPU of the fake."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    power_limit_w: float
    idle_power_w: float
    max_sm_mhz: int
    max_mem_mhz: int
    gpm: bool
    mig: tuple[MigSlice, ...] | None = None
    mig_uuids: tuple[str, ...] = ()
    ecc_uncorrected: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container of a pod; `devices` are what kubelet's pod-resources reports as allocated to it."""

    name: str
    id: str
    devices: tuple[tuple[int, int | None], ...] = ()


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A Kubernetes pod as kubelet describes it."""

    name: str
    namespace: str
    uid: str
    qos: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    containers: tuple[ContainerSpec, ...]


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """A compute process with its placement, workload and identity on the host."""

    pid: int
    gpu: int
    mig: int | None
    memory_mib: Profile
    sm: Profile
    start: float = 0.0
    end: float = math.inf
    env: Mapping[str, str] = field(default_factory=dict)
    pod: str | None = None
    container: str | None = None
    docker: str | None = None
    cgroup: str = "v2"
    comm: str = "python3"
    # False: NVML lists the process but /proc has no entry (it exited between the two reads).
    proc: bool = True
    # True: NVML reports usedGpuMemory as "not available" (None).
    memory_unavailable: bool = False

    def alive(self, t: float) -> bool:
        """Running at `t` seconds after the fake started."""
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """An injected NVML error: `function` ('*' for every device call) on `gpu` (None: all) in [start, end)."""

    function: str
    error: str
    gpu: int | None = None
    start: float = 0.0
    end: float = math.inf


@dataclass(frozen=True, slots=True)
class XidSpec:
    """An XID event raised on `gpu` at `at`."""

    gpu: int
    xid: int
    at: float


@dataclass(frozen=True)
class Topology:
    """Everything the fake NVML simulates."""

    name: str
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...] = ()
    pods: tuple[PodSpec, ...] = ()
    errors: tuple[ErrorSpec, ...] = ()
    xid_events: tuple[XidSpec, ...] = ()
    driver_version: str = "550.90.07"
    sample_period: float = 1.0
    # Simulates a host without libnvidia-ml (nvmlInit raises LibraryNotFound).
    library_missing: bool = False

    def pod(self, name: str) -> PodSpec:
        """A pod by name."""
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise TopologyError(f"no pod named {name!r}")


def workload_profiles(workload: str, device_memory_mib: int) -> tuple[Profile, Profile]:
    """(memory MiB, SM %) profiles of a named workload on a device with this much memory."""
    if workload == "busy":
        return Profile("constant", value=device_memory_mib * 0.6), Profile("square", high=97, low=71, period=120)
    if workload == "light":
        return Profile("constant", value=device_memory_mib * 0.2), Profile("constant", value=22)
    if workload == "bursty":
        return Profile("constant", value=device_memory_mib * 0.4), Profile("square", high=90, low=0, period=300)
    if workload == "idle-held":
        return Profile("constant", value=device_memory_mib * 0.45), Profile("constant", value=0)
    raise TopologyError(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")


def device_memory_mib(gpu: GpuSpec, mig: int | None) -> int:
    """Memory of a GPU or of one of its MIG slices."""
    if mig is None or gpu.mig is None:
        return gpu.memory_mib
    return gpu.mig[mig].memory_mib
