"""How a pool hands out GPUs, without the farm's models: the farm file's `environments.<pool>.kind` and the
reports' view of it (gpufarm.core.config.farm_view) share it."""

from __future__ import annotations

from enum import StrEnum


class PoolKind(StrEnum):
    """How a pool hands out GPUs."""

    # Whole hosts, exclusively: cloud VMs, HPC nodes.
    DEDICATED = "dedicated"
    # GPU units (GPUs or MIG slices) without host exclusivity: GPU slicing on a shared cluster.
    SHARED = "shared"
