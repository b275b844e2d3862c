"""The scheduled sync (every 15 minutes): expire, reclaim idle past grace, repair tag drift, publish gauges; and the
sweep (every minute, `{"job": "sweep"}`): every incident whose step waits on a side effect queued to its pool's
writer, so no step depends on a webhook (gpufarm.core.sync.sweep).

A ScheduleV2 delivers its Input as-is (no envelope): `job` picks the sweep; anything else is the sync. Repairs go
through the allocation queue's pool groups when this function has GPUFARM_ALLOCATION_QUEUE_URL, so they never
interleave with an allocation; without it they run here (a deployment without the queue has no concurrent
allocator).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)

SWEEP_JOB = "sweep"


def handle(event: Mapping[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    """Run one sync; returns what it did (raises on upstream failure so the scheduler's retry/DLQ sees it)."""
    try:
        svc = rt.current().service()
    except rt.ConfigurationError as exc:
        raise rt.misconfigured("quota sync", exc) from None
    if isinstance(event, Mapping) and event.get("job") == SWEEP_JOB:
        swept = asdict(svc.sweep())
        log.info("sweep: %s", swept)
        return swept
    report = svc.sync()
    summary = asdict(report)
    log.info("sync: %s", summary)
    return summary
