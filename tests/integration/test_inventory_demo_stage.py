"""The inventory demo stage on the local host: gpufarm's AWS and Azure sources read the simulated clouds (moto, a
stubbed Azure transport); a cloud instance without an agent is reported, a throttled source is skipped while the
others sync, and the ledger is printed from the gauges the sync sent."""

from __future__ import annotations

import pytest

from gpufarm.config import Settings
from gpufarm_sandbox.demo import inventory_stage as stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration


def test_no_agent_instances_and_a_skipped_source_are_reported(local: LocalEnv, farm: LocalFarm) -> None:
    lines: list[str] = []
    ctx = DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append, local=local)
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures == [], output
    for fact in (
        "the EC2 instance without an agent is reported",
        "only Azure is skipped",
        "no host tag changed because a source was unreachable",
        "the EC2 P-family vCPU quota of us-east-1 is published",
    ):
        assert f"[ok ] {fact}" in output, output
    assert "cloud-aws" in output and "us-east-1" in output
