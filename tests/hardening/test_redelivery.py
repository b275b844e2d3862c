"""Every incident webhook and idle alert delivered 2-3 times in shuffled order (copies arriving after later
deliveries, past SQS's deduplication window) ends in the state one in-order delivery gives (issue 8).
gpufarm_sandbox.redelivery plays it; benchmarks/reliability.py runs it at full size."""

from __future__ import annotations

import pytest
from attack import Target

from gpufarm_sandbox.badday import KINDS
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.redelivery import run

REQUESTS = 2 * len(KINDS)


@pytest.mark.timeout(300)
def test_shuffled_redelivery_ends_as_one_in_order_delivery(target: Target) -> None:
    result = run(target.farm, lambda: LocalFarm.ready(target.local), REQUESTS)
    assert result.requests == REQUESTS
    # Every webhook and alert got one or two extra copies.
    assert result.webhooks > REQUESTS and result.webhooks <= result.webhook_copies <= 2 * result.webhooks
    assert result.alerts > 0 and result.alerts <= result.alert_copies <= 2 * result.alerts
    assert result.differences == []
