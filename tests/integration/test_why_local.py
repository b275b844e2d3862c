"""A reason for every wait, end to end on the local host: Slack (sandbox users) → ingress → worker → the pool's
queue → incidents; `/gpu why` and `/gpu status` answer with the reason and its numbers, a request's idle settings
outside its pool's bounds are refused with nothing created, and approvals racing into a fair-share pool resolve as
a sequential order would."""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import GpuRequest
from gpufarm_sandbox.demo import fairshare_stage
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, CAROL, DANA

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


def test_racing_approvals_into_a_fair_share_pool_take_one_place_each(farm: LocalFarm) -> None:
    """Six requests for the cloud pool's one A100 host, approved at once with their webhooks fired twice: one holds
    the host, the five others wait, each with its own place in the pool's order and its reason."""
    with fairshare_stage.fair_share_farm():
        now = datetime.fromtimestamp(farm.get("/_sandbox/clock")["now"], UTC)
        incidents = []
        for n in range(6):
            team = "nlp" if n % 2 else "speech"
            req = GpuRequest(
                team=team,
                project=f"fair-race-{n}",
                gpu_model="A100",
                gpu_count=8,
                environment="cloud-aws",
                requester=ALICE.id if team == "nlp" else CAROL.id,
                request_id=f"fair-race-{n:04d}",
            )
            record = farm.gateway.create(req.title(), req.to_fields(Phase.REQUESTED, now))
            incidents.append((record.public_id, record.id))
        token = farm.host.env["GPUFARM_WEBHOOK_SECRET"]
        barrier = threading.Barrier(len(incidents) * 2)

        def approve(incident_id: str) -> None:
            barrier.wait()
            values = {f.STATE: "active", f.PHASE: Phase.APPROVED.value, f.APPROVED_BY: DANA.id}
            farm.gateway.update(incident_id, values)

        def webhook(incident_id: str) -> None:
            barrier.wait()
            body = {"incident_uuid": incident_id, "incident_status": "active", "incident_fields": {"phase": "approved"}}
            farm.post("/fn/incident_webhook/", body, {"X-Gpufarm-Token": token})

        threads = [threading.Thread(target=approve, args=(i,)) for _, i in incidents]
        threads += [threading.Thread(target=webhook, args=(i,)) for _, i in incidents]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert farm.settle(timeout=30)
        leases = [farm.allocation(ir) for ir, _ in incidents]
        assert sum(a.phase is Phase.ALLOCATED for a in leases) == 1
        waiting = [a for a in leases if a.phase is Phase.WAITING]
        assert len(waiting) == 5
        assert all(a.reason in {"queued-capacity", "queued-fair-share"} for a in waiting)
        # Each waited once: one `waiting` entry, never two writers' worth.
        assert all(sum(" waiting: " in line for line in a.history) == 1 for a in waiting)
        listed = _answer(farm, DANA, "list all").split("[{", 1)[0]  # the text, not its blocks again
        places = sorted(int(m) for m in re.findall(r"\((\d)(?:st|nd|rd|th) of 5 waiting for A100", listed))
        assert places == [1, 2, 3, 4, 5], listed
        for ir, _ in incidents:
            if farm.allocation(ir).state.value != "resolved":
                farm.slash(DANA, f"release IR-{ir} now")
        assert farm.settle()
