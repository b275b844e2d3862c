"""Demo stage "fair share": a fair-share queue serves the team that used less of its share first, and every wait
says why.

Played through Slack against a copy of config/farm.example.yaml whose cloud pool orders its queue by fair share
(`scheduling.environments.cloud-aws.queue: fair-share`, a 7-day usage window). The pool's one A100 host goes to
alice (nlp); six hours pass on the accelerated sandbox clock, so nlp has used 48 GPU-hours more of its share. alice asks
again (beyond nlp's quota, dana approves it) and waits; then carol (speech, nothing used) asks and waits too. In
FIFO order alice's older request would be next; here `/gpu list all` shows carol's first, each position with the
teams' GPU-hours against their shares, and when alice releases the host carol's newer request gets it. `/gpu why`
explains alice's wait with its place and the earliest start, `/gpu status` shows the reason on record.
Everything taken is given back.
"""

from __future__ import annotations

import math
import re
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox.demo.farm_copy import changed_farm
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE, CAROL, DANA, Person

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

POOL = "cloud-aws"
HOURS_USED = 6
ASK = "request 8 A100 project={project} team={team} env=cloud-aws days=1"
# `nlp used 48 of its 672 GPU-hour share`: a team's standing as a position says it (gpufarm.core.leases.ordering).
USED_RE = re.compile(r"\b([a-z][a-z0-9-]*) used ([0-9]+) of its [0-9]+ GPU-hour share")


def fair_share_farm() -> AbstractContextManager[None]:
    """The local functions read a copy of their farm file whose cloud pool orders by fair share (the original is
    read again afterwards)."""

    def change(farm: dict[str, Any]) -> None:
        farm["scheduling"] = {"environments": {POOL: {"queue": "fair-share", "usage_window_days": 7}}}

    return changed_farm(change)


def run(ctx: DemoContext) -> None:
    """Two teams wait for one host; the one below its share is served first, and each position says why."""
    if ctx.local is None:
        ctx.check(False, "the fair-share stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    taken: list[int] = []
    try:
        with fair_share_farm():
            _play(ctx, farm, taken)
    finally:
        for ir in taken:
            if farm.allocation(ir).state.value != "resolved":
                farm.slash(DANA, f"release IR-{ir} now")
        farm.settle()
        farm.close()


def _ask(ctx: DemoContext, farm: LocalFarm, who: Person, team: str, project: str) -> int | None:
    farm.slash(who, ASK.format(project=project, team=team))
    farm.settle()
    answers = [m for m in farm.messages(user=who.id, kind="response") if "A100" in m["text"]]
    ir = ir_in(answers[-1]["text"]) if answers else None
    ctx.check(ir is not None, f"{who.name} ({team}) asked for 8 A100 in {POOL}", f"IR-{ir}")
    return ir


def _answer(farm: LocalFarm, who: Person, text: str) -> str:
    farm.slash(who, text)
    farm.settle()
    answers = farm.messages(user=who.id, kind="response")
    return str(answers[-1]["text"]) if answers else ""


def _play(ctx: DemoContext, farm: LocalFarm, taken: list[int]) -> None:
    with ctx.step(f"nlp holds the cloud pool's one A100 host for {HOURS_USED} hours"):
        first = _ask(ctx, farm, ALICE, "nlp", "llm-ko")
        if first is None:
            return
        taken.append(first)
        ctx.check(farm.allocation(first).phase is Phase.ALLOCATED, f"IR-{first} holds {farm.allocation(first).hosts}")
        farm.post("/_sandbox/clock", {"advance": HOURS_USED * 3600})
        farm.settle()
    with ctx.step("nlp asks again (an operator approves it) and waits; speech asks later and waits too"):
        older = _ask(ctx, farm, ALICE, "nlp", "llm-ko-2")
        if older is None:
            return
        taken.append(older)
        if farm.allocation(older).phase is Phase.REQUESTED:
            farm.slash(DANA, f"approve IR-{older}")
            farm.settle()
        newer = _ask(ctx, farm, CAROL, "speech", "asr")
        if newer is None:
            return
        taken.append(newer)
        ctx.check(
            farm.allocation(older).phase is Phase.WAITING and farm.allocation(newer).phase is Phase.WAITING,
            "both wait: the pool is full",
        )
        listed = _answer(farm, DANA, "list all")
        for line in listed.splitlines():
            if f"IR-{older}" in line or f"IR-{newer}" in line:
                ctx.info("   " + line.strip())
        used = {team: float(n) for team, n in USED_RE.findall(listed)}
        # Earlier stages may have used the pool too: what counts is that nlp used more of its share than speech.
        ctx.check(
            used.get("nlp", 0.0) >= 8 * HOURS_USED and used.get("nlp", 0.0) > used.get("speech", math.inf),
            "nlp used more of its share this week than speech",
            f"nlp {used.get('nlp')}, speech {used.get('speech')} GPU-hours",
        )
        ctx.check(
            f"IR-{newer} waiting" in listed and "(1st of 2 waiting for A100: speech used" in listed,
            "speech's newer request is 1st",
        )
        ctx.check("(2nd of 2 waiting for A100: nlp used" in listed, "nlp's older request is 2nd")
    with ctx.step("nlp releases the host: the pool serves speech first"):
        farm.slash(ALICE, f"release IR-{first} now")
        farm.settle()
        served = farm.wait_for(lambda: farm.allocation(newer).phase is Phase.ALLOCATED, timeout=20)
        ctx.check(served, f"speech's IR-{newer} got the host", str(farm.allocation(newer).hosts))
        ctx.check(farm.allocation(older).phase is Phase.WAITING, f"nlp's older IR-{older} still waits")
        why = _answer(farm, ALICE, f"why IR-{older}")
        for line in why.splitlines():
            ctx.info("   " + line.strip())
        ctx.check("Earliest start: no earlier than" in why, "/gpu why gives its place and earliest start")
        ctx.check(farm.allocation(older).reason == "queued-capacity", "the reason on record: queued-capacity")
