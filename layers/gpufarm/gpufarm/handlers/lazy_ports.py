"""The runtime's own small ports: wall time, and the Datadog query and event ports built on their first use
(gpufarm.handlers.runtime hands them out)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufarm.core.kernel.ports import Event


class SystemClock:
    """Wall time (Lambda)."""

    def now(self) -> datetime:
        """Timezone-aware now."""
        return datetime.now(UTC)

    def epoch(self) -> float:
        """Epoch seconds."""
        return time.time()


class LazyQuery:
    """The Datadog query port, built on its first query: the cards that read it must not build the gateway early."""

    def __init__(self, port: Callable[[], Any]) -> None:
        self._port = port

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> Any:
        """As MetricsQuery.scalar."""
        return self._port().scalar(query, start, end, aggregator)


class LazyEvents:
    """The Datadog event port, built on its first event (most syncs post none)."""

    def __init__(self, port: Callable[[], Any]) -> None:
        self._port = port

    def post_event(self, event: Event) -> None:
        """As EventSink.post_event."""
        self._port().post_event(event)
