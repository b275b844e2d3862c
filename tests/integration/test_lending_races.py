"""Borrowing under a race (docs/design.md, rule 7): two requests beyond quota racing for the last idle quota a pool
lends are decided one after the other in the pool's queue group, on the local host with a slow incident API: exactly
one borrows it, the other goes to the operators, and no host is held twice."""

from __future__ import annotations

import pytest

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.handlers import runtime
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import BOB, CAROL
from gpufarm_sandbox.localhost import start_local
from gpufarm_sandbox.races import RaceFarm

pytestmark = pytest.mark.integration

LATENCY_MS = 100


def test_two_borrowers_race_for_the_last_idle_quota_and_exactly_one_borrows() -> None:
    with start_local(port=0) as env:
        farm = LocalFarm.ready(env)
        race = RaceFarm(farm, latency_ms=LATENCY_MS)
        try:
            # vision uses its own 8: of the HPC pool's idle quota only nlp's 8 are left to lend (to speech's class).
            held = farm.request_ir(BOB, "request 8 H100 project=vit team=vision env=onprem-hpc days=3")
            assert held is not None and farm.wait_for(lambda: farm.allocation(held).phase is Phase.ALLOCATED)
            race.slow()
            for project in ("asr-a", "asr-b"):
                farm.slash(CAROL, f"request 8 H100 project={project} team=speech env=onprem-hpc days=3")
            race.settle()
            race.slow(on=False)
            irs = []
            for project in ("asr-a", "asr-b"):
                found = farm.messages(user=CAROL.id, kind="response", contains=f"speech/{project}`")
                ir = ir_in(found[-1]["text"]) if found else None
                assert ir is not None, project
                irs.append(ir)
            leases = [farm.allocation(ir) for ir in irs]
            borrowed = [a for a in leases if a.borrowed]
            assert len(borrowed) == 1 and borrowed[0].borrowed == 8 and borrowed[0].phase is Phase.ALLOCATED
            other = next(a for a in leases if not a.borrowed)
            assert other.phase is Phase.REQUESTED and other.slack_message  # with the operators
            hosts = [h for a in (*leases, farm.allocation(held)) for h in a.hosts]
            assert len(hosts) == len(set(hosts))
        finally:
            farm.settle(timeout=30)
            farm.close()
            runtime.reset()
