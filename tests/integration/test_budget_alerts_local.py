"""Budget alerts end to end on the local host: a budget in money crosses 80 % while the scheduled syncs run, the
alert crosses the allocation queue into the team's budget group and is told once to the team's channel and the
operators', a later sync tells nothing more, and `/gpu budget` answers through the worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from local_farm import EXAMPLE_FARM, driven, without_inventory

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, DANA, OPERATORS_CHANNEL, RESEARCH_CHANNEL
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration

PROJECT = "budget-it"
# 8 H100 at 2.50 a GPU-hour: 20.00 an hour; 40.00 of 47.06 after two hours is 85 %.
AMOUNT, STEP_S = 47.06, 600


@pytest.fixture
def budget_farm(local: LocalEnv, tmp_path: Path) -> Iterator[LocalFarm]:
    """The example farm without cloud sources, nlp's channel set, H100 priced on the HPC pool, a project budget."""
    farm = yaml.safe_load(without_inventory(EXAMPLE_FARM.read_text()))
    farm["teams"]["nlp"]["channel"] = RESEARCH_CHANNEL
    rates = farm.setdefault("rates", {})
    rates["currency"] = rates.get("currency", "USD")
    hpc = rates.setdefault("environments", {}).setdefault("onprem-hpc", {}).setdefault("per_gpu_hour", {})
    hpc["H100"] = 2.5
    farm["budgets"] = [{"team": "nlp", "project": PROJECT, "period": "month", "amount": AMOUNT}]
    path = tmp_path / "farm.yaml"
    path.write_text(yaml.safe_dump(farm, sort_keys=False))
    with driven(local, path) as driver:
        yield driver


def _busy(ir: int, host: str, start: int) -> list[dict[str, Any]]:
    return [
        {
            "metric": "gpufarm.ir.gpus_busy",
            "type": 3,
            "points": [{"timestamp": t, "value": 8.0} for t in range(start, start + STEP_S, 60)],
            "tags": [f"gpu_ir:ir-{ir}", f"ir:ir-{ir}", "environment:onprem-hpc"],
            "resources": [{"name": host, "type": "host"}],
        }
    ]


def _told(farm: LocalFarm, channel: str, percent: int) -> list[str]:
    return [
        m["text"]
        for m in farm.messages(channel=channel)
        if f"nlp/{PROJECT}'s budget for" in m["text"] and f"passed {percent} %" in m["text"]
    ]


def test_a_budget_in_money_is_told_each_threshold_once_through_the_queue(
    budget_farm: LocalFarm, local: LocalEnv
) -> None:
    farm = budget_farm
    farm.slash(ALICE, f"request 8 H100 project={PROJECT} team=nlp env=onprem-hpc days=1")
    assert farm.settle()
    ir = ir_in(farm.messages(user=ALICE.id, kind="response", contains=f"/{PROJECT}`")[-1]["text"])
    assert ir is not None and farm.allocation(ir).phase is Phase.REQUESTED  # USD 480 expected: over the budget
    farm.slash(DANA, f"approve IR-{ir}")
    assert farm.settle() and farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED)
    [host, *_] = farm.allocation(ir).hosts
    for _ in range(12):  # two hours; the local schedule runs the sync as the clock moves
        now = int(float(farm.get("/_sandbox/clock")["now"]))
        agentcheck.push(farm.base_url, farm.host.env["DD_API_KEY"], _busy(ir, host, now))
        farm.post("/_sandbox/clock", {"advance": STEP_S})
        farm.settle()
    local.host.invoke("QuotaSyncFunction", {"job": "quota_sync"})
    assert farm.settle()
    for channel in (RESEARCH_CHANNEL, OPERATORS_CHANNEL):
        assert len(_told(farm, channel, 50)) == 1 and len(_told(farm, channel, 80)) == 1
    [alert] = _told(farm, RESEARCH_CHANNEL, 80)
    assert "USD 47.06" in alert and "at this rate" in alert
    farm.post("/_sandbox/clock", {"advance": 300})
    report = local.host.invoke("QuotaSyncFunction", {"job": "quota_sync"})
    assert farm.settle()
    assert not [s for s in report["budget_alerts"] if s.startswith(f"nlp/{PROJECT} ")]
    assert len(_told(farm, RESEARCH_CHANNEL, 80)) == 1 and len(_told(farm, OPERATORS_CHANNEL, 80)) == 1
    farm.slash(ALICE, "budget nlp")
    assert farm.settle()
    answer = farm.answer(ALICE, f"`nlp/{PROJECT}`")
    assert answer is not None and f"IR-{ir}" in answer["text"] and "at this rate" in answer["text"]
    farm.slash(ALICE, f"release IR-{ir} now")
    assert farm.settle()
