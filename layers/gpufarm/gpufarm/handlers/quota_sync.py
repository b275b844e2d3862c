"""The scheduled sync (every 15 minutes): expire, reclaim idle past grace, repair tag drift, publish gauges.

A ScheduleV2 delivers its Input as-is (no envelope); the handler needs nothing from it. Repairs go through the
allocation queue's pool groups when this function has GPUFARM_ALLOCATION_QUEUE_URL, so they never interleave
with an allocation; without it they run here (a deployment without the queue has no concurrent allocator).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gpufarm.handlers import runtime as rt

log = logging.getLogger(__name__)


def handle(event: Mapping[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    """Run one sync; returns what it did (raises on upstream failure so the scheduler's retry/DLQ sees it)."""
    try:
        svc = rt.current().service()
    except rt.ConfigurationError as exc:
        raise rt.misconfigured("quota sync", exc) from None
    report = svc.sync()
    summary = asdict(report)
    log.info("sync: %s", summary)
    return summary
