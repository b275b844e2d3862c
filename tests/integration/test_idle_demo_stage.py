"""The idle demo stage on the local host: reclaim of an idle lease for a waiting request, an expiry, and a half-idle
two-host lease losing its idle host, from the node agent's metrics through the monitors `datadog apply` makes; a
missing step fails the stage."""

from __future__ import annotations

import pytest

from gpufarm.config import Settings
from gpufarm_sandbox.demo import idle_stage as stage
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, actions
from gpufarm_sandbox.localhost import LocalEnv

pytestmark = pytest.mark.integration


def _context(local: LocalEnv, lines: list[str]) -> DemoContext:
    return DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append, local=local)


def test_idle_lease_is_reclaimed_for_the_waiting_request_a_lease_expires_and_a_half_idle_lease_shrinks(
    local: LocalEnv, farm: LocalFarm
) -> None:
    lines: list[str] = []
    ctx = _context(local, lines)
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures == [], output
    assert ctx.checks == 24, output
    facts = (
        "phase reclaimed, reason idle",
        "phase reclaimed, reason expired",
        "carol is warned in a DM",
        "warned for hpc-a-02 alone",
        "gpufarm's monitors alerted on the idle host's group only: gpu_ir:ir-3,host:hpc-a-02",
        "hpc-a-02 lost the lease's tag; hpc-a-01 keeps it",
        "later alerts for the returned host change nothing",
    )
    for fact in facts:
        assert f"[ok ] {fact}" in output, output
    # The idle lease held 8 GPUs for 7 days; reclaimed about 2 h after the allocation, nearly all of it comes back.
    assert 160 * 8 < ctx.shared["idle_gpu_hours_reclaimed"] < 168 * 8
    # The half-idle lease gave back one 8-GPU host about 2 h into its 7 days.
    assert 160 * 8 < ctx.shared["partial_gpu_hours_reclaimed"] < 168 * 8
    assert "GPU-hours reclaimed in this stage:" in output
    # The half-idle lease is released at the end: later stages find the HPC pool free.
    assert not [t for h in ("hpc-a-01", "hpc-a-02") for t in farm.ir_tags(h)]
    # No alert was posted by hand: every idle webhook call came from a sandbox monitor's notification.
    events = farm.get("/_sandbox/monitors/events")["events"]
    assert any(e["notified"] and e["transition"] == "Triggered" for e in events)


def test_a_lease_whose_job_never_stops_is_not_warned_and_the_stage_fails(
    local: LocalEnv, farm: LocalFarm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage, "BUSY_MINUTES", 10_000)
    monkeypatch.setattr(stage, "WARN_LIMIT_MIN", 120)
    lines: list[str] = []
    ctx = _context(local, lines)
    stage.run(ctx)
    output = "\n".join(lines)
    assert ctx.failures and ctx.failures[0].startswith("the idle monitors alerted"), output
    assert "reason idle" not in output
    assert not [m for m in farm.messages(kind="dm") if "gpu_keep" in actions(m)]


def test_the_stage_needs_the_local_function_host(local: LocalEnv) -> None:
    lines: list[str] = []
    ctx = DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append)
    stage.run(ctx)
    assert ctx.failures == ["the idle stage needs the local function host (gpufarm demo starts it)"]
