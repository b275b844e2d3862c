"""A request counter: how many Datadog and Slack API calls reached the sandbox, per endpoint.

`GET /_sandbox/requests` answers `{"total": n, "by_endpoint": {"GET /api/v2/incidents/search": k, ...}}` (an
endpoint is the method and the route's rule, so `/api/v2/incidents/<incident_id>` counts every incident id
together); `DELETE /_sandbox/requests` starts again from zero, as `POST /_sandbox/reset` does. Benchmarks and tests
read it to say how many calls a path costs, from outside the client under test.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


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
