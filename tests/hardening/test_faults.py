"""The fault day (issue 8): 20 % of Datadog and Slack API calls answered 429/500/503 while researchers request,
operators approve and reject, allocations are released, extended, warned idle and expired; once the faults stop
and one sync has run, nothing is lost or doubled, no host was in two incidents, no tag is orphaned and everyone
was answered. gpufarm_sandbox.badday plays it; benchmarks/reliability.py runs 200 requests."""

from __future__ import annotations

import pytest
from attack import Target

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox.badday import FAULT_RATE, KINDS, BadDay

# Two waves of the eight kinds: each wave costs about a minute at 20 % (the adapters' bounded retries back off
# for seconds), so the hardening suite stays under five minutes on two cores.
REQUESTS = 2 * len(KINDS)


@pytest.mark.timeout(420)
def test_a_fault_day_loses_nothing_doubles_nothing_and_answers_everyone(target: Target) -> None:
    report = BadDay(target.farm, rate=FAULT_RATE, seed=8).run(REQUESTS)
    assert report.requests == REQUESTS
    assert report.faults_injected > 0
    assert report.problems == []
    assert (report.lost, report.doubled, report.hosts_in_two, report.orphan_tags, report.untold) == (0, 0, 0, 0, 0)
    assert report.told == REQUESTS
    # Which function gave up on what, should one ever land there (the count alone does not say).
    letters = target.farm.host.state().get("dead_letters", [])
    dead = [(d.get("source"), d.get("target"), d.get("error")) for d in letters]
    assert report.dead_letters == 0, dead


def test_a_fault_after_the_write_lands_the_write_and_loses_the_answer(target: Target) -> None:
    farm = target.farm
    created = farm.gateway.create(
        "GPU request: nlp/after 1xH100 (onprem-hpc)",
        {f.STATE: "active", f.PHASE: Phase.REQUESTED.value, f.TEAM: "nlp", f.PROJECT: "after"},
    )
    # One attempt, no retries: the 503 that came after the write reaches the caller.
    once = DatadogGateway(farm.settings.replace(max_retries=0))
    spec = {"rate": 1.0, "statuses": [503], "paths": f"^/api/v2/incidents/{created.id}$", "after": 1.0, "max_faults": 1}
    try:
        once.get(created.id)  # learns the incident is gpufarm's before the fault plan starts
        # The create's webhook reads the incident too: let it finish, so the one fault meets the PATCH.
        assert farm.settle(timeout=30)
        assert farm.post("/_sandbox/faults", spec)[0] == 200
        with pytest.raises(UpstreamError):
            once.update(created.id, {f.PURPOSE: "landed"})
    finally:
        farm.post("/_sandbox/faults", {})
        once.close()
    assert farm.gateway.get(created.id).fields.get(f.PURPOSE) == "landed"
