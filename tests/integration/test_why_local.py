"""A reason for every wait, end to end on the local host: Slack (sandbox users) → ingress → worker → the pool's
queue → incidents; `/gpu why` and `/gpu status` answer with the reason and its numbers, and a request's idle
settings outside its pool's bounds are refused with nothing created."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, CAROL

pytestmark = pytest.mark.integration


def _answer(farm: LocalFarm, who: Any, text: str) -> str:
    """The answer to a slash command: the ingress's own (a syntax or validation error), else the worker's."""
    sent = farm.slash(who, text)
    assert sent["status"] == 200
    assert farm.settle()
    ack = str(json.loads(sent["body"])["text"]) if sent["body"] else ""
    if ack.startswith(":warning:"):
        return ack
    last = farm.messages(user=who.id, kind="response")[-1]
    return str(last["text"]) + json.dumps(last["blocks"])


def test_a_waiting_request_says_why_with_its_place_and_earliest_start(farm: LocalFarm) -> None:
    farm.slash(ALICE, "request 8 A100 project=llm-ko team=nlp env=cloud-aws")
    assert farm.settle()
    first = ir_in(farm.messages(user=ALICE.id, kind="response")[-1]["text"])
    farm.slash(CAROL, "request 8 A100 project=asr team=speech env=cloud-aws")
    assert farm.settle()
    second = ir_in(farm.messages(user=CAROL.id, kind="response")[-1]["text"])
    assert first is not None and second is not None
    assert farm.allocation(second).phase is Phase.WAITING
    assert farm.allocation(second).reason == "queued-capacity"
    told = farm.messages(user=CAROL.id, kind="dm")[-1]["text"]
    assert "1st of 1 waiting for A100: first come, first served" in told
    why = _answer(farm, CAROL, f"why IR-{second}")
    assert "Waiting for hosts: 1st of 1 waiting for A100" in why
    assert "Earliest start: no earlier than " in why
    assert "[queued-capacity]" in why
    status = _answer(farm, CAROL, f"status IR-{second}")
    assert "Why: 1st of 1 waiting for A100; no room in the pool" in status


def test_idle_settings_outside_the_pools_bounds_are_refused_and_nothing_is_created(farm: LocalFarm) -> None:
    # Refused by the ingress itself, before anything is handed off: no incident, no IR.
    answer = _answer(farm, ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc idle=5h")
    assert "idle= in onprem-hpc is between 30 and 240 minutes, not 300" in answer
    assert ir_in(answer) is None
    chosen = _answer(farm, ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc idle=2h grace=30m")
    ir = ir_in(chosen)
    assert ir is not None
    lease = farm.allocation(ir)
    assert (lease.idle_window_minutes, lease.idle_grace_minutes) == (120, 30)
