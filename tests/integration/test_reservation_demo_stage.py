"""The reservation demo stage on the local host: two windows booked, one refused with the nearest window, both
honoured at their start in accelerated time, the idle one released as a no-show, the histories as `/gpu status`
prints them."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import reservation_stage as stage

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
def test_booked_refused_honoured_and_a_no_show_released(run_stage: Callable[[ModuleType], str]) -> None:
    output = run_stage(stage)
    for fact in (
        "bob's booking is an incident in phase reserved, its window in its fields",
        "alice's booking is an incident in phase reserved, its window in its fields",
        "refused, with the nearest window that would fit",
        "allocated at its start until its window ends",
        "released as a no-show",
        "its history says why, with the numbers",
        "stays: its GPUs were busy",
    ):
        assert fact in output, output
    assert "[no-show]" in output and "Reserved window:" in output
