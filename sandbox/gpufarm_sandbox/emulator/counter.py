"""A request counter: how many Datadog and Slack API calls reached the sandbox, per endpoint.

`GET /_sandbox/requests` answers `{"total": n, "by_endpoint": {"GET /api/v2/incidents/search": k, ...}}` (an
endpoint is the method and the route's rule, so `/api/v2/incidents/<incident_id>` counts every incident id
together); `DELETE /_sandbox/requests` starts again from zero, as `POST /_sandbox/reset` does. Benchmarks and tests
read it to say how many calls a path costs, from outside the client under test; `kind` sorts an endpoint into
what it costs (a read, a host-tag write, an incident write...) so a figure can say which writes a path made.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

# What an endpoint of the counter costs, by the method and the route's rule.
READ = "reads"
HOST_WRITE = "host_writes"
INCIDENT_WRITE = "incident_writes"
OTHER_WRITE = "other_writes"
METRICS = "metrics"
SLACK = "slack"
KINDS = (READ, HOST_WRITE, INCIDENT_WRITE, OTHER_WRITE, METRICS, SLACK)


def kind(endpoint: str) -> str:
    """What one counted endpoint (`"PUT /api/v1/tags/hosts/<host_name>"`) costs: one of KINDS.

    A search and a metrics query are POSTs that read; a host's `user` tags and an incident (its fields, its
    attachments, its todos) are the two things gpufarm writes in Datadog, told apart so that a sync's figures say
    how many hosts it re-tagged and how many leases it recorded a repair on.
    """
    method, _, route = endpoint.partition(" ")
    if route.startswith("/slack/"):
        return SLACK
    if route.startswith("/api/v2/series"):
        return METRICS
    if method in ("GET", "HEAD") or route.endswith("/search") or route.startswith("/api/v2/query/"):
        return READ
    if route.startswith("/api/v1/tags/hosts"):
        return HOST_WRITE
    if route.startswith("/api/v2/incidents"):
        return INCIDENT_WRITE
    return OTHER_WRITE


class RequestCounter:
    """Counts API requests per endpoint; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def count(self, method: str, endpoint: str) -> None:
        """One more request to `endpoint` (a route rule, or the path when no route matched)."""
        with self._lock:
            self._counts[f"{method} {endpoint}"] += 1

    def clear(self) -> None:
        """Start again from zero."""
        with self._lock:
            self._counts.clear()

    def dump(self) -> dict[str, Any]:
        """The total and the count per endpoint, busiest first."""
        with self._lock:
            ordered = dict(sorted(self._counts.items(), key=lambda item: (-item[1], item[0])))
        return {"total": sum(ordered.values()), "by_endpoint": ordered}
