"""The invocation's time budget (gpufarm.adapters.time_budget): retries give up before the function's Timeout.

A worker whose Slack and Datadog calls each retried within their own bounds could still run past its 60 s Timeout
through a bad minute, and Lambda would throw its answer away; with the budget every retry and wait asks first, and
the answer keeps a reserve.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

from gpufarm.adapters import time_budget
from gpufarm.adapters.slack import BoundedRateLimitRetryHandler, GatewayErrorRetryHandler


class Context:
    def __init__(self, millis: Any) -> None:
        self.millis = millis

    def get_remaining_time_in_millis(self) -> Any:
        return self.millis


def test_without_an_invocation_every_wait_is_allowed() -> None:
    assert time_budget.allows(3600)
    assert time_budget.remaining_s(None) is None
    assert time_budget.remaining_s(object()) is None
    assert time_budget.remaining_s(Context("soon")) is None
    assert time_budget.remaining_s(Context(-5)) == 0.0
    assert time_budget.remaining_s(Context(60_000)) == 60.0


def test_the_work_keeps_a_reserve_for_the_answer_and_the_answer_may_spend_it() -> None:
    with time_budget.invocation(60.0):  # 10 s kept for the answer, 0.5 s never planned into
        assert time_budget.allows(48.5)
        assert not time_budget.allows(49.5)
        with time_budget.for_answer():
            assert time_budget.allows(57.5)
            assert not time_budget.allows(59.0)
        assert not time_budget.allows(49.5)
    with time_budget.invocation(5.0):  # a short Timeout keeps a fifth of it
        assert time_budget.allows(2.9)
        assert not time_budget.allows(3.1)
    with time_budget.invocation(0.0):
        assert not time_budget.allows(0.0)
    assert time_budget.allows(3600)


def test_the_budget_runs_down_with_the_clock() -> None:
    with time_budget.invocation(3.0):  # 2.4 s of work
        assert time_budget.allows(0.5)
        time.sleep(1.0)
        assert not time_budget.allows(0.5)


def _answer(status: int, retry_after: str | None = None) -> HttpResponse:
    headers = {"retry-after": [retry_after]} if retry_after is not None else {}
    return HttpResponse(status_code=status, headers=headers)


REQUEST = HttpRequest(method="POST", url="https://slack.com/api/chat.postMessage", headers={})


@pytest.mark.parametrize(("left", "expected"), [(None, True), (60.0, True), (8.0, False)])
def test_a_slack_429_is_retried_only_when_its_retry_after_fits_the_budget(left: float | None, expected: bool) -> None:
    handler = BoundedRateLimitRetryHandler(max_retry_count=2, max_wait=30, sleep=lambda s: None)
    with time_budget.invocation(left):
        assert handler.can_retry(state=RetryState(), request=REQUEST, response=_answer(429, "10")) is expected


def test_a_slack_5xx_is_retried_only_when_its_backoff_fits_the_budget() -> None:
    handler = GatewayErrorRetryHandler(max_retry_count=5)
    late = RetryState()
    for _ in range(4):  # the fifth attempt backs off 0.5 x 2^4 = 8 s and more
        late.increment_current_attempt()
    assert handler.can_retry(state=late, request=REQUEST, response=_answer(503))
    with time_budget.invocation(60.0):
        assert handler.can_retry(state=RetryState(), request=REQUEST, response=_answer(502))
        assert handler.can_retry(state=late, request=REQUEST, response=_answer(504))
    with time_budget.invocation(6.0):
        assert not handler.can_retry(state=late, request=REQUEST, response=_answer(503))
    assert not handler.can_retry(state=RetryState(), request=REQUEST, response=_answer(400))
