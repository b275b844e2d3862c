"""The quota change demo stage on the local host: a bad change refused, a change approved from the operators' card,
applied at once, shown in /gpu quota and ended on its own."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import quota_change_stage as stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm

pytestmark = pytest.mark.integration


def test_a_quota_change_is_refused_approved_applied_and_ends(
    run_stage: Callable[[ModuleType], str], farm: LocalFarm
) -> None:
    output = run_stage(stage)
    for fact in (
        "the answer says what is wrong",
        "no incident was created",
        "the card: the change and the team's use",
        "in effect, approved by dana",
        "/gpu quota shows the new quota",
        "approved by policy",
        "the change has ended on its own",
        "/gpu quota is back to the farm file's",
        "its history: approved by whom, ended",
    ):
        assert f"[ok ] {fact}" in output, output
    live = [a for a in farm.incidents() if a.state.value != "resolved"]
    assert live == [], [a.ir_label for a in live]
