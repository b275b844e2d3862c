"""Demo stage "budget": a budget in money crosses 80 %, is told once with its forecast, and `/gpu budget` shows it.

The stage runs on a copy of the farm file (gpufarm_sandbox.demo.farm_copy) with nlp's channel set to the research
channel, the HPC pool's H100 priced (the farm's own price when it has one), and a month's budget in money for nlp's
project `budget-demo` sized so that 8 H100 held for two hours burn 85 % of it (a project no other stage uses, so the
figures are this stage's alone). Alice asks for 8 H100 for a day: more than the budget has left, so the request
goes to an operator, and Dana approves it. Two hours on (the agent reporting the GPUs busy every ten minutes, the
sandbox clock moved with it), the scheduled sync finds 50 and 80 % crossed and queues one alert in nlp's budget
group; it reaches the team's channel and the operators' channel once, naming 80 %, with the forecast sentence and
the top lease. The next sync tells nothing more. `/gpu budget nlp` prints the burn, the forecast and what the live
lease will cost to its end; Alice then releases the lease.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.demo.farm_copy import changed_farm
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.example_farm import ALICE, DANA, OPERATORS_CHANNEL, RESEARCH_CHANNEL

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

PROJECT = "budget-demo"
POOL, MODEL = "onprem-hpc", "H100"
PRICE = Decimal("2.50")  # per GPU-hour, when the farm file prices no H100 on the HPC pool
GPUS, HOURS, SHARE = 8, 2, Decimal("0.85")
REQUEST = f"request {GPUS} {MODEL} project={PROJECT} team=nlp env={POOL} days=1 purpose=budget-alert"
STEP_S = 600


def _budgeted(priced: dict[str, Any]) -> Any:
    """The farm copy's change: nlp's channel, the pool's H100 priced, the project's budget in money."""

    def change(farm: dict[str, Any]) -> None:
        farm["teams"]["nlp"]["channel"] = RESEARCH_CHANNEL
        rates = farm.setdefault("rates", {})
        rates.setdefault("currency", "USD")
        pool = rates.setdefault("environments", {}).setdefault(POOL, {})
        prices = pool.setdefault("per_gpu_hour", {})
        prices.setdefault(MODEL, float(PRICE))
        price = Decimal(str(prices[MODEL]))
        amount = (price * GPUS * HOURS / SHARE).quantize(Decimal("0.01"))
        budget = {"team": "nlp", "project": PROJECT, "period": "month", "amount": float(amount)}
        farm["budgets"] = [*farm.get("budgets", []), budget]
        priced.update(currency=rates["currency"], price=price, amount=amount)

    return change


def run(ctx: DemoContext) -> None:
    """Hold a lease past 80 % of its project's budget in money; the alert told once; `/gpu budget` printed."""
    if ctx.local is None:
        ctx.check(False, "the budget stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    priced: dict[str, Any] = {}
    with changed_farm(_budgeted(priced)):
        farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
        try:
            ctx.info(
                f"nlp/{PROJECT}: a month's budget of {priced['currency']} {priced['amount']:,} "
                f"({MODEL} on {POOL} at {priced['currency']} {priced['price']} a GPU-hour)"
            )
            ir = _hold(ctx, farm)
            if ir is not None:
                _alert_once(ctx, farm, ir)
                _budget_command(ctx, farm, ir)
                farm.slash(ALICE, f"release IR-{ir} now")
                farm.settle()
                ctx.check(farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED), f"IR-{ir} is released")
        finally:
            farm.close()


def _busy(ir: int, host: str, start: int) -> list[dict[str, Any]]:
    return [
        {
            "metric": "gpufarm.ir.gpus_busy",
            "type": 3,
            "points": [{"timestamp": t, "value": float(GPUS)} for t in range(start, start + STEP_S, 60)],
            "tags": [f"gpu_ir:ir-{ir}", f"ir:ir-{ir}", f"environment:{POOL}"],
            "resources": [{"name": host, "type": "host"}],
        }
    ]


def _hold(ctx: DemoContext, farm: LocalFarm) -> int | None:
    ir = _approved(ctx, farm)
    if ir is None:
        return None
    with ctx.step(f"the lease holds its {GPUS} H100 busy for {HOURS} hours"):
        [host, *_] = farm.allocation(ir).hosts
        for _ in range(HOURS * 3600 // STEP_S):
            now = int(float(farm.get("/_sandbox/clock")["now"]))
            agentcheck.push(farm.base_url, farm.host.env["DD_API_KEY"], _busy(ir, host, now))
            farm.post("/_sandbox/clock", {"advance": STEP_S})
            farm.settle()
        ctx.check(farm.allocation(ir).phase is Phase.ALLOCATED, f"IR-{ir} still holds its GPUs")
    return ir


def _approved(ctx: DemoContext, farm: LocalFarm) -> int | None:
    ir: int | None = None
    with ctx.step(
        f"{ALICE.name} asks for {GPUS} {MODEL} for a day: more than the budget has left, an operator decides"
    ):
        farm.slash(ALICE, REQUEST)
        farm.settle()
        answers = farm.messages(user=ALICE.id, kind="response", contains=f"/{PROJECT}`")
        ir = ir_in(answers[-1]["text"]) if answers else None
        if not ctx.check(ir is not None, "the request has an IR") or ir is None:
            return None
        card = [m for m in farm.messages(channel=OPERATORS_CHANNEL) if f"IR-{ir}" in shown(m)]
        ctx.check(
            bool(card) and bool(_budget_reason(shown(card[0]))),
            f"IR-{ir} goes to the operators with the budget's numbers",
            _budget_reason(shown(card[0]))[:200] if card else "",
        )
        farm.slash(DANA, f"approve IR-{ir}")
        farm.settle()
        allocated = farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED)
        if not ctx.check(allocated, f"IR-{ir} is allocated"):
            return None
    return ir


def _budget_reason(text: str) -> str:
    """The budget's part of the operators' card: `nlp/budget-demo's budget for 2026-12 has ...`."""
    start = text.find(f"nlp/{PROJECT}'s budget for")
    return text[start : text.find(";", start)] if start >= 0 else ""


def _alerts(farm: LocalFarm, channel: str, percent: int) -> list[dict[str, Any]]:
    """The budget's alerts at `percent` posted in `channel`."""
    said = f"nlp/{PROJECT}'s budget for 20"
    return [
        m
        for m in farm.messages(channel=channel)
        if said in m.get("text", "") and f"passed {percent} %" in m.get("text", "")
    ]


def _sync(ctx: DemoContext, farm: LocalFarm) -> list[str]:
    """One scheduled sync, settled; the alerts it sent for the stage's budget."""
    report: dict[str, Any] = ctx.local.host.invoke("QuotaSyncFunction", {"job": "quota_sync"})
    farm.settle()
    return [s for s in report.get("budget_alerts", []) if s.startswith(f"nlp/{PROJECT} ")]


def _alert_once(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step("past 80 %, the syncs told the team's channel and the operators once, with a forecast"):
        # The local host's schedule ran the sync every five minutes of the clock; one more now, as it would.
        _sync(ctx, farm)
        team, ops = _alerts(farm, RESEARCH_CHANNEL, 80), _alerts(farm, OPERATORS_CHANNEL, 80)
        told = team[0].get("text", "") if team else ""
        ctx.check(len(team) == 1, "nlp's channel is told 80 % once", told.split(". ")[0])
        ctx.check(len(ops) == 1, "the operators' channel is told 80 % once")
        ctx.check(
            len(_alerts(farm, RESEARCH_CHANNEL, 50)) == 1 and len(_alerts(farm, OPERATORS_CHANNEL, 50)) == 1,
            "50 % was told once before it",
        )
        sentence = next((p for p in told.split(". ") if "at this rate" in p or "has run out" in p), "")
        ctx.check(bool(sentence), "the alert carries the forecast", sentence)
        lines = shown(team[0]).split("•") if team else []
        lease = next((ln.strip() for ln in lines if f"IR-{ir}" in ln), "")
        ctx.check(bool(lease), "and the top lease", lease.split(" Told once")[0])
    with ctx.step("the next sync tells nothing more"):
        farm.post("/_sandbox/clock", {"advance": 300})
        again = _sync(ctx, farm)
        ctx.check(
            not again
            and len(_alerts(farm, RESEARCH_CHANNEL, 80)) == 1
            and len(_alerts(farm, OPERATORS_CHANNEL, 80)) == 1,
            "no second alert: the thresholds told are recorded in the budget period's incident",
        )


def _budget_command(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step(f"{ALICE.name} types /gpu budget nlp"):
        farm.slash(ALICE, "budget nlp")
        farm.settle()
        answer = farm.answer(ALICE, f"{PROJECT}")
        text = shown(answer)
        for line in (answer or {}).get("text", "").splitlines():
            if line.strip():
                ctx.info(line)
        ctx.check(f"`nlp/{PROJECT}`" in text and "%" in text, "the burn, the budget and the percent")
        ctx.check("at this rate" in text or "has run out" in text, "the forecast")
        ctx.check(f"IR-{ir}" in text and "until" in text, f"what IR-{ir} will cost to its end")
        farm.slash(ALICE, "budget ghosts")
        farm.settle()
        refused = shown(farm.answer(ALICE, "unknown team"))
        ctx.check("unknown team 'ghosts'" in refused, "bad input is a clear error, nothing read", refused[:100])
