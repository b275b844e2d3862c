"""The id of gpufarm's project dashboard, for the links of messages (gpufarm.core.chat.links): one read per container.

`gpufarm datadog apply` creates the dashboard, so its id is only known there; the runtime finds it instead by the
ownership marker apply writes into its description (`[gpufarm-dashboard:project]`, gpufarm.setup.dashboards), in
Datadog's dashboard list, read on the first message that needs it and kept for the container's life. A dashboard
not there yet (apply has not run) or a list that could not be read is asked again only after RETRY_S, so a
message never costs a Datadog call of its own; meanwhile links fall back to the metrics explorer.

`ProjectDashboardEditor` reads and writes that dashboard's definition for the scheduled sync, which re-signs its
newest-run iframes before their links expire (gpufarm.profiling.dashboard_links): the one dashboard write the
functions make.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import Any

from gpufarm.adapters import datadog_client as dc
from gpufarm.config import Settings
from gpufarm.core.chat.links import PROJECT_DASHBOARD_KEY
from gpufarm.core.kernel.errors import GpufarmError, UpstreamError

log = logging.getLogger(__name__)

# How long a lookup that found nothing (or failed) is trusted before the list is read again.
RETRY_S = 600.0


def marked(dashboards: Iterable[Mapping[str, Any]], key: str = PROJECT_DASHBOARD_KEY) -> str | None:
    """The id of the oldest dashboard whose description carries gpufarm's marker for `key` (apply keeps that one)."""
    from gpufarm.setup.dashboards import dashboard_key

    found = [d for d in dashboards if dashboard_key(d) == key and d.get("id")]
    if not found:
        return None
    return str(min(found, key=lambda d: str(d.get("created_at") or ""))["id"])


class ProjectDashboard:
    """Callable: the project dashboard's id, or None (gpufarm.core.chat.links.DashboardLookup); thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        gate: dc.RateLimitGate | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._gate = gate
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._id: str | None = None
        self._asked_at: float | None = None
        self.reads = 0

    @cached_property
    def _api(self) -> Any:
        # Raw answers: the summaries are read as JSON, not decoded into the client's models.
        client = dc.api_client(self.settings, retry=True, raw=True, gate=self._gate)
        return dc.build("datadog_api_client.v1.api.dashboards_api", "DashboardsApi", client)

    def __call__(self) -> str | None:
        """The id once found; else a fresh read when the last one is older than RETRY_S, else None."""
        with self._lock:
            if self._id is not None:
                return self._id
            now = self._monotonic()
            if self._asked_at is not None and now - self._asked_at < RETRY_S:
                return None
            self._asked_at = now
            self.reads += 1
            try:
                with dc.errors("list dashboards"):
                    answer = dc.read_json(self._api.list_dashboards())
            except GpufarmError as exc:
                log.warning("the project dashboard's id could not be read (links use the metrics explorer): %s", exc)
                return None
            listed = answer.get("dashboards") if isinstance(answer, Mapping) else None
            self._id = marked(d for d in listed or [] if isinstance(d, Mapping))
            if self._id is None:
                log.info("no project dashboard yet (gpufarm datadog apply creates it); links use the metrics explorer")
            return self._id


class ProjectDashboardEditor:
    """The project dashboard's whole definition, read and replaced (the sync's re-signing of its page links)."""

    def __init__(self, settings: Settings, *, gate: dc.RateLimitGate | None = None) -> None:
        self.settings = settings
        self._gate = gate

    @cached_property
    def _api(self) -> Any:
        client = dc.api_client(self.settings, retry=True, raw=True, gate=self._gate)
        return dc.build("datadog_api_client.v1.api.dashboards_api", "DashboardsApi", client)

    def project(self) -> tuple[str, dict[str, Any]] | None:
        """The project dashboard's id and definition, or None when apply has not made it."""
        with dc.errors("list dashboards"):
            answer = dc.read_json(self._api.list_dashboards())
        listed = answer.get("dashboards") if isinstance(answer, Mapping) else None
        found = marked(d for d in listed or [] if isinstance(d, Mapping))
        if found is None:
            return None
        with dc.errors("get dashboard"):
            body = dc.read_json(self._api.get_dashboard(dashboard_id=found))
        if not isinstance(body, dict):
            raise UpstreamError(f"Datadog answered with {type(body).__name__} where a dashboard was expected")
        return found, body

    def replace(self, dashboard_id: str, body: Mapping[str, Any]) -> None:
        """Write the dashboard's definition back (PUT: the same body twice is the same dashboard)."""
        with dc.errors("update dashboard", caller_body=True):
            dc.read_json(self._api.update_dashboard(dashboard_id=dashboard_id, body=dict(body)))
