"""Used GPUs on a `datadog-agent` pool end to end on the local host: a lease's host sends only the Datadog Agent GPU
check's series (gpufarm_sandbox.agentcheck: no gpufarm tag, the lease reaches them through the host's `ir:` tag),
6 of its 8 devices busy; the scheduled sync measures them with its one extra query on `gpu.sm_active`, accrues the
lease's busy and idle GPU-hours into its incident, and /gpu quota shows them used and idle, not unmeasured."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_farm import EXAMPLE_FARM, driven, without_inventory

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import CAROL
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration

# Accrue each quarter hour so one 15-minute sync past the first quarter hour accrues (the default is hourly).
LEDGER = "ledger: {accrue_hours: 0.25, window_minutes: 15}\n"
HOST = "aws-p4d-01"


@pytest.fixture
def agent_farm(local: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFarm]:
    """The example farm, its AWS pool on the Datadog Agent, without the cloud sources, accruing each quarter hour."""
    text = EXAMPLE_FARM.read_text().replace("metrics_source: gpufarm-node", "metrics_source: datadog-agent")
    # Without the cloud inventory sources (their own tests cover them): this test is about the Agent's metrics.
    path = tmp_path / "farm.yaml"
    path.write_text(without_inventory(text) + LEDGER)
    with driven(local, path) as farm:
        yield farm


def test_an_agent_pool_lease_accrues_busy_and_idle_hours_from_the_agent_check(agent_farm: LocalFarm) -> None:
    farm = agent_farm
    farm.slash(CAROL, "request 8 A100 project=asr team=speech env=cloud-aws")
    assert farm.settle()
    ir = ir_in(farm.messages(user=CAROL.id, kind="response", contains="IR-")[-1]["text"])
    assert ir is not None
    lease = farm.allocation(ir)
    assert lease.phase is Phase.ALLOCATED and tuple(lease.hosts) == (HOST,)
    # 20 minutes of the check's runs, a minute apart: 6 devices training, 2 idle; sent ten minutes ahead at a time,
    # as the intake allows.
    check = agentcheck.AgentGpuCheck(HOST, "A100")
    activity = {i: agentcheck.Activity.busy() if i < 6 else agentcheck.IDLE for i in range(8)}
    for _ in range(2):
        now = int(float(farm.get("/_sandbox/clock")["now"]))
        agentcheck.push(farm.base_url, farm.host.env["DD_API_KEY"], check.series(activity, range(now, now + 600, 60)))
        farm.post("/_sandbox/clock", {"advance": 600})
    assert farm.wait_for(lambda: farm.allocation(ir).hours_held > 0, timeout=90)
    accrued = farm.allocation(ir)
    assert accrued.hours_held >= 2.0 and accrued.hours_unmeasured == 0
    assert accrued.hours_busy == pytest.approx(accrued.hours_held * 6 / 8, rel=0.01)
    assert accrued.hours_idle == pytest.approx(accrued.hours_held * 2 / 8, rel=0.01)

    farm.slash(CAROL, "quota speech")
    assert farm.settle()
    answer = farm.messages(user=CAROL.id, kind="response")[-1]
    text = answer["text"] + json.dumps(answer["blocks"])
    assert "`speech/asr` A100 in `cloud-aws`: 8 held: 6 used / 2 idle / 0 unmeasured" in text, text
