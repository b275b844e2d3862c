"""The fair-share demo stage on the local host: with the cloud pool ordering by fair share, speech's newer request
is served before nlp's older one because nlp used its share, and every position and `/gpu why` say why."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import fairshare_stage as stage

pytestmark = pytest.mark.integration

FACTS = (
    "both wait: the pool is full",
    "nlp used more of its share this week than speech",
    "speech's newer request is 1st",
    "nlp's older request is 2nd",
    "got the host",
    "still waits",
    "/gpu why gives its place and earliest start",
    "the reason on record: queued-capacity",
)


def test_the_team_below_its_share_is_served_first(run_stage: Callable[[ModuleType], str]) -> None:
    output = run_stage(stage)
    for fact in FACTS:
        assert any(line.strip().startswith("[ok ]") and fact in line for line in output.splitlines()), (fact, output)
