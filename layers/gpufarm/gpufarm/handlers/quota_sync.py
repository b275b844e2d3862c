"""The scheduled sync (every 15 minutes): expire, reclaim idle past grace, repair tag drift, publish gauges; and the
sweep (every minute, `{"job": "sweep"}`): every incident whose step waits on a side effect queued to its pool's
writer, so no step depends on a webhook (gpufarm.core.sync.sweep).

A ScheduleV2 delivers its Input as-is (no envelope): `job` picks the sweep; anything else is the sync. Repairs go
through the allocation queue's pool groups when this function has GPUFARM_ALLOCATION_QUEUE_URL, so they never
interleave with an allocation; without it they run here (a deployment without the queue has no concurrent
allocator).

The sync also keeps the project dashboard's newest-run links alive: when one expires within a quarter of the bound
on a link's life (or is not signed with the current link key), it signs them again and writes the dashboard back
(gpufarm.profiling.dashboard_links); otherwise it only reads it. A deployment without the profile pages skips this.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.handlers import runtime as rt
from gpufarm.profiling.dashboard_links import resigned
from gpufarm.profiling.links import link_signer

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
    summary: dict[str, Any] = asdict(report)
    summary["dashboard_links"] = refresh_dashboard_links(rt.current())
    log.info("sync: %s", summary)
    return summary


def refresh_dashboard_links(runtime: rt.Runtime) -> str:
    """Re-sign the project dashboard's newest-run links when they are due; says what it did.

    A failure here is logged and left to the next sync (15 minutes; the links live at least a quarter of the bound
    after they are first due), never raised: the sync's own work is done and must not be retried for it.
    """
    settings = runtime.settings
    pages_url = settings.profile_pages_url
    editor = runtime.dashboard_editor()
    if not pages_url or settings.profile_link_secret is None or editor is None:
        return "not configured"
    try:
        found = editor.project()
        if found is None:
            return "no dashboard"
        dashboard_id, dashboard = found
        body = resigned(dashboard, link_signer(settings), pages_url, runtime.clock().now().timestamp())
        if body is None:
            return "current"
        editor.replace(dashboard_id, body)
    except GpufarmError as exc:
        log.warning("the project dashboard's page links were not refreshed: %s", exc)
        return "not refreshed"
    log.info("the project dashboard's page links were signed again")
    return "re-signed"
