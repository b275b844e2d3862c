"""The enforcement demo stage on the local host: a lease on the Kubernetes pool labels and taints its host's Node on
the sandbox's Node endpoints, and its release cleans both; against a real local Slurm the lease's reservation
appears, a job of the lease's user runs in it, another user's is refused, and after the release the node is free.
Without Slurm the stage says so, runs the Kubernetes half and fails nothing."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox import slurmlocal
from gpufarm_sandbox.demo import enforce_stage as stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm

pytestmark = pytest.mark.integration


KUBE_FACTS = (
    "the allocation DM gives the toleration and node selector",
    "is labelled gpufarm.io/ir=ir-",
    "is tainted gpufarm.io/lease=ir-",
    "label and taint are gone",
)


def _ok(output: str, fact: str) -> bool:
    return any(line.strip().startswith("[ok ]") and fact in line for line in output.splitlines())


def test_a_lease_on_a_slurm_pool_is_a_reservation_its_user_runs_in(
    run_stage: Callable[[ModuleType], str], farm: LocalFarm
) -> None:
    output = run_stage(stage)
    assert all(_ok(output, fact) for fact in KUBE_FACTS), output
    if slurmlocal.missing():
        assert "Slurm enforcement skipped" in output, output
        pytest.skip(f"the stage ran without Slurm: {slurmlocal.missing()}")
    for fact in (
        "the allocation DM says how to submit",
        "is active on",
        "daemon's job in gpufarm-ir-",
        "nobody's job is refused",
        "is reclaimed in Datadog",
        "is gone",
        "nobody's job runs on",
    ):
        assert any(line.strip().startswith("[ok ]") and fact in line for line in output.splitlines()), output
    assert "ReservationName=gpufarm-ir-" in output and "Users=daemon" in output, output
    live = [a for a in farm.incidents() if a.state.value != "resolved"]
    assert live == [], [a.ir_label for a in live]


def test_without_slurm_the_stage_says_so_and_fails_nothing(
    run_stage: Callable[[ModuleType], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurmlocal, "missing", lambda: "Slurm is not installed (slurmctld missing)")
    output = run_stage(stage)
    assert "Slurm enforcement skipped: Slurm is not installed (slurmctld missing)" in output, output
    assert "[FAIL]" not in output
    assert all(_ok(output, fact) for fact in KUBE_FACTS), output
