"""The Slack page in a real browser: headless Chromium on the local host's `/slack` walks a lease's life the way a
person would (gpufarm_sandbox.slackwalk): bob asks for help (an answer he alone sees), fills the request form (a
bad project refused on its field), dana approves on the operators' card, bob reads
the allocation DM, clicks Keep on the idle warning and releases from the App Home tab. Every step went through the
ingress as Slack would send it; the page raised no console error. Its screenshots and step times are kept under
.artifacts/slack/ (the CI's artefacts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_chromium import installed_chromium

from gpufarm.core.kernel.lifecycle import ReclaimReason
from gpufarm_sandbox.browser import chromium
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.example_farm import BOB, DANA
from gpufarm_sandbox.slackwalk import walk

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts" / "slack"


def test_a_lease_is_walked_through_on_the_slack_page(farm: LocalFarm) -> None:
    binary = installed_chromium()
    with chromium(binary, width=1280, height=860) as browser:
        done = walk(browser.page, farm)
        errors = browser.console_errors
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, png in done.screenshots.items():
        (ARTIFACTS / f"{name}.png").write_bytes(png)
    (ARTIFACTS / "walk.json").write_text(json.dumps({"ir": done.ir, "steps": done.steps}, indent=2))

    assert errors == []
    assert done.ir is not None
    lease = farm.allocation(done.ir)
    assert lease.reclaim_reason is ReclaimReason.RELEASED and lease.approved_by == DANA.id and lease.keep_count == 1
    # Each command and click reached the ingress signed, as Slack sends them; each Home opening as an event.
    deliveries = farm.get("/_sandbox/state")["slack"]["deliveries"]
    kinds = [(d["kind"], d["user"], d["status"]) for d in deliveries]
    assert ("command", BOB.id, 200) in kinds and ("block_actions", DANA.id, 200) in kinds
    assert ("event:app_home_opened", BOB.id, 200) in kinds and ("view_submission", BOB.id, 200) in kinds
    assert all(d["status"] == 200 for d in deliveries), deliveries
    assert all(png.startswith(b"\x89PNG") for png in done.screenshots.values())


def test_a_forged_click_is_refused_by_the_ingress_as_from_slack(farm: LocalFarm) -> None:
    # What the page sends reaches the ingress signed; the same body with no or a wrong signature is refused.
    status, body = farm.post("/fn/slack_ingress/", {"type": "event_callback"})
    assert status == 401 and body == {"error": "invalid signature"}
    # A click on a button the message does not have is not sent at all: Slack's client could not send it.
    farm.slash(BOB, "help")
    assert farm.settle()
    [shown] = farm.messages(user=BOB.id, kind="ack")
    status, body = farm.post(
        "/_sandbox/slack/interactions",
        {
            "type": "block_actions",
            "user": BOB.id,
            "url": farm.base_url + "/fn/slack_ingress/",
            "channel": shown["channel"],
            "message_ts": shown["ts"],
            "action_id": "gpu_approve",
            "value": "IR-1",
        },
    )
    assert status == 400 and "no element with action_id gpu_approve" in json.dumps(body)
