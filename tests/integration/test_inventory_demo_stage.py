"""The inventory demo stage on the local host: gpufarm's AWS and Azure sources read the simulated clouds (moto, a
stubbed Azure transport); a cloud instance without an agent is reported, a throttled source is skipped while the
others sync, and the ledger is printed from the gauges the sync sent."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import inventory_stage as stage

pytestmark = pytest.mark.integration


def test_no_agent_instances_and_a_skipped_source_are_reported(run_stage: Callable[[ModuleType], str]) -> None:
    output = run_stage(stage)
    for fact in (
        "the EC2 instance without an agent is reported",
        "only Azure is skipped",
        "no host tag changed because a source was unreachable",
        "the EC2 P-family vCPU quota of us-east-1 is published",
        "the skipped source is a Datadog event, grouped by source",
        "vision/ledger-demo's H100 line: allocated 8, used 6, idle 2, none unmeasured",
    ):
        assert f"[ok ] {fact}" in output, output
    assert "cloud-aws" in output and "us-east-1" in output
