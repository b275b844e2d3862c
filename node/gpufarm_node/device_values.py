"""What one device (a whole GPU or a MIG slice) reports of itself each cycle, and the activity the idle taxonomy
judges it by (gpufarm_node.collect)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from gpufarm_node.model import MemoryInfo, ProcessSample

Row = tuple[str, float, tuple[str, ...]]


@dataclass(slots=True)
class Device:
    """A whole GPU or a MIG slice as one cycle sees it."""

    uuid: str
    # The uuid lower-cased, as tags (and so `gpu_assign` tags) spell it.
    key: str
    tags: tuple[str, ...]
    memory: MemoryInfo | None
    utilization: float | None
    processes: list[ProcessSample]
    activity: float | None = None


def device_values(device: Device, tags: tuple[str, ...], out: list[Row]) -> None:
    """A device's memory, utilization (whole GPUs) and process count."""
    append = out.append
    memory = device.memory
    if memory is not None:
        append(("gpufarm.gpu.memory.total", float(memory.total), tags))
        append(("gpufarm.gpu.memory.used", float(memory.used), tags))
        append(("gpufarm.gpu.memory.free", float(memory.free), tags))
        if memory.reserved is not None:
            append(("gpufarm.gpu.memory.reserved", float(memory.reserved), tags))
    if device.utilization is not None:
        append(("gpufarm.gpu.utilization", device.utilization, tags))
    append(("gpufarm.gpu.processes", float(len(device.processes)), tags))


def measured_activity(device: Device) -> float | None:
    """Utilization, else GPM activity, else the processes' SM % summed when every one has it; None: unmeasured."""
    measured = device.utilization if device.utilization is not None else device.activity
    if measured is None and device.processes:
        sm = [p.sm_util for p in device.processes]
        if None not in sm:
            measured = min(100.0, sum(cast("list[float]", sm)))
    return measured
