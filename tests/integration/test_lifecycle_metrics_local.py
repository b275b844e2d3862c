"""Lifecycle metrics end to end on the local host: a lease released from Slack is counted once as a reclaim with its
reason and GPUs in the sandbox's metrics (the real runtime's sink, the count type over the wire), and the scheduled
sync's gauges say a request waits for an operator and for how long, as the farm overview's queries read them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB

pytestmark = pytest.mark.integration

SETTLE_S = 60.0


def _now(farm: LocalFarm) -> datetime:
    state: Any = farm.get("/_sandbox/clock")
    return datetime.fromtimestamp(float(state["now"]), UTC)


def _sum(farm: LocalFarm, query: str, aggregator: str = "sum") -> dict[tuple[str, ...], float | None]:
    end = _now(farm) + timedelta(minutes=1)
    return {r.group_tags: r.value for r in farm.gateway.scalar(query, end - timedelta(hours=1), end, aggregator)}


def _ir(farm: LocalFarm, person_id: str) -> int:
    found = ir_in(farm.messages(user=person_id, kind="response", contains="IR-")[-1]["text"])
    assert found is not None
    return found


def test_a_release_is_counted_once_and_the_sync_reports_the_waiting_request(farm: LocalFarm) -> None:
    farm.slash(ALICE, "request 8 H100 project=llm team=nlp env=onprem-hpc")
    farm.settle(timeout=SETTLE_S)
    ir = _ir(farm, ALICE.id)
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED, timeout=SETTLE_S)
    farm.slash(BOB, "request 16 H100 project=vit team=vision env=onprem-hpc")  # beyond quota: an operator decides
    farm.settle(timeout=SETTLE_S)
    asked = _ir(farm, BOB.id)
    assert farm.allocation(asked).phase is Phase.REQUESTED
    farm.slash(ALICE, f"release IR-{ir} now")
    farm.settle(timeout=SETTLE_S)
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED, timeout=SETTLE_S)

    by_reason = " by {reclaim_reason}.as_count()"
    assert _sum(farm, f"sum:gpufarm.leases.reclaims{{ir:ir-{ir}}}{by_reason}") == {("reclaim_reason:released",): 1.0}
    assert _sum(farm, f"sum:gpufarm.leases.reclaimed_gpus{{ir:ir-{ir}}}{by_reason}") == {
        ("reclaim_reason:released",): 8.0
    }

    farm.post("/_sandbox/clock", {"advance": 600})
    farm.host.invoke("QuotaSyncFunction", {"job": "quota_sync"})
    scope = "{environment:onprem-hpc,team:vision,waiting_for:approval}"
    assert _sum(farm, f"sum:gpufarm.requests.waiting{scope}", "last") == {(): 1.0}
    [oldest] = _sum(farm, f"max:gpufarm.requests.oldest_wait{scope}", "last").values()
    assert oldest is not None and oldest >= 600
