"""The slicing demo stage on the local host: two leases on one MIG host, attributed from gpu_assign tags alone;
the idle one is warned and reclaimed through the monitors `datadog apply` makes, the busy one untouched; a real
process squatting the busy one's slice is told once and stopped by SIGTERM after the pool's stop-after grace."""

from __future__ import annotations

import pytest

from gpufarm.config import Settings
from gpufarm_sandbox.demo import slicing_stage as stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.example_farm import BOB
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration


def _context(local: LocalEnv, lines: list[str]) -> DemoContext:
    return DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append, local=local)


def test_only_the_idle_slice_s_lease_is_warned_and_reclaimed(local: LocalEnv, farm: LocalFarm) -> None:
    lines: list[str] = []
    ctx = _context(local, lines)
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures == [], output
    for fact in (
        "14 gpu_unit host tags",
        "the agent attributes each slice from the host's gpu_assign tags",
        "phase reclaimed, reason idle",
        # A real process squatting the busy lease's slice: told once, a replay posts nothing, stopped after the grace.
        "one post to the operators' channel and one DM to the lease's holder",
        "the replay is answered and posts nothing",
        "the real process ended on SIGTERM",
        # A pod labelled for another lease on the same slice: in the same post, evicted under the same stop.
        "and the pod team-b/intruder-0 labelled for another lease on the same slice",
        "the pod team-b/intruder-0 was evicted (Eviction API, 201), once",
        "episode closed, stop tag lifted",
    ):
        assert f"[ok ] {fact}" in output, output
    # No alert was posted by hand: every warning followed a sandbox monitor's notification.
    events = farm.get("/_sandbox/monitors/events")["events"]
    assert any(e["notified"] and e["transition"] == "Triggered" and stage.HOST[0] in e["group"] for e in events)
    # The stage gave its leases back: the sliced host carries no lease's tags any more.
    assert not [t for t in farm.user_tags(stage.HOST[0]) if t.startswith(("gpu_assign:", "ir:"))]
    assert len(farm.messages(user=BOB.id, kind="dm", contains="nvidia.com/mig-1g.10gb")) >= 3


def test_the_stage_needs_the_local_function_host(local: LocalEnv) -> None:
    lines: list[str] = []
    ctx = DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append)
    stage.run(ctx)
    assert ctx.failures == ["the slicing stage needs the local function host (gpufarm demo starts it)"]
