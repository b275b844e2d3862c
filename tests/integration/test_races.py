"""One writer per incident and quotas under races (docs/design.md, rule 7), on the local host with a slow incident API.

Each pair of actions races on one incident and must end as some sequential order of the two would, with each
person told only what happened; a burst of concurrent requests on one team's quota never grants beyond it by
policy, nor beyond the hard limit once operators approve everything at once. The scenarios live in
gpufarm_sandbox.races; benchmarks/reliability.py runs them many more times and prints the figures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufarm.handlers import runtime
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import LocalEnv, start_local
from gpufarm_sandbox.races import SCENARIOS, RaceFarm, quota_burst, run_scenario

pytestmark = pytest.mark.integration

# CI-sized (benchmarks/reliability.py runs 100 rounds at 250 ms and a burst of 200): each round costs about two
# seconds on the local host, and a burst's cost grows with its square (every decision searches the live incidents).
ROUNDS = 3
# Enough to make the two writers' reads and writes overlap, little enough for CI on two cores.
LATENCY_MS = 100
BURST = 20
APPROVALS = 8


@pytest.fixture(scope="module")
def race() -> Iterator[RaceFarm]:
    with start_local(port=0) as env:
        yield from _race(env)


def _race(env: LocalEnv) -> Iterator[RaceFarm]:
    farm = LocalFarm.ready(env)
    try:
        yield RaceFarm(farm, latency_ms=LATENCY_MS)
    finally:
        farm.settle(timeout=30)
        farm.close()
        runtime.reset()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_writers_on_one_incident_end_as_a_sequential_order(race: RaceFarm, name: str) -> None:
    tally = run_scenario(race, name, ROUNDS)
    assert tally.rounds == ROUNDS
    assert tally.failed == 0, tally.problems


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_burst_of_requests_holds_the_quota_and_the_hard_limit(race: RaceFarm) -> None:
    # Eight approvals at once are more than the hard limit leaves room for after the policy's grants.
    burst = quota_burst(race, BURST, approvals=APPROVALS, latency_ms=0)
    assert burst.problems == []
    assert burst.granted_by_policy <= burst.quota
    assert burst.granted_by_policy < burst.granted_after_approvals <= burst.hard_limit
    # Some were approved by policy, some sent to operators, the rest refused: each requester heard which.
    assert burst.granted_by_policy > 0 and burst.to_operators > 0 and burst.refused > 0
    assert burst.answered == burst.sent
    assert burst.double_held_hosts == []
