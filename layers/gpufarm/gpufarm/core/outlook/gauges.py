"""The outlook's gauges, sent with the others by the sync: free, leased and reserved GPUs per pool, model and week
ahead (`week:00` is the one that starts now), each the week's busiest moment (gpufarm.core.outlook.capacity).

Declared under `lifecycle_metrics` in spec/metrics.yaml; the quota ledger dashboard's outlook table reads them.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries
from gpufarm.core.outlook.capacity import PoolOutlook

FREE_GPUS = "gpufarm.outlook.free_gpus"
LEASED_GPUS = "gpufarm.outlook.leased_gpus"
RESERVED_GPUS = "gpufarm.outlook.reserved_gpus"
GAUGES = (FREE_GPUS, LEASED_GPUS, RESERVED_GPUS)
UNIT = "device"


def outlook_series(pools: Iterable[PoolOutlook], timestamp: int) -> list[MetricSeries]:
    """One gauge of each kind per pool, model and week ahead."""
    out: list[MetricSeries] = []
    for pool in pools:
        for index, slot in enumerate(pool.slots):
            tags = tuple(
                normalize_tag(t)
                for t in (f"environment:{pool.environment}", f"gpu_model:{pool.gpu_model}", f"week:{index:02d}")
            )
            for name, value in ((FREE_GPUS, slot.free), (LEASED_GPUS, slot.leased), (RESERVED_GPUS, slot.reserved)):
                out.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tags, type=3, unit=UNIT))
    return out
