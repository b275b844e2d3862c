"""What the NVML source keeps of one GPU between cycles, and which NVML errors are capabilities or losses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import pynvml

# Capabilities, not failures (the Datadog Agent's IsUnsupported; pynvml's unversioned wrappers raise the last).
UNSUPPORTED: Final = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLLibraryMismatchError,
)
LOST: Final = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)


class GpuLost(Exception):
    """The GPU fell off the bus or needs a reset: reported unhealthy until NVML is re-initialised."""


@dataclass
class GpmPair:
    """Two GPM sample buffers of one MIG instance: the last cycle's sample and the one the next cycle fills."""

    previous: Any
    spare: Any
    taken_at: float | None = None


@dataclass
class Device:
    """One GPU: its handle and identity, the signals it does not support, its sampling cursors and GPM buffers."""

    index: int
    handle: Any
    uuid: str
    name: str
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    util_ts: int = 0
    proc_ts: int = 0
    gpm: bool = False
    gpm_pairs: dict[str, GpmPair] = field(default_factory=dict)
    metrics_get: Any = None
    mig_info: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    memory_checked: bool = False
