"""The invocation's time budget: retries and waits give up before the function's Timeout would stop it.

Lambda stops a function at its Timeout and throws its work away: a worker's answer is never sent, a queue
message comes back only after its visibility timeout. Each adapter bounds its retries per call, but one invocation
makes many calls, and through a bad minute (429s asking for seconds, 5xx backing off) their waits add up past the
Timeout. So the entry point (`gpufarm.handlers.telemetry.instrument`) opens the invocation's budget from Lambda's
context, and every retry or rate-limit wait asks `allows(wait)` first: a wait that would end past the budget is not
taken, the call fails as an UpstreamError, and the handler still has time to answer ("try again in a minute") and to
leave nothing half-done. A reserve at the end is kept for that answer: `for_answer()` opens it.

Outside an invocation (the CLI, a test calling an adapter) there is no budget and `allows` is always true.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

# Kept for the answer at the end of an invocation: at most this, and at most this share of the whole Timeout.
ANSWER_RESERVE_S = 10.0
ANSWER_RESERVE_SHARE = 0.2
# Never planned into: the last moments before the Timeout (Lambda's own hand-back, the log flush).
FINAL_MARGIN_S = 0.5
# A retried call is worth making only with at least this long left for the call itself after its wait.
CALL_ALLOWANCE_S = 1.0


@dataclass(frozen=True, slots=True)
class _Budget:
    work_until: float  # time.monotonic() by which the work gives up
    answer_until: float  # and the answer


_BUDGET: ContextVar[_Budget | None] = ContextVar("gpufarm_time_budget", default=None)


def remaining_s(context: Any) -> float | None:
    """Seconds Lambda's context says are left; None when the context cannot say (a direct call, a smoke test)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(remaining):
        return None
    try:
        millis = float(remaining())
    except (TypeError, ValueError):
        return None
    return max(0.0, millis / 1000.0)


@contextmanager
def invocation(seconds_left: float | None) -> Iterator[None]:
    """The budget of one invocation with `seconds_left` before its Timeout (None: no budget)."""
    if seconds_left is None:
        yield
        return
    now = time.monotonic()
    reserve = min(ANSWER_RESERVE_S, seconds_left * ANSWER_RESERVE_SHARE)
    answer_until = now + max(0.0, seconds_left - FINAL_MARGIN_S)
    token = _BUDGET.set(_Budget(work_until=min(answer_until, now + seconds_left - reserve), answer_until=answer_until))
    try:
        yield
    finally:
        _BUDGET.reset(token)


@contextmanager
def for_answer() -> Iterator[None]:
    """Open the reserve: the calls that answer the user may wait until just before the Timeout."""
    budget = _BUDGET.get()
    if budget is None:
        yield
        return
    token = _BUDGET.set(_Budget(work_until=budget.answer_until, answer_until=budget.answer_until))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def allows(wait_s: float) -> bool:
    """True when waiting `wait_s` and then making one more call still ends within the budget."""
    budget = _BUDGET.get()
    return budget is None or time.monotonic() + max(0.0, wait_s) + CALL_ALLOWANCE_S <= budget.work_until


@contextmanager
def step(seconds: float) -> Iterator[None]:
    """A step of the invocation with a budget of its own: at most `seconds` from now, and never past the
    invocation's (a step outside an invocation still has its own). Waits inside it ask `allows` as anywhere."""
    now = time.monotonic()
    outer = _BUDGET.get()
    until = now + max(0.0, seconds)
    if outer is None:
        budget = _Budget(work_until=until, answer_until=until)
    else:
        budget = _Budget(work_until=min(outer.work_until, until), answer_until=outer.answer_until)
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)
