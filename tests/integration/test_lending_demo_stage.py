"""The lending demo stage on the local host: speech borrows nlp's unused H100, nlp asks for its quota back, the
borrower is told and reclaimed on notice after its protection window, and its history says why."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import lending_stage as stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm

pytestmark = pytest.mark.integration


def test_a_borrowed_lease_is_preempted_with_notice_after_its_protection_window(
    run_stage: Callable[[ModuleType], str], farm: LocalFarm
) -> None:
    output = run_stage(stage)
    for fact in (
        "approved by policy, 8 GPUs borrowed",
        "she is told she borrows",
        "she is told when",
        "she is told the reason, the deadline and who needs the GPUs",
        "the operators are told",
        "the borrower is reclaimed, reason preempted",
        "alice's request is allocated",
        "the notice and the end, with their reasons",
    ):
        assert f"[ok ] {fact}" in output, output
    live = [a for a in farm.incidents() if a.state.value != "resolved"]
    assert live == [], [a.ir_label for a in live]
