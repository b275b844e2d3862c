"""Datadog's rate limits: a budget of requests per period for each endpoint group, as Datadog keeps them per org.

Every Datadog API answer carries `X-RateLimit-Limit` (requests allowed per period), `X-RateLimit-Period` (its length
in seconds; windows are calendar aligned), `X-RateLimit-Remaining` (requests left in this window),
`X-RateLimit-Reset` (whole seconds until the window turns) and `X-RateLimit-Name` (the group); once a group's budget
is spent, requests to it are answered 429 `{"errors": ["Too many requests"]}` until the window turns, and a refused
request does not spend budget. Datadog publishes no figures for the endpoints gpufarm calls (it says to read the
headers), so the defaults are generous enough that tests, benchmarks and the demo never meet them; a test sets small
ones through `POST /_sandbox/ratelimits` `{"groups": {"incidents": {"limit": 5, "period": 1}}}` (`GET` shows each
group's budget and how many requests it refused; `DELETE` and `POST /_sandbox/reset` restore the defaults).

Windows run on real time, not the sandbox clock: a rate limit is about throughput, and the sandbox clock jumps
(a test moving it forward by a day must not hand out a day of budget, nor hold a client that waits in real seconds).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The budget of a group nobody configured: far above anything the test suite, the benchmarks or the demo send.
DEFAULT_LIMIT = 100_000
DEFAULT_PERIOD_S = 10

# Endpoint groups, first match wins; the names are what X-RateLimit-Name says. Datadog does not rate-limit metric
# submission (it bounds payloads instead), so `metrics_submit` only ever limits what a test configures.
GROUPS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("incidents", r"^/api/v2/incidents(/|$)"),
        ("hosts", r"^/api/v1/hosts(/|$)"),
        ("tags", r"^/api/v1/tags(/|$)"),
        ("metrics_submit", r"^/api/v[12]/(series|distribution_points)(/|$)"),
        ("query", r"^/api/v[12]/query(/|$)"),
        ("monitors", r"^/api/v1/monitor(/|$)"),
        ("dashboards", r"^/api/v1/dashboard(/|$)"),
        ("webhooks", r"^/api/v1/integration/webhooks(/|$)"),
        ("other", r"^/api/"),
    )
)
GROUP_NAMES = tuple(name for name, _ in GROUPS)


class GroupLimit(BaseModel):
    """One group's budget in `POST /_sandbox/ratelimits`."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(ge=1, le=10_000_000)
    period: int = Field(ge=1, le=86_400)


class RateLimitSpec(BaseModel):
    """Body of `POST /_sandbox/ratelimits`: the groups to change (the others keep theirs)."""

    model_config = ConfigDict(extra="forbid")

    groups: dict[str, GroupLimit] = Field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What a request gets: admitted or not, and the headers that say where its group stands."""

    group: str
    allowed: bool
    limit: int
    period: int
    remaining: int
    reset: int

    def headers(self) -> dict[str, str]:
        """The X-RateLimit-* headers, as Datadog sends them."""
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Period": str(self.period),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset),
            "X-RateLimit-Name": self.group,
        }


@dataclass
class _Budget:
    limit: int
    period: int
    window: int = -1
    used: int = 0
    refused: int = 0


class RateLimiter:
    """Per-group fixed windows on real time; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._budgets: dict[str, _Budget] = {}
        self.clear()

    def clear(self) -> None:
        """Every group back to the default budget, nothing spent."""
        with self._lock:
            self._budgets = {name: _Budget(DEFAULT_LIMIT, DEFAULT_PERIOD_S) for name in GROUP_NAMES}

    def configure(self, spec: RateLimitSpec) -> None:
        """Set some groups' budgets (their windows start afresh); an unknown group changes nothing."""
        unknown = sorted(set(spec.groups) - set(GROUP_NAMES))
        if unknown:
            raise ValueError(f"unknown rate-limit group {unknown[0]!r}; groups are {', '.join(GROUP_NAMES)}")
        with self._lock:
            for name, group in spec.groups.items():
                self._budgets[name] = _Budget(group.limit, group.period)

    def admit(self, path: str) -> Decision | None:
        """Spend one request of the group `path` falls in, or refuse it; None for a path outside the API."""
        group = next((name for name, pattern in GROUPS if pattern.search(path)), None)
        if group is None:
            return None
        now = self._clock()
        with self._lock:
            budget = self._budgets[group]
            window = math.floor(now / budget.period)
            if window != budget.window:
                budget.window, budget.used = window, 0
            allowed = budget.used < budget.limit
            if allowed:
                budget.used += 1
            else:
                budget.refused += 1
            # Whole seconds, rounded up, so a client that waits the Reset lands in the next window.
            reset = max(1, math.ceil((window + 1) * budget.period - now))
            return Decision(group, allowed, budget.limit, budget.period, budget.limit - budget.used, reset)

    def dump(self) -> dict[str, Any]:
        """Each group's budget, what is left of its window, and how many requests it refused."""
        now = self._clock()
        with self._lock:
            groups = {}
            for name, budget in self._budgets.items():
                current = budget.window == math.floor(now / budget.period)
                groups[name] = {
                    "limit": budget.limit,
                    "period": budget.period,
                    "remaining": budget.limit - (budget.used if current else 0),
                    "refused": budget.refused,
                }
        return {"groups": groups, "refused": sum(g["refused"] for g in groups.values())}
