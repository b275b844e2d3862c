"""Demo stage "governance": a reject with its reason, a lease kept to its maximum and then reclaimed, an operator
exemption, and one lease's whole history as `/gpu status` prints it.

Played through Slack against config/farm.example.yaml (keeps: 2 of 24 h each; idle grace 60 minutes). alice holds
8 H100 on the HPC pool; her second request, beyond nlp's quota, reaches the operators on a card that shows the
pool's free GPUs, what nlp holds and how busy it has been over 7 days, and her other lease; dana clicks Reject,
types why in the form it opens, and alice reads "rejected by @dana: <reason>". Then alice's lease goes idle: the
idle monitor's notifications are posted to the idle webhook as Datadog posts them, a day apart on the accelerated
sandbox clock. She keeps it twice (the operators' channel is told each time), her third Keep is refused with whom
to ask, and after the grace the lease is reclaimed (reason idle). Her next lease is exempted by dana from
the operators' card (Exempt..., 3 days and a reason): idle notifications change nothing, and alice cannot exempt
it herself. Everything taken is given back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.example_farm import ALICE, DANA, OPERATORS_CHANNEL, Person

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

DAY_S = 24 * 3600
GRACE_S = 61 * 60  # just past the farm's idle grace (60 minutes)


def run(ctx: DemoContext) -> None:
    """Reject with a reason, a bounded keep, an exemption; print one lease's whole history."""
    if ctx.local is None:
        ctx.check(False, "the governance stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    stage = _Stage(ctx, farm)
    try:
        lease = stage.request(ALICE, "request 8 H100 project=sweep team=nlp env=onprem-hpc days=7 purpose=hp-sweep")
        if lease is None:
            return
        stage.reject_with_reason(lease)
        stage.kept_to_the_maximum(lease)
        stage.exempted()
        stage.history(lease)
    finally:
        farm.close()


class _Stage:
    def __init__(self, ctx: DemoContext, farm: LocalFarm) -> None:
        self.ctx = ctx
        self.farm = farm
        self.alerts = 0

    # -- helpers ---------------------------------------------------------------------------------------------------

    def request(self, person: Person, text: str) -> int | None:
        """A request within quota, allocated; its IR (None when it was not)."""
        allocated: int | None = None
        with self.ctx.step(f"{person.name}: /gpu {text}"):
            self.farm.slash(person, text)
            self.farm.settle()
            project = text.split("project=")[1].split(maxsplit=1)[0]
            ir = ir_in(shown(self.farm.answer(person, f"/{project}`")))
            if ir is not None and self.farm.wait_for(lambda: self.farm.allocation(ir).phase is Phase.ALLOCATED):
                allocated = ir
            hosts = ", ".join(self.farm.allocation(ir).hosts) if allocated is not None and ir is not None else ""
            self.ctx.check(allocated is not None, f"{person.name}'s lease IR-{ir} is allocated", hosts)
        return allocated

    def idle(self, ir: int) -> None:
        """The idle monitor notifies about the lease (each notification its own date, as Datadog sends)."""
        self.alerts += 1
        token = {"X-Gpufarm-Token": self.farm.host.env["GPUFARM_WEBHOOK_SECRET"]}
        date = str(int(self.ctx.sandbox.clock.now() * 1000))
        body = {"alert_transition": "Triggered", "alert_scope": f"ir:ir-{ir}", "alert_id": "4101", "date": date}
        self.farm.post("/fn/idle_alert/", body, token)
        self.farm.settle()

    def warned_then_kept(self, ir: int, missing: str = "the idle warning reached the holder") -> bool:
        """The lease goes idle, its holder is warned and clicks Keep; False (and `missing` a failed check) when no
        warning reached her."""
        farm = self.farm
        self.idle(ir)
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.IDLE_WARNED)
        warning = farm.answer(ALICE, f"IR-{ir}")
        if warning is None or farm.allocation(ir).phase is not Phase.IDLE_WARNED:
            self.ctx.check(False, missing, f"IR-{ir}")
            return False
        farm.click(ALICE, warning, "gpu_keep")
        farm.settle()
        return True

    def advance(self, seconds: int) -> None:
        self.farm.post("/_sandbox/clock", {"advance": seconds})
        self.farm.settle()

    def submit_form(self, person: Person, values: dict[str, Any]) -> bool:
        """Submit the reason form the last click opened for `person`."""
        forms = [v for v in self.farm.views() if v["user"] == person.id and v["callback_id"] == "gpu_reason"]
        if not forms:
            return False
        state = {block: {block: {"type": kind, "value": value}} for block, (kind, value) in values.items()}
        sent = self.farm.submit_view(person, forms[-1]["id"], state)
        self.farm.settle()
        return bool(sent.get("status") == 200)

    # -- the steps -------------------------------------------------------------------------------------------------

    def reject_with_reason(self, held: int) -> None:
        ctx, farm = self.ctx, self.farm
        with ctx.step(f"{ALICE.name} asks for 8 more H100 (beyond nlp's quota): the operators' card has the context"):
            farm.slash(ALICE, "request 8 H100 project=sweep2 team=nlp env=onprem-hpc days=3")
            farm.settle()
            ir = ir_in(shown(farm.answer(ALICE, "/sweep2`")))
            cards = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{ir} needs approval") if ir else []
            if ir is None or not cards:
                ctx.check(False, "the request reached the operators", f"IR-{ir}")
                return
            card = cards[-1]
            text = shown(card)
            ctx.check("Pool `onprem-hpc` now:" in text and "H100 free" in text, "the pool's free capacity now")
            ctx.check(
                f"Team nlp holds 8 H100 (IR-{held}) in `onprem-hpc`, quota 8, hard limit 16" in text,
                "the team's holdings against its quota",
            )
            ctx.check("last 7 days:" in text, "the team's measured utilisation", _after(text, "last 7 days: "))
            ctx.check(f"other live leases: IR-{held}" in text, "the requester's other live leases")
            ctx.check("/incidents/" in text, "a link to the incident")
        with ctx.step(f"{DANA.name} clicks Reject: a form asks why; {ALICE.name} reads the reason"):
            farm.click(DANA, card, "gpu_reject")
            farm.settle()
            ctx.check(farm.allocation(ir).phase is Phase.REQUESTED, "the click alone rejects nothing")
            reason = "the HPC pool is booked for the benchmark week; ask again on Monday"
            ctx.check(self.submit_form(DANA, {"reason": ("plain_text_input", reason)}), "the reason form is submitted")
            farm.wait_for(lambda: farm.allocation(ir).phase is Phase.REJECTED)
            told = shown(farm.answer(ALICE, f"IR-{ir}"))
            ctx.check(f"rejected by <@{DANA.id}>: {reason}" in told, "the requester reads who and why", told[:120])
            updated = [m for m in farm.messages(channel=OPERATORS_CHANNEL) if m.get("ts") == card["ts"]]
            decided = shown(updated[-1]) if updated else ""
            ctx.check(f"Rejected by <@{DANA.id}>: {reason}" in decided, "the card now says who decided and why")

    def kept_to_the_maximum(self, ir: int) -> None:
        ctx, farm = self.ctx, self.farm
        for n in (1, 2):
            with ctx.step(f"IR-{ir} goes idle (day {n}): warned, {ALICE.name} clicks Keep ({n} of 2)"):
                if not self.warned_then_kept(ir):
                    return
                farm.wait_for(lambda n=n: farm.allocation(ir).keep_count == n)
                lease = farm.allocation(ir)
                ctx.check(
                    lease.phase is Phase.ALLOCATED and lease.keep_count == n,
                    f"kept ({n} of 2) until {lease.kept_until:%Y-%m-%d %H:%M} UTC" if lease.kept_until else "kept",
                )
                told = farm.messages(channel=OPERATORS_CHANNEL, contains=f"kept IR-{ir}")
                ctx.check(len(told) == n, "the operators' channel is told", shown(told[-1])[:100] if told else "")
                self.idle(ir)
                ctx.check(farm.allocation(ir).phase is Phase.ALLOCATED, "a notification while kept changes nothing")
                self.advance(DAY_S + 60)
        with ctx.step("Day 3: warned again; the third Keep is refused and says whom to ask"):
            if not self.warned_then_kept(ir, "the third warning reached the holder"):
                return
            refused = shown(farm.answer(ALICE, "cannot be kept again"))
            ctx.check(
                "it has used its 2 keeps of 24 h" in refused and "ask the GPU operators" in refused,
                "Keep refused: why and whom to ask",
                _after(refused, "cannot be kept again")[:110],
            )
            lease = farm.allocation(ir)
            ctx.check(lease.phase is Phase.IDLE_WARNED and lease.keep_count == 2, "nothing changed")
        with ctx.step(f"Past the grace, still idle: IR-{ir} is reclaimed"):
            self.advance(GRACE_S)
            self.idle(ir)
            farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED, timeout=20)
            lease = farm.allocation(ir)
            ctx.check(
                lease.phase is Phase.RECLAIMED and lease.reclaim_reason is ReclaimReason.IDLE,
                "reclaimed, reason idle",
                f"after {lease.keep_count} keeps",
            )

    def exempted(self) -> None:
        ctx, farm = self.ctx, self.farm
        ir = self.request(ALICE, "request 8 H100 project=eval-large team=nlp env=onprem-hpc days=5 purpose=eval")
        if ir is None:
            return
        with ctx.step(f"IR-{ir} goes idle; {ALICE.name} keeps it; {DANA.name} exempts it from the operators' card"):
            if not self.warned_then_kept(ir):
                return
            farm.slash(ALICE, f"exempt IR-{ir} 30d my eval is important")
            farm.settle()
            refused = shown(farm.answer(ALICE, "only GPU operators can exempt"))
            ctx.check(bool(refused), "a researcher cannot exempt a lease", refused[:80])
            cards = farm.messages(channel=OPERATORS_CHANNEL, contains=f"kept IR-{ir}")
            if not cards:
                ctx.check(False, "the operators' card with Exempt")
                return
            farm.click(DANA, cards[-1], "gpu_exempt")
            farm.settle()
            reason = "paper deadline: the eval waits on data for three days"
            ok = self.submit_form(DANA, {"reason": ("plain_text_input", reason), "days": ("number_input", "3")})
            ctx.check(ok, "Exempt... opens a form: 3 days and a reason")
            farm.wait_for(lambda: farm.allocation(ir).exempt_by == DANA.id)
            lease = farm.allocation(ir)
            until = f"{lease.exempt_until:%Y-%m-%d %H:%M} UTC" if lease.exempt_until else "-"
            ctx.check(lease.exempt_by == DANA.id, f"exempt until {until}, by {DANA.name}")
            told = farm.messages(channel=OPERATORS_CHANNEL, contains=f"exempted IR-{ir}")
            ctx.check(bool(told) and reason in told[-1]["text"], "the operators' channel is told, with the reason")
        with ctx.step(f"Two days on IR-{ir} is still idle: the exemption holds, nothing is warned"):
            self.advance(2 * DAY_S)
            self.idle(ir)
            ctx.check(farm.allocation(ir).phase is Phase.ALLOCATED, "no warning, no reclaim while exempt")
            farm.slash(ALICE, f"release IR-{ir} now")
            farm.settle()
            farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED)

    def history(self, ir: int) -> None:
        with self.ctx.step(f"/gpu status IR-{ir}: the lease's whole history"):
            self.farm.slash(ALICE, f"status IR-{ir}")
            self.farm.settle()
            status = self.farm.answer(ALICE, "History (")
            text = (status or {}).get("text", "")
            lines = [line for line in text.splitlines() if line.startswith("• ")]
            # `• 2026-12-01 14:54Z <@U0000000001> kept: 1 of 2; until ...`: the step is the fifth word.
            steps = [(line.split(" ")[4:5] or [""])[0].rstrip(":") for line in lines]
            self.ctx.check(
                {"requested", "approved", "allocated", "warned", "kept", "reclaimed", "freed"} <= set(steps),
                "every step is there, with who and when",
                f"{len(lines)} entries",
            )
            self.ctx.shared["governance_history"] = text
            for line in text.splitlines():
                self.ctx.info(line)


def _after(text: str, marker: str) -> str:
    at = text.find(marker)
    return text[at + len(marker) :].split("\n", 1)[0][:100] if at >= 0 else ""
