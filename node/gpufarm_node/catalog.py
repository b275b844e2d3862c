"""Every metric the agent emits, with its Datadog type and unit.

`spec/metrics.yaml` is the reviewed contract (names, units, tags, device modes); a test holds this table and
everything the agent emits to it, so a metric cannot be added, renamed or retyped without updating the spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PREFIX: Final = "gpufarm."
GAUGE: Final = 3
COUNT: Final = 1

# NVML clock event reason bits (nvml.h nvmlClocksEventReason*; docs/nvml.md §2), one 0/1 series each.
CLOCK_EVENT_REASONS: Final = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
IDLE_STATES: Final = ("busy", "idle", "idle_held")


@dataclass(frozen=True, slots=True)
class MetricDef:
    """Name, Datadog intake type (1 count, 3 gauge) and unit (None: a plain number or a 0/1 flag)."""

    name: str
    type: int
    unit: str | None


def _defs(*rows: tuple[str, int, str | None]) -> dict[str, MetricDef]:
    return {PREFIX + name: MetricDef(PREFIX + name, kind, unit) for name, kind, unit in rows}


METRICS: Final = _defs(
    # device: a whole GPU, a MIG slice, or (parent-only values) a MIG-enabled GPU
    ("gpu.utilization", GAUGE, "percent"),
    ("gpu.memory.used", GAUGE, "byte"),
    ("gpu.memory.free", GAUGE, "byte"),
    ("gpu.memory.total", GAUGE, "byte"),
    ("gpu.memory.reserved", GAUGE, "byte"),
    ("gpu.power.usage", GAUGE, "watt"),
    ("gpu.power.limit", GAUGE, "watt"),
    ("gpu.energy", COUNT, "joule"),
    ("gpu.temperature", GAUGE, "degree celsius"),
    ("gpu.clock.sm", GAUGE, "megahertz"),
    ("gpu.clock.memory", GAUGE, "megahertz"),
    ("gpu.clock_event_reason", GAUGE, None),
    ("gpu.ecc.uncorrected", GAUGE, "error"),
    ("gpu.remapped_rows.correctable", GAUGE, "row"),
    ("gpu.remapped_rows.uncorrectable", GAUGE, "row"),
    ("gpu.remapped_rows.pending", GAUGE, None),
    ("gpu.remapped_rows.failure", GAUGE, None),
    ("gpu.pcie.tx_throughput", GAUGE, "kibibyte"),
    ("gpu.pcie.rx_throughput", GAUGE, "kibibyte"),
    ("gpu.xid_errors", COUNT, "event"),
    ("gpu.unhealthy", GAUGE, None),
    ("gpu.processes", GAUGE, "process"),
    ("gpu.idle_state", GAUGE, None),
    ("gpu.activity.graphics", GAUGE, "percent"),
    ("gpu.activity.sm", GAUGE, "percent"),
    ("gpu.activity.sm_occupancy", GAUGE, "percent"),
    ("gpu.activity.dram", GAUGE, "percent"),
    ("gpu.mig.activity", GAUGE, "percent"),
    # squatters (gpufarm_node.squatters): per device, and per squatting process or pod
    ("gpu.squatters", GAUGE, "process"),
    ("process.squatter", GAUGE, None),
    # per container (and pod) on each device
    ("container.memory.used", GAUGE, "byte"),
    ("container.sm_utilization", GAUGE, "percent"),
    ("container.processes", GAUGE, "process"),
    # per process, only with --per-process
    ("process.memory.used", GAUGE, "byte"),
    ("process.sm_utilization", GAUGE, "percent"),
    # per IR on this node
    ("ir.gpus", GAUGE, "device"),
    ("ir.gpus_busy", GAUGE, "device"),
    ("ir.gpus_idle", GAUGE, "device"),
    ("ir.gpus_idle_held", GAUGE, "device"),
    ("ir.gpus_unhealthy", GAUGE, "device"),
    ("ir.utilization", GAUGE, "percent"),
    ("ir.memory.used", GAUGE, "byte"),
    ("ir.processes", GAUGE, "process"),
    # the agent itself
    ("node.gpus", GAUGE, "device"),
    ("node.cycle_time", GAUGE, "second"),
    ("node.nvml_errors", COUNT, "error"),
    ("node.points_dropped", COUNT, "sample"),
    ("node.events_dropped", COUNT, "event"),
)
