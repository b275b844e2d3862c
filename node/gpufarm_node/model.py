"""What one collection cycle saw on a node: plain data, no NVML types, so everything downstream is testable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class MemoryInfo:
    """Frame-buffer memory in bytes; `reserved` only comes from the v2 call."""

    total: int
    used: int
    free: int
    reserved: int | None = None


@dataclass(slots=True)
class ProcessSample:
    """A compute process on a GPU or MIG slice."""

    pid: int
    # Bytes; None when NVML cannot tell (WDDM, MIG without privileges).
    used_memory: int | None
    # Mean SM % of the NVML samples since the last read (0 when NVML had none for this pid); None when the
    # device cannot say (MIG, or the call is unsupported).
    sm_util: float | None = None


@dataclass(slots=True)
class MigSnapshot:
    """One MIG instance, read through its own handle."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    memory: MemoryInfo | None = None
    processes: list[ProcessSample] = field(default_factory=list)
    # GPM activity over the last interval, percent: graphics, sm, sm_occupancy, dram. None without GPM.
    activity: dict[str, float] | None = None


@dataclass(slots=True)
class GpuSnapshot:
    """One physical GPU; when `mig_enabled`, per-instance data lives in `migs` and `processes` is empty."""

    index: int
    uuid: str
    name: str
    healthy: bool = True
    mig_enabled: bool = False
    utilization: float | None = None
    memory: MemoryInfo | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    # Joules since the driver loaded (NVML's energy counter).
    energy_j: float | None = None
    temperature_c: float | None = None
    clock_sm_mhz: float | None = None
    clock_mem_mhz: float | None = None
    clock_event_reasons: int | None = None
    ecc_uncorrected: int | None = None
    # Remapped rows: correctable, uncorrectable, pending flag, failure flag.
    remapped_rows: tuple[int, int, int, int] | None = None
    pcie_tx_kib_s: float | None = None
    pcie_rx_kib_s: float | None = None
    processes: list[ProcessSample] = field(default_factory=list)
    migs: list[MigSnapshot] = field(default_factory=list)
    # XID codes seen since the last snapshot.
    xids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class NodeSnapshot:
    """Everything NVML said in one cycle."""

    timestamp: float
    gpus: list[GpuSnapshot]
    driver_version: str | None = None
    # NVML failures this cycle by function (capabilities that are simply unsupported are not errors).
    errors: dict[str, int] = field(default_factory=dict)
    # XID events lost because the bounded event queue was full.
    events_dropped: int = 0


class SnapshotSource(Protocol):
    """Where snapshots come from: NVML on a node, the fake NVML in tests and simulations."""

    def start(self) -> None:
        """Initialise (NVML init, device enumeration, event watcher)."""

    def snapshot(self) -> NodeSnapshot:
        """Read every device once."""

    def close(self) -> None:
        """Release NVML and stop background threads."""
