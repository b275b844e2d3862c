"""Demo stage "membership": who may ask for whom, charging what is held, and leases that start when hosts do.

Played through Slack against config/farm.example.yaml, whose teams name their members by Slack user group (the
sandbox's workspace seeds them: alice in nlp, bob in vision, carol in speech). carol asks for GPUs for team nlp and
is refused, nothing created. alice asks for 1 H100 on the HPC pool without saying a team: it is for her only team,
and she is told the 8-GPU host is the smallest unit, so 8 GPUs count against nlp's quota; `/gpu quota` shows them
held; `/gpu release` answers with a Release button Slack confirms, and the click gives the host back. On the cloud
pool's one H100 host alice's second lease waits behind her first (the operators approve it beyond quota), is told
its position, and gets the host when the first is released: its day counts from then, not from the request.
Inside its last 24 hours the scheduled sync reminds her once, with Extend and Release. Everything it takes is given
back, so the stages after it find the pools as they were.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpufarm.core.kernel.lifecycle import Phase
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.example_farm import ALICE, CAROL, DANA, OPERATORS_CHANNEL

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

# The sandbox clock moves this far while the second cloud lease waits, and then past one sync tick (15 minutes).
WAIT_HOURS = 2
SYNC_TICK_S = 16 * 60


def run(ctx: DemoContext) -> None:
    """A foreign team refused, a whole host charged, a waiting lease allocated later with its full day, a reminder."""
    if ctx.local is None:
        ctx.check(False, "the membership stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    try:
        _foreign_team(ctx, farm)
        _whole_host(ctx, farm)
        _waiting_then_allocated(ctx, farm)
    finally:
        farm.close()


def _foreign_team(ctx: DemoContext, farm: LocalFarm) -> None:
    with ctx.step(f"{CAROL.name} (speech) asks for 8 H100 for team nlp: only nlp's members may charge nlp"):
        before = len(farm.incidents())
        farm.slash(CAROL, "request 8 H100 project=borrowed team=nlp env=onprem-hpc days=2")
        farm.settle()
        told = shown(farm.answer(CAROL, "team nlp"))
        ctx.check(
            "only members of team nlp or GPU operators can request GPUs for team nlp" in told
            and "your teams: speech" in told,
            "refused, naming her own teams",
            told[:140],
        )
        ctx.check(len(farm.incidents()) == before, "no incident was created")


def _whole_host(ctx: DemoContext, farm: LocalFarm) -> None:
    held: int | None = None
    with ctx.step(f"{ALICE.name} asks for 1 H100 on the HPC pool without team=: her only team, charged a whole host"):
        farm.slash(ALICE, "request 1 H100 project=probe env=onprem-hpc days=2 purpose=smoke-test")
        farm.settle()
        answer = farm.answer(ALICE, "created: 1x H100")
        told = shown(answer)
        ir = ir_in(told)
        ctx.check(ir is not None and "for `nlp/probe`" in told, "the request is for team nlp", told[:90])
        unit = "1 GPU asked, an 8-GPU host is the smallest unit in onprem-hpc: 8 GPUs count against your quota"
        ctx.check(unit in told, "she is told what counts against the quota", unit)
        if ir is None:
            return
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED)
        lease = farm.allocation(ir)
        ctx.check(sum(lease.host_gpus.values()) == 8, "it holds one whole host", f"{lease.host_gpus}")
        farm.slash(ALICE, "quota nlp")
        farm.settle()
        quota = shown(farm.answer(ALICE, "Quotas"))
        ctx.check("`nlp` H100 in `onprem-hpc`: 8 / 8" in quota, "/gpu quota shows the 8 held", "nlp onprem-hpc 8 / 8")
        held = ir
    if held is not None:  # None when a step above raised (ctx.step records it and carries on)
        _release_confirmed(ctx, farm, held)


def _release_confirmed(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step(f"{ALICE.name} types /gpu release IR-{ir}: a Release button Slack confirms, then the click"):
        farm.slash(ALICE, f"release IR-{ir}")
        farm.settle()
        confirm = farm.answer(ALICE, f"Release IR-{ir}?")
        button = _release_button(confirm)
        ctx.check(
            button is not None and "confirm" in button and farm.allocation(ir).phase is Phase.ALLOCATED,
            "answered with a confirmed Release button; nothing released yet",
            str(button.get("confirm", {}).get("title", {}).get("text")) if button else "",
        )
        if confirm is None or button is None:
            return
        farm.click(ALICE, confirm, "gpu_release")
        farm.settle()
        farm.wait_for(lambda: farm.allocation(ir).phase is Phase.RECLAIMED)
        ctx.check(farm.allocation(ir).phase is Phase.RECLAIMED, "the click released it", f"IR-{ir}")


def _release_button(message: dict[str, Any] | None) -> dict[str, Any] | None:
    for block in (message or {}).get("blocks", []):
        for element in block.get("elements", []) if block.get("type") == "actions" else []:
            if element.get("action_id") == "gpu_release":
                return dict(element)
    return None


def _waiting_then_allocated(ctx: DemoContext, farm: LocalFarm) -> None:
    waited = _waiting(ctx, farm)
    if waited is None:
        return
    first, second, asked_at = waited
    _allocated_later(ctx, farm, first, second, asked_at)
    _reminded(ctx, farm, second)


def _waiting(ctx: DemoContext, farm: LocalFarm) -> tuple[int, int, datetime] | None:
    """alice's first cloud lease takes the host; her second, approved beyond quota, waits. Their IRs, and when."""
    waited: tuple[int, int, datetime] | None = None
    with ctx.step(f"{ALICE.name} holds the cloud pool's one H100 host; her second cloud lease waits for it"):
        farm.slash(ALICE, "request 8 H100 project=eval env=cloud-aws days=1 purpose=baseline")
        farm.settle()
        first = ir_in(shown(farm.answer(ALICE, "x H100 in `cloud-aws` for `nlp/eval`")))
        if first is None:
            ctx.check(False, "the first cloud lease was created")
            return None
        farm.wait_for(lambda: farm.allocation(first).phase is Phase.ALLOCATED)
        asked_at = _now(ctx)
        farm.slash(ALICE, "request 8 H100 project=finetune env=cloud-aws days=1 purpose=finetune")
        farm.settle()
        second = ir_in(shown(farm.answer(ALICE, "for `nlp/finetune`")))
        asks = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{second} needs approval") if second else []
        if second is None or not asks:
            ctx.check(False, "the second cloud lease went to the operators (beyond nlp's quota of 8)")
            return None
        farm.click(DANA, asks[-1], "gpu_approve")
        farm.settle()
        farm.wait_for(lambda: farm.allocation(second).phase is Phase.WAITING)
        told = shown(farm.answer(ALICE, f"IR-{second} is approved but"))
        ctx.check(farm.allocation(second).phase is Phase.WAITING, f"IR-{second} waits", f"{DANA.name} approved it")
        ctx.check(
            "1st of 1 waiting for H100" in told and "Its 1 day starts when its hosts are allocated" in told,
            "the waiting message gives its queue position and says the days start at allocation",
            told[told.find("it is 1st") :][:100],
        )
        farm.slash(ALICE, "list")
        farm.settle()
        listed = shown(farm.answer(ALICE, "Your live allocations"))
        ctx.check("(1st of 1 waiting for H100: first come, first served)" in listed, "/gpu list shows the position too")
        waited = (first, second, asked_at)
    # None when a step above raised (ctx.step records it and carries on).
    return waited


def _allocated_later(ctx: DemoContext, farm: LocalFarm, first: int, second: int, asked_at: datetime) -> None:
    with ctx.step(f"{WAIT_HOURS} h later IR-{first} is released; IR-{second} gets the host and its whole day"):
        farm.post("/_sandbox/clock", {"advance": WAIT_HOURS * 3600})
        farm.slash(ALICE, f"release IR-{first} now")
        farm.settle()
        farm.wait_for(lambda: farm.allocation(second).phase is Phase.ALLOCATED, timeout=20)
        lease = farm.allocation(second)
        start, end = lease.allocated_at, lease.expires_at
        ctx.check(lease.phase is Phase.ALLOCATED, f"IR-{second} is allocated", ", ".join(lease.hosts))
        ctx.check(
            start is not None and end is not None and end - start == timedelta(days=1) and start >= asked_at,
            "its day counts from the allocation, not from the request",
            f"asked {asked_at:%H:%M}, allocated {start:%H:%M}, ends {end:%Y-%m-%d %H:%M} UTC"
            if start and end
            else "no allocated_at / expires_at",
        )


def _reminded(ctx: DemoContext, farm: LocalFarm, second: int) -> None:
    with ctx.step(f"Inside its last 24 h the scheduled sync reminds {ALICE.name} once, with Extend and Release"):
        farm.post("/_sandbox/clock", {"advance": SYNC_TICK_S})
        farm.settle()
        farm.wait_for(lambda: farm.answer(ALICE, f"IR-{second} ends ") is not None, timeout=20)
        reminder = farm.answer(ALICE, f"IR-{second} ends ")
        actions = {
            e.get("action_id")
            for b in (reminder or {}).get("blocks", [])
            if b.get("type") == "actions"
            for e in b.get("elements", [])
        }
        ctx.check(
            reminder is not None and actions == {"gpu_extend", "gpu_release"},
            "a reminder DM with Extend and Release",
            (reminder or {}).get("text", "")[:100],
        )
        farm.post("/_sandbox/clock", {"advance": SYNC_TICK_S})
        farm.settle()
        sent = farm.messages(user=ALICE.id, kind="dm", contains=f"IR-{second} ends ")
        ctx.check(len(sent) == 1, "sent once (the incident records the end it was sent for)", f"{len(sent)} sent")
        history = farm.allocation(second).history
        ctx.shared["membership_history"] = list(history)
        for line in history:
            ctx.info(line)
        farm.slash(ALICE, f"release IR-{second} now")
        farm.settle()
        farm.wait_for(lambda: farm.allocation(second).phase is Phase.RECLAIMED)


def _now(ctx: DemoContext) -> datetime:
    return datetime.fromtimestamp(ctx.sandbox.clock.now(), UTC).replace(microsecond=0)
