"""The daily digest end to end on the local host: the quarter-hour schedule fires DailyDigestFunction at the farm's
digest time, the scheduled time filled into its Input, and the digest reaches the operators' channel with each
lease linked to its incident."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import ModuleType

import pytest

from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo import digest_stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, BOB, OPERATORS_CHANNEL

pytestmark = pytest.mark.integration


def _next_digest_time(now: float) -> float:
    """The example farm's next digest time (08:00 UTC) after `now`."""
    moment = datetime.fromtimestamp(now, UTC)
    slot = moment.replace(hour=8, minute=0, second=0, microsecond=0)
    if slot <= moment:
        slot += timedelta(days=1)
    return slot.timestamp()


def test_the_schedule_posts_the_digest_at_its_time_with_linked_leases(farm: LocalFarm) -> None:
    # One lease within quota, and a request past it that waits for an operator.
    farm.slash(ALICE, "request 8 H100 project=llm-ko team=nlp env=onprem-hpc")
    farm.slash(BOB, "request 16 H100 project=vit team=vision env=onprem-hpc")
    assert farm.settle()
    waiting = [
        ir
        for ir in (ir_in(m["text"]) for m in farm.messages(user=BOB.id, kind="response", contains="IR-"))
        if ir is not None
    ]
    assert waiting, farm.messages(user=BOB.id)
    before = len(farm.messages(channel=OPERATORS_CHANNEL, contains="GPU farm digest"))

    # A minute before the digest time nothing is posted; the quarter-hour tick at the digest time posts it.
    now = float(farm.get("/_sandbox/clock")["now"])
    farm.post("/_sandbox/clock", {"advance": _next_digest_time(now) - now - 60})
    assert farm.settle()
    assert len(farm.messages(channel=OPERATORS_CHANNEL, contains="GPU farm digest")) == before
    # Busy GPUs on a host no lease claims, as the sync's ledger gauge says, an hour before the digest.
    point = int(_next_digest_time(now)) - 3600
    gauge = {
        "metric": "gpufarm.ledger.gpus.unattributed",
        "type": 3,
        "points": [{"timestamp": point, "value": 2.0}],
        "tags": ["host:ghost-01", "team:nlp", "environment:onprem-hpc"],
    }
    agentcheck.push(farm.base_url, farm.host.env["DD_API_KEY"], [gauge])
    farm.post("/_sandbox/clock", {"advance": 90})
    assert farm.wait_for(
        lambda: len(farm.messages(channel=OPERATORS_CHANNEL, contains="GPU farm digest")) > before, timeout=30
    )
    assert farm.settle()
    digests = farm.messages(channel=OPERATORS_CHANNEL, contains="GPU farm digest")
    assert len(digests) == before + 1  # one tick, one digest
    shown = digests[-1]["text"] + json.dumps(digests[-1]["blocks"])
    assert "Waiting requests" in shown and "Free capacity" in shown
    assert f"/incidents/{waiting[-1]}|IR-{waiting[-1]}>" in shown
    assert "awaiting an operator" in shown
    assert "`ghost-01` (team `nlp`, `onprem-hpc`): up to 2 GPUs busy with no lease" in shown

    # The schedule says it fired with the scheduled time the function decided on.
    state = farm.get("/_local/state")
    [schedule] = [s for s in state["schedules"] if s["function"] == "DailyDigestFunction"]
    assert schedule["expression"] == "cron(0/15 * * * ? *)" and schedule["fired"] >= 1


def test_the_demo_stage_checks_the_digest_against_the_incidents(
    farm: LocalFarm, run_stage: Callable[[ModuleType], str]
) -> None:
    farm.slash(BOB, "request 16 H100 project=vit team=vision env=onprem-hpc")
    assert farm.settle()
    output = run_stage(digest_stage)
    assert "[ok ] a line for each waiting request: 1 waiting" in output
    assert "[ok ] every waiting and warned lease links to its incident" in output
