"""Slack's retries of one slash command, overlapping the original with the incident API at 250 ms: exactly one
incident for the request (the create runs in the pool's queue group, keyed by the Slack request id), and every
answer names it."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlencode

import pytest
from attack import INGRESS_PATH, Target

from gpufarm.core.kernel.lifecycle import State
from gpufarm.handlers.slack_inputs import request_id
from gpufarm_sandbox.demo.lifecycle_stage import ir_in
from gpufarm_sandbox.example_farm import ALICE, RESEARCH_CHANNEL

INCIDENT_LATENCY_MS = 250
DEDUP_WINDOW_S = 300
DELIVERIES = 3


def _command(target: Target, text: str) -> tuple[bytes, str]:
    slack = target.local.sandbox.slack.state
    trigger_id = slack.new_trigger(ALICE.id)
    form = {
        "team_id": "T0000000001",
        "channel_id": RESEARCH_CHANNEL,
        "user_id": ALICE.id,
        "command": "/gpu",
        "text": text,
        "response_url": slack.new_sink(RESEARCH_CHANNEL, ALICE.id),
        "trigger_id": trigger_id,
    }
    return urlencode(form).encode(), trigger_id


def _deliver(target: Target, body: bytes, retry: int) -> int:
    headers = target.signed_headers(body)
    if retry:
        headers |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
    return target.post(INGRESS_PATH, body, headers).status


@pytest.mark.parametrize("round_", range(3))
def test_overlapping_retries_leave_one_live_incident_and_every_answer_names_it(target: Target, round_: int) -> None:
    farm = target.farm
    body, trigger_id = _command(target, "request 2 H100 project=llm-ko team=nlp env=onprem-hpc")
    rid = request_id("cmd", trigger_id)
    seen = len(farm.messages(user=ALICE.id))
    status, answer = farm.post("/_sandbox/faults", {"latency_ms": INCIDENT_LATENCY_MS, "paths": "^/api/v2/incidents"})
    assert status == 200, answer
    statuses: list[int] = []
    try:
        # The original and its first retry overlap (Slack re-sends while the first worker is still creating).
        threads = [threading.Thread(target=lambda n=n: statuses.append(_deliver(target, body, n))) for n in range(2)]
        for thread in threads:
            thread.start()
            time.sleep(0.1)
        for thread in threads:
            thread.join()
        assert farm.settle(timeout=60)
        # A later retry, after both have finished and past SQS's 5-minute dedup window: its create runs in the
        # group and finds the request's incident by request id.
        status, answer = farm.post("/_sandbox/clock", {"advance": DEDUP_WINDOW_S + 1})
        assert status == 200, answer
        statuses.append(_deliver(target, body, DELIVERIES - 1))
        assert farm.settle(timeout=60)
    finally:
        farm.post("/_sandbox/faults", {})
    assert statuses == [200] * DELIVERIES
    mine = [a for a in farm.incidents() if a.request_id == rid]
    live = [a for a in mine if a.state is not State.RESOLVED]
    assert len(live) == 1, [(a.ir_label, a.state, a.phase, a.title) for a in mine]
    [alive] = live
    # The overlapping deliveries queued one create between them and the later retry found its incident: no
    # duplicate was ever made (and closed).
    assert len(mine) == 1, [(a.ir_label, a.state, a.phase, a.title) for a in mine]
    # Every answer to the requester that names an incident names the live one.
    texts = [m.get("text") or "" for m in farm.messages(user=ALICE.id)[seen:]]
    named = [ir_in(text) for text in texts if ir_in(text) is not None]
    assert named and set(named) == {alive.ir}, (alive.ir, texts)
