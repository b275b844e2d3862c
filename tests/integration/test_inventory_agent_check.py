"""The Datadog Agent's GPU check as an inventory source through the real Datadog adapter, against the sandbox:
hosts that send only the check's series (gpufarm_sandbox.agentcheck, no gpufarm tag) are read with their GPUs and
model in one query per pool and one per sync, and one whose check fell silent is down."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.config.inventory import DatadogAgentInventory
from gpufarm.core.inventory.agent_source import AgentCheckSource
from gpufarm.core.inventory.sources import merge
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, Sandbox

pytestmark = pytest.mark.integration


class SandboxClock:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.sandbox.clock.now(), UTC)


@pytest.fixture
def gateway(dd_env: str) -> Iterator[DatadogGateway]:
    gw = DatadogGateway(Settings(max_retries=1, http_timeout=5))
    yield gw
    gw.close()


def test_agent_check_hosts_are_read_with_their_gpus_and_model_and_a_silent_one_is_down(
    sandbox: Sandbox, sandbox_url: str, gateway: DatadogGateway
) -> None:
    # The hosts carry their pool's `environment` tag (the Agent's `tags:`), and no gpufarm tag.
    for host, env in (("dd-a100-01", "cloud-aws"), ("dd-h100-02", "cloud-aws"), ("hpc-h100-09", "onprem-hpc")):
        gateway.replace_tags(host, [f"environment:{env}"])
    start = int(sandbox.clock.now())
    # dd-h100-02's Agent reports, then stops: an hour later it is inside the lookback, outside down_after_minutes.
    quiet = agentcheck.AgentGpuCheck("dd-h100-02", "H100", count=4)
    agentcheck.push(sandbox_url, DEFAULT_DD_API_KEY, quiet.series(agentcheck.IDLE, range(start - 600, start + 1, 60)))
    sandbox.clock.advance(3600)
    now = int(sandbox.clock.now())
    busy = agentcheck.AgentGpuCheck("dd-a100-01", "A100", count=8)
    agentcheck.push(
        sandbox_url, DEFAULT_DD_API_KEY, busy.series(agentcheck.Activity.busy(), range(now - 600, now + 1, 60))
    )
    other = agentcheck.AgentGpuCheck("hpc-h100-09", "H100", count=8)  # another pool's: not in this pool's scope
    agentcheck.push(sandbox_url, DEFAULT_DD_API_KEY, other.series(agentcheck.IDLE, range(now - 600, now + 1, 60)))
    sandbox.requests.clear()

    source = AgentCheckSource(
        DatadogAgentInventory(lookback_minutes=180),
        ["cloud-aws"],
        ("H100", "A100", "L4"),
        gateway,
        SandboxClock(sandbox),
        down_after_minutes=30,
    )
    reading = source.read()
    assert reading.errors == ()
    assert sorted((n.id, n.gpu_model, n.gpu_count, n.silent) for n in reading.nodes) == [
        ("dd-a100-01", "A100", 8, False),
        ("dd-h100-02", "H100", 4, True),
    ]
    # One query for the pool, one for which hosts still report: whatever the number of hosts or devices.
    assert reading.calls == 2
    assert sandbox.requests.dump()["by_endpoint"] == {"POST /api/v2/query/scalar": 2}

    ledger = merge([], [reading], now=float(now), down_after_minutes=30, environments={"cloud-aws": object()})
    assert ledger.down == ["dd-h100-02"]
    assert ledger.pools[("cloud-aws", "A100")].unregistered == 8 and ledger.pools[("cloud-aws", "H100")].down == 4
    assert ledger.no_agent == []
