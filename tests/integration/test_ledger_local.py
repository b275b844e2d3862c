"""The ledger end to end on the local host: a lease's host reports busy and idle-held GPUs to the sandbox, the
scheduled sync measures them, accrues the lease's GPU-hours into its incident through the pool's queue, and
/gpu quota shows held, used and idle GPUs and the team's GPU-hour budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_farm import EXAMPLE_FARM, driven, without_inventory

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration

# Accrue each quarter hour so one 15-minute sync past the first quarter hour accrues (the default is hourly).
BUDGET = (
    "ledger: {accrue_hours: 0.25, window_minutes: 15}\nbudgets:\n  - {team: nlp, period: month, gpu_hours: 100000}\n"
)


@pytest.fixture
def ledger_farm(local: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFarm]:
    """The example farm without cloud sources, accruing every quarter hour, with a monthly budget for nlp."""
    path = tmp_path / "farm.yaml"
    # Without the cloud inventory sources (their own tests cover them): this test is about the agents' metrics.
    path.write_text(without_inventory(EXAMPLE_FARM.read_text()) + BUDGET)
    with driven(local, path) as farm:
        yield farm


def _busy(ir: int, host: str, busy: float, times: range, idle_held: float = 0.0) -> list[dict[str, Any]]:
    """gpufarm.ir.gpus_busy and gpus_idle_held as gpufarm-node sends them, one point a minute."""
    return [
        {
            "metric": metric,
            "type": 3,
            "points": [{"timestamp": t, "value": value} for t in times],
            "tags": [f"gpu_ir:ir-{ir}", f"ir:ir-{ir}", "environment:onprem-hpc", "cluster:hpc-a"],
            "resources": [{"name": host, "type": "host"}],
        }
        for metric, value in (("gpufarm.ir.gpus_busy", busy), ("gpufarm.ir.gpus_idle_held", idle_held))
    ]


def test_busy_gpus_accrue_into_the_incident_and_quota_shows_the_ledger(ledger_farm: LocalFarm) -> None:
    farm = ledger_farm
    farm.slash(ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc")
    assert farm.settle()
    ir = ir_in(farm.messages(user=ALICE.id, kind="response", contains="IR-")[-1]["text"])
    assert ir is not None
    lease = farm.allocation(ir)
    assert lease.phase is Phase.ALLOCATED
    [host] = lease.hosts
    # 20 minutes of 6 of the 8 GPUs busy, sent ten minutes ahead at a time as the intake allows.
    for _ in range(2):
        now = int(float(farm.get("/_sandbox/clock")["now"]))
        agentcheck.push(
            farm.base_url, farm.host.env["DD_API_KEY"], _busy(ir, host, 6.0, range(now, now + 600, 60), 1.0)
        )
        farm.post("/_sandbox/clock", {"advance": 600})
    assert farm.wait_for(lambda: farm.allocation(ir).hours_held > 0, timeout=90)
    accrued = farm.allocation(ir)
    assert accrued.hours_held >= 2.0 and accrued.hours_unmeasured == 0
    assert accrued.hours_busy == pytest.approx(accrued.hours_held * 6 / 8, rel=0.01)
    assert accrued.hours_idle == pytest.approx(accrued.hours_held * 2 / 8, rel=0.01)
    # Of the 2 idle GPUs, 1 held memory with no work: idle-held, a part of the idle hours.
    assert accrued.hours_idle_held == pytest.approx(accrued.hours_held * 1 / 8, rel=0.01)
    assert accrued.hours_by_month and accrued.hours_until is not None

    farm.slash(ALICE, "quota nlp")
    assert farm.settle()
    answer = farm.messages(user=ALICE.id, kind="response")[-1]
    text = answer["text"] + json.dumps(answer["blocks"])
    assert "`nlp/llm-ko` H100 in `onprem-hpc`: 8 held: 6 used / 2 idle / 0 unmeasured" in text, text
    assert "GPU-hour budgets" in text and "100,000" in text
