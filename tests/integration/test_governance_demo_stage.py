"""The governance demo stage on the local host: a reject with its reason, a lease kept to its maximum and then
reclaimed, an operator exemption, and the lease's whole history as `/gpu status` prints it."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import governance_stage as stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm

pytestmark = pytest.mark.integration


def test_reject_reasons_bounded_keeps_exemptions_and_the_history(
    run_stage: Callable[[ModuleType], str], farm: LocalFarm
) -> None:
    output = run_stage(stage)
    for fact in (
        "the team's holdings against its quota",
        "the requester reads who and why",
        "the card now says who decided and why",
        "Keep refused: why and whom to ask",
        "reclaimed, reason idle",
        "a researcher cannot exempt a lease",
        "no warning, no reclaim while exempt",
        "every step is there, with who and when",
    ):
        assert f"[ok ] {fact}" in output, output
    live = [a for a in farm.incidents() if a.state.value != "resolved"]
    assert live == [], [a.ir_label for a in live]
