"""An environment on the Datadog Agent (`metrics_source: datadog-agent`) end to end on the local host: the local
Datadog setup makes its idle monitors on the Agent GPU check's `gpu.sm_active`, a lease's host sends Agent-shaped
series (gpufarm_sandbox.agentcheck: no gpufarm tag on them, the lease reaches them through the host's `ir:` tag),
the sandbox evaluates the monitors on its clock, the idle webhook takes the `ir,host` scope, and the requester is
warned once, with links that open locally: the incident page and the metrics explorer."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_farm import EXAMPLE_FARM, driven

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import CAROL
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration


@pytest.fixture
def agent_farm(local: LocalEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalFarm]:
    """The example farm with its AWS pool on the Datadog Agent, set up as `gpufarm local` does."""
    path = tmp_path / "farm.yaml"
    path.write_text(EXAMPLE_FARM.read_text().replace("metrics_source: gpufarm-node", "metrics_source: datadog-agent"))
    with driven(local, path) as farm:
        yield farm


def test_an_agent_pool_lease_is_warned_from_agent_metrics_and_its_links_open(agent_farm: LocalFarm) -> None:
    farm = agent_farm
    names = [m["name"] for m in farm.get("/_sandbox/state")["monitors"]["monitors"]]
    assert "[gpufarm] no GPU activity (cloud-aws)" in names, names
    farm.slash(CAROL, "request 8 A100 project=asr team=speech env=cloud-aws")
    assert farm.settle()
    ir = ir_in(farm.messages(user=CAROL.id, kind="response", contains="IR-")[-1]["text"])
    assert ir is not None
    lease = farm.allocation(ir)
    assert lease.phase is Phase.ALLOCATED and tuple(lease.hosts) == ("aws-p4d-01",)

    # The hour of the Agent's check on the lease's host: every GPU held by a process doing nothing. The monitors
    # judge the group once it has had a whole window of data (a few evaluations).
    now = int(_clock(farm))
    check = agentcheck.AgentGpuCheck("aws-p4d-01", "A100")
    api_key = farm.host.env["DD_API_KEY"]
    agentcheck.push(farm.base_url, api_key, check.series(agentcheck.Activity.held(), range(now - 3540, now + 1, 60)))
    for _ in range(3):
        farm.post("/_sandbox/clock", {"advance": 60})
        assert farm.settle()
    assert farm.wait_for(lambda: farm.allocation(ir).phase is Phase.IDLE_WARNED, timeout=20)

    events = [e for e in farm.get("/_sandbox/monitors/events")["events"] if e["notified"]]
    assert {(e["group"], e["transition"]) for e in events} == {(f"ir:ir-{ir},host:aws-p4d-01", "Triggered")}
    [warning] = farm.messages(user=CAROL.id, kind="dm", contains="has been idle")
    text = _text(warning)
    assert "aws-p4d-01" in text
    links = re.findall(r"<(http[^|>]+)\|", text)
    incident = next(u for u in links if "/incidents/" in u)
    assert incident == f"{farm.base_url}/incidents/{ir}"
    status, page = _open(incident)
    assert status == 200 and f"IR-{ir}" in page and "idle-warned" in page
    assert "Triggered" in page and "is idle and will be reclaimed" in page, page  # the monitor's alert and the DM
    # The metrics link shows the series this pool's monitors read: the Agent check's, by the host's ir tag.
    explorer = next(u for u in links if "/metric/explorer" in u)
    assert "exp_metric=gpu.sm_active" in explorer and f"exp_scope=ir:ir-{ir}" in explorer
    status, page = _open(explorer)
    assert status == 200 and "<svg" in page and "host:aws-p4d-01" in page


def _text(message: dict[str, Any]) -> str:
    parts = [message.get("text", "")]
    parts += [str((block.get("text") or {}).get("text", "")) for block in message.get("blocks", [])]
    # The lease's links are a context block (gpufarm.core.chat.messages.lease_links).
    parts += [str(e.get("text", "")) for block in message.get("blocks", []) for e in block.get("elements") or []]
    return "\n".join(parts)


def _open(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


def _clock(farm: LocalFarm) -> float:
    state: Any = farm.get("/_sandbox/clock")
    return float(state["now"])
