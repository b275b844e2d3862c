"""Demo stage: the operators' daily digest, run by hand on the farm the earlier stages left.

DailyDigestFunction is invoked with `{"force": true}` (as an operator would with `aws lambda invoke`), so the demo's
clock does not move for it: the quarter-hour schedule that posts it at the farm's digest time is covered by
tests/integration/test_digest_local.py. The stage checks that what the digest says agrees with the incidents: one
message in the operators' channel, a waiting-request line for each request that waits and a line for each idle
warning, every lease linked to its incident; or, on a farm with nothing to say, that nothing is posted.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.leases import terms
from gpufarm_sandbox.demo.context import DemoContext
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.example_farm import OPERATORS_CHANNEL

DIGEST = "GPU farm digest"
_LINK = re.compile(r"<([^|>]+)/incidents/(\d+)\|IR-(\d+)>")


def run(ctx: DemoContext) -> None:
    """Post the digest now; check its sections against the incidents and its links against their IRs."""
    if ctx.local is None:
        ctx.check(False, "the digest stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    try:
        with ctx.step("The operators' daily digest, posted by hand (DailyDigestFunction with force)"):
            before = len(farm.messages(channel=OPERATORS_CHANNEL, contains=DIGEST))
            result: dict[str, Any] = ctx.local.host.invoke("DailyDigestFunction", {"force": True})
            live = [a for a in farm.incidents() if a.state is not State.RESOLVED]
            waiting = {a.ir for a in live if a.phase is Phase.REQUESTED or a.phase in terms.WAITING}
            warned = {a.ir for a in live if a.phase is Phase.IDLE_WARNED}
            posts = farm.messages(channel=OPERATORS_CHANNEL, contains=DIGEST)[before:]
            if not result.get("posted"):
                ctx.check(result.get("reason") == "nothing to say" and not posts, "nothing to say: nothing posted")
                return
            _check_digest(ctx, posts, result, waiting, warned)
    finally:
        farm.close()


def _check_digest(
    ctx: DemoContext, posts: list[dict[str, Any]], result: dict[str, Any], waiting: set[int], warned: set[int]
) -> None:
    """One digest, with a line and a link for each waiting request and idle warning, and free capacity; its first
    lines shown."""
    ctx.check(len(posts) == 1, "one digest in the operators' channel", str(result.get("sections")))
    shown = posts[-1]["text"] + json.dumps(posts[-1]["blocks"])
    sections: dict[str, int] = result.get("sections") or {}
    ctx.check(
        sections.get("Waiting requests", 0) == len(waiting),
        "a line for each waiting request",
        f"{len(waiting)} waiting",
    )
    ctx.check(sections.get("Idle warnings", 0) == len(warned), "a line for each idle warning", str(len(warned)))
    linked = {int(m[2]) for m in _LINK.finditer(shown) if m[2] == m[3]}
    ctx.check(
        (waiting | warned) <= linked,
        "every waiting and warned lease links to its incident",
        ", ".join(f"IR-{ir}" for ir in sorted(linked)),
    )
    ctx.check("Free capacity" in shown, "free capacity per pool beside the news")
    for block in posts[-1]["blocks"]:
        if block.get("type") == "section":
            for line in block["text"]["text"].split("\n")[:6]:
                ctx.info(line)
