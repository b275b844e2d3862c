"""One call retried within bounds: a fixed number of attempts, exponential backoff with jitter, and never a wait
that would end past the invocation's (or the step's) time budget (gpufarm.adapters.time_budget).

For the clients whose own retries cannot ask the time budget before they wait (the price lists' reads, which run
as a bounded step of the sync): their clients are built with no retries of their own, and this is the only loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from gpufarm.adapters import time_budget

T = TypeVar("T")
BASE_WAIT_S = 0.5
MAX_WAIT_S = 8.0


def retried(
    call: Callable[[], T],
    *,
    attempts: int,
    retryable: Callable[[Exception], bool],
    sleeper: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, tried again after a retryable failure up to `attempts` tries in all; the last failure is raised."""
    tries = max(1, attempts)
    for attempt in range(1, tries + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == tries or not retryable(exc):
                raise
            wait = min(MAX_WAIT_S, BASE_WAIT_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)  # noqa: S311 - jitter
            if not time_budget.allows(wait):
                raise
            sleeper(wait)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
