"""A report's pool capacity: the GPUs of each pool and model over its period, from the inventory gauge the sync
publishes (`gpufarm.inventory.gpus.total` per environment and model, gpufarm.core.sync.gauges).

One timeseries query whatever the farm's size, each pool's mean over the period's buckets: `gpufarm report` reads it
in every format (the light reader, gpufarm.adapters.datadog_reads; the HTML's through the gateway), `/gpu report`
not (no metrics given). A failed or absent read leaves the unallocated hours unknown with a note, and
changes no other figure (those come from the incidents).
"""

from __future__ import annotations

import logging
import math

from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.ports import MetricsHistory
from gpufarm.reporting.query import Period

log = logging.getLogger(__name__)

TOTAL_METRIC = "gpufarm.inventory.gpus.total"
CAPACITY_QUERY = f"avg:{TOTAL_METRIC}{{*}} by {{environment,gpu_model}}"
MAX_POINTS = 300
# Pools and models read at most (a farm file names far fewer).
MAX_POOLS = 500
MAX_GPUS = 1_000_000


def read_capacity(metrics: MetricsHistory | None, period: Period) -> tuple[dict[tuple[str, str], float] | None, str]:
    """Mean GPUs per (pool, MODEL) over the period, or None with the reason it could not be read."""
    if metrics is None:
        return None, "unallocated capacity: not read (no metrics to read the inventory gauges from)"
    try:
        results = metrics.timeseries(CAPACITY_QUERY, period.start, period.end, max_points=MAX_POINTS)
    except GpufarmError as exc:
        log.warning("report: pool capacity could not be read: %s", exc)
        return None, f"unallocated capacity could not be read ({exc})"
    out: dict[tuple[str, str], float] = {}
    for result in results[:MAX_POOLS]:
        tags = dict(t.partition(":")[::2] for t in result.group_tags)
        env, model = tags.get("environment", ""), tags.get("gpu_model", "").upper()
        values = [p.value for p in result.points if math.isfinite(p.value) and 0 <= p.value <= MAX_GPUS]
        if env and model and values:
            out[(env, model)] = sum(values) / len(values)
    return out, f"unallocated capacity: the mean of {TOTAL_METRIC} per pool and model over the period"
