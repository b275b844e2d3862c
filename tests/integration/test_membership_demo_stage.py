"""The membership demo stage on the local host: a foreign team refused, a whole host charged, a waiting lease that
gets its full duration from allocation, one reminder before the end."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from gpufarm_sandbox.demo import membership_stage as stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm

pytestmark = pytest.mark.integration


def test_membership_charging_and_lease_semantics_through_slack(
    run_stage: Callable[[ModuleType], str], farm: LocalFarm
) -> None:
    output = run_stage(stage)
    for fact in (
        "refused, naming her own teams",
        "no incident was created",
        "she is told what counts against the quota",
        "/gpu quota shows the 8 held",
        "answered with a confirmed Release button; nothing released yet",
        "the click released it",
        "the waiting message gives its queue position and says the days start at allocation",
        "its day counts from the allocation, not from the request",
        "a reminder DM with Extend and Release",
        "sent once (the incident records the end it was sent for)",
    ):
        assert f"[ok ] {fact}" in output, output
    # Everything the stage took is given back: the pools are as the stages after it expect.
    live = [a for a in farm.incidents() if a.state.value != "resolved"]
    assert live == [], [a.ir_label for a in live]


def test_a_request_while_slack_cannot_say_who_is_in_the_team_is_refused_with_a_retry_hint(farm: LocalFarm) -> None:
    from gpufarm_sandbox.example_farm import ALICE

    before = len(farm.incidents())
    status, _ = farm.post(
        "/_sandbox/faults", {"rate": 1.0, "statuses": [408], "paths": "^/slack/api/usergroups.users.list"}
    )
    assert status == 200
    try:
        farm.slash(ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=2")
        assert farm.settle()
    finally:
        farm.post("/_sandbox/faults", {"rate": 0.0})
    told = [m["text"] for m in farm.messages(user=ALICE.id, kind="response")]
    assert told and "Slack could not say who" in told[-1] and "try again in a minute" in told[-1], told
    assert len(farm.incidents()) == before  # never approved on unknown membership: nothing was created
