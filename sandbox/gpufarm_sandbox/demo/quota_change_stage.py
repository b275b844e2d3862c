"""Demo stage "quota change": a quota change asked in chat, approved, applied at once and ending on its own.

Played through Slack against config/farm.example.yaml (nlp: 8 H100 on the HPC pool, hard limit 16). alice asks for a
change for a team that does not exist and is told so, nothing created. She then asks for +8 H100 for nlp for two
days; the operators' card shows the change, what nlp holds and the pool's capacity; dana clicks Approve. At once
alice's 16 H100 are approved by policy (within the new quota of 16), and `/gpu quota nlp` lists the change with its
approver. Two days on, the sweep ends the change: `/gpu quota nlp` is back to 8. The change's history is printed as
`/gpu status` shows it. Everything taken is given back.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gpufarm.core.kernel import history
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.example_farm import ALICE, DANA, OPERATORS_CHANNEL

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

DAY_S = 24 * 3600


def run(ctx: DemoContext) -> None:
    """Refuse a bad change, approve one, use it, let it end, print its history."""
    if ctx.local is None:
        ctx.check(False, "the quota change stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    try:
        until = (datetime.fromtimestamp(ctx.sandbox.clock.now(), UTC) + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
        _refused(ctx, farm, until)
        change = _approved(ctx, farm, until)
        if change is not None:
            _used(ctx, farm)
            _ended(ctx, farm, change)
    finally:
        farm.close()


def _quota_line(farm: LocalFarm) -> str:
    farm.slash(ALICE, "quota nlp")
    farm.settle()
    text = shown(farm.answer(ALICE, "*Quotas*"))
    return next((line for line in text.splitlines() if "`nlp` H100 in `onprem-hpc`" in line), "")


def _refused(ctx: DemoContext, farm: LocalFarm, until: str) -> None:
    with ctx.step(f"{ALICE.name} asks a change for a team that does not exist: refused, nothing created"):
        before = len(farm.incidents())
        farm.slash(ALICE, f"quota request team=ghosts +8 H100 env=onprem-hpc until {until} reason=x")
        farm.settle()
        answer = shown(farm.answer(ALICE, "unknown team"))
        ctx.check("unknown team 'ghosts'" in answer, "the answer says what is wrong", answer[:100])
        ctx.check(len(farm.incidents()) == before, "no incident was created")


def _approved(ctx: DemoContext, farm: LocalFarm, until: str) -> int | None:
    with ctx.step(
        f"{ALICE.name}: /gpu quota request team=nlp +8 H100 env=onprem-hpc until {until}; {DANA.name} approves"
    ):
        farm.slash(ALICE, f'quota request team=nlp +8 H100 env=onprem-hpc until {until} reason="paper deadline"')
        farm.settle()
        ir = ir_in(shown(farm.answer(ALICE, "is with the GPU operators")))
        cards = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir}: quota change") if ir else []
        if ir is None or not cards:
            ctx.check(False, "the change reached the operators", f"IR-{ir}")
            return None
        card = shown(cards[-1])
        ctx.check("by +8 (8 → 16)" in card and "Team holds" in card, "the card: the change and the team's use")
        ctx.check("H100 free" in card, "the card: the pool's capacity", card.split("Pool", 1)[-1][:60])
        farm.click(DANA, cards[-1], "gpu_approve")
        farm.settle()
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED)
        change = farm.allocation(ir)
        ctx.check(change.phase is Phase.ALLOCATED and change.approved_by == DANA.id, "in effect, approved by dana")
        told = shown(farm.answer(ALICE, "your quota change is approved"))
        ctx.check(bool(told), f"{ALICE.name} is told", told[:120])
        line = _quota_line(farm)
        ctx.check(" / 16 (hard 24)" in line, "/gpu quota shows the new quota", line)
    return ir


def _used(ctx: DemoContext, farm: LocalFarm) -> None:
    with ctx.step(f"At once, {ALICE.name}'s 16 H100 are within nlp's quota: approved by policy"):
        ir = farm.request_ir(ALICE, "request 16 H100 project=paper team=nlp env=onprem-hpc days=1")
        if ir is None:
            ctx.check(False, "the request was answered")
            return
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED)
        lease = farm.allocation(ir)
        ctx.check(lease.approved_by == "policy", "approved by policy", ", ".join(lease.hosts))
        farm.slash(ALICE, f"release IR-{ir} now")
        farm.settle()


def _ended(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step(f"Two days on the sweep ends IR-{ir}: nlp's quota is 8 again"):
        farm.post("/_sandbox/clock", {"advance": 2 * DAY_S + 120})
        farm.settle()
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED, timeout=20)
        ctx.check(farm.allocation(ir).phase is Phase.RECLAIMED, "the change has ended on its own")
        line = _quota_line(farm)
        ctx.check(" / 8 (hard 16)" in line, "/gpu quota is back to the farm file's", line)
        farm.slash(DANA, f"status IR-{ir}")
        farm.settle()
        text = (farm.answer(DANA, "History (") or {}).get("text", "")
        ctx.check("[quota-changed]" in text and "[quota-expired]" in text, "its history: approved by whom, ended")
        ctx.shared["quota_change_history"] = text
        entries = [e for e in (history.parse(line) for line in farm.allocation(ir).history) if e is not None]
        # On the sandbox clock, for benchmarks/lending.py: asked, approved, ended, and the end it was given.
        ctx.shared["quota_change_times"] = {
            **{e.step: e.at for e in entries},
            "until": farm.allocation(ir).quota_until,
        }
        for entry in text.splitlines():
            ctx.info(entry)
