"""Demo stage "lending": a borrowed lease preempted with notice after its protection window.

Played through Slack against config/farm.example.yaml, whose HPC pool lends to the speech team's priority class (no
H100 quota of its own there), with 30 minutes' notice after a 1-hour protection window. carol (speech) asks for 8
H100 and borrows what nlp leaves unused; vision (bob, to its hard limit) and speech (carol) take the rest of the pool
8 at a time, dana granting what goes beyond quota: the pool is full, whatever earlier stages left on it. 20 minutes
on, alice (nlp) asks for her team's 8: it waits and is told when the earliest borrower becomes preemptible. Once
carol's borrowed lease is past its first hour the sync gives carol notice (the reason, the deadline, who needs the
GPUs); 30 minutes on the borrowed lease is reclaimed (reason preempted) and alice's request allocated. carol's lease's
history is printed as `/gpu status` shows it. Everything the stage took is given back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufarm.core.kernel import history
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm, ir_in, shown
from gpufarm_sandbox.example_farm import ALICE, BOB, CAROL, DANA, OPERATORS_CHANNEL, Person

if TYPE_CHECKING:
    from gpufarm_sandbox.demo.context import DemoContext

MINUTE_S = 60
POOL = "onprem-hpc"
# vision's hard limit on the HPC pool (config/farm.example.yaml), and at most this many requests to fill the pool.
VISION_HARD_LIMIT = 16
MAX_FILL = 10


def run(ctx: DemoContext) -> None:
    """Borrow, fill the pool, claim it back, preempt on notice, print the borrower's history."""
    if ctx.local is None:
        ctx.check(False, "the lending stage needs the local function host (gpufarm demo starts it)")
        return
    from gpufarm.config import Settings

    farm = LocalFarm(ctx.base_url, ctx.local.host, Settings())
    held: list[tuple[Person, int]] = []
    try:
        _play(ctx, farm, held)
    finally:
        for person, ir in held:
            if farm.allocation(ir).phase in (Phase.ALLOCATED, Phase.IDLE_WARNED, Phase.WAITING, Phase.APPROVED):
                farm.slash(person, f"release IR-{ir} now")
        farm.settle()
        farm.close()


def _play(ctx: DemoContext, farm: LocalFarm, held: list[tuple[Person, int]]) -> None:
    if _used(farm, "nlp"):
        ctx.check(False, "nlp holds nothing on the HPC pool (it lends its quota)", f"{_used(farm, 'nlp')} H100 held")
        return
    borrower = _borrowed(ctx, farm)
    if borrower is None:
        return
    held.append((CAROL, borrower))
    if not _fill(ctx, farm, held):
        return
    lender = _lender_waits(ctx, farm, borrower)
    if lender is None:
        return
    held.append((ALICE, lender))
    if _noticed(ctx, farm, borrower, lender):
        _preempted(ctx, farm, borrower, lender)
        _history(ctx, farm, borrower)


def _used(farm: LocalFarm, team: str | None = None) -> int:
    """H100 GPUs granted on the HPC pool (to `team`), as the incidents say."""
    return sum(
        a.gpu_count
        for a in farm.incidents()
        if a.state.value != "resolved"
        and a.environment == POOL
        and a.phase in (Phase.APPROVED, Phase.WAITING, Phase.ALLOCATED, Phase.IDLE_WARNED)
        and (team is None or a.team == team)
    )


def _size(farm: LocalFarm) -> int:
    """The HPC pool's H100 GPUs, from its registered hosts' tags."""
    total = 0
    for host in farm.gateway.list_hosts(f"gpufarm:managed environment:{POOL}"):
        counts = [t.split(":", 1)[1] for t in host.tags if t.startswith("gpu_count:")]
        total += int(counts[0]) if counts and counts[0].isdigit() else 0
    return total


def _fill(ctx: DemoContext, farm: LocalFarm, held: list[tuple[Person, int]]) -> bool:
    """The rest of the pool taken 8 at a time by vision (to its hard limit) then speech, granted by policy or dana."""
    with ctx.step(f"The rest of the HPC pool is taken by vision and speech ({DANA.name} grants what is beyond quota)"):
        for n in range(MAX_FILL):
            free = _size(farm) - _used(farm)
            if free <= 0:
                break
            person, team = (BOB, "vision") if _used(farm, "vision") + 8 <= VISION_HARD_LIMIT else (CAROL, "speech")
            ir = _granted(farm, person, f"request 8 H100 project=fill-{n} team={team} env={POOL} days=7")
            if ir is None:
                ctx.check(False, f"{person.name}'s 8 H100 are allocated")
                return False
            held.append((person, ir))
        full = _size(farm) - _used(farm) == 0
        ctx.check(full, "the pool is full", f"{_used(farm)} of {_size(farm)} H100 granted")
        return full


def _advance(farm: LocalFarm, seconds: int) -> None:
    farm.post("/_sandbox/clock", {"advance": seconds})
    farm.settle()


def _granted(farm: LocalFarm, person: Person, text: str) -> int | None:
    """A request allocated: by policy, or approved by dana when it goes beyond its team's quota."""
    ir = farm.request_ir(person, text)
    if ir is None:
        return None
    if farm.allocation(ir).phase is Phase.REQUESTED:
        farm.slash(DANA, f"approve IR-{ir}")
        farm.settle()
    farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED)
    return ir if farm.allocation(ir).phase is Phase.ALLOCATED else None


def _borrowed(ctx: DemoContext, farm: LocalFarm) -> int | None:
    with ctx.step(f"{CAROL.name} (speech, no H100 quota here) asks for 8: she borrows what nlp leaves unused"):
        ir = farm.request_ir(CAROL, "request 8 H100 project=asr-lend team=speech env=onprem-hpc days=7")
        if ir is None or not farm.wait_for(lambda: farm.allocation(ir).phase is Phase.ALLOCATED):
            ctx.check(False, "the borrowing request is allocated", f"IR-{ir}")
            return None
        lease = farm.allocation(ir)
        ctx.check(lease.borrowed == 8 and lease.approved_by == "policy", "approved by policy, 8 GPUs borrowed")
        answer = shown(farm.answer(CAROL, "borrows 8 idle H100"))
        ctx.check(f"IR-{ir}" in answer, "she is told she borrows", answer[:140])
    return ir


def _lender_waits(ctx: DemoContext, farm: LocalFarm, borrower: int) -> int | None:
    with ctx.step(f"20 minutes on, {ALICE.name} (nlp) asks for her team's 8: the pool is full, she waits"):
        _advance(farm, 20 * MINUTE_S)
        ir = farm.request_ir(ALICE, "request 8 H100 project=llm-back team=nlp env=onprem-hpc days=3")
        if ir is None or not farm.wait_for(lambda: farm.allocation(ir).phase is Phase.WAITING):
            ctx.check(False, "the lender's request waits", f"IR-{ir}")
            return None
        ctx.check(farm.allocation(borrower).preempt_at is None, f"IR-{borrower} is protected (its first hour)")
        told = shown(farm.answer(ALICE, "becomes preemptible"))
        ctx.check(f"IR-{borrower}, becomes preemptible at" in told, "she is told when", told[:140])
    return ir


def _noticed(ctx: DemoContext, farm: LocalFarm, borrower: int, lender: int) -> bool:
    with ctx.step(f"Past IR-{borrower}'s first hour, the sync gives {CAROL.name} notice"):
        _advance(farm, 45 * MINUTE_S)
        farm.wait_for(lambda: farm.allocation(borrower).preempt_at is not None, timeout=20)
        lease = farm.allocation(borrower)
        ctx.check(lease.preempt_for == f"IR-{lender}", "the notice is recorded, for the lender's request")
        notice = shown(farm.answer(CAROL, "is taken back"))
        ctx.check(
            "team nlp needs them back" in notice and f"IR-{lender}" in notice and "30 min notice" in notice,
            "she is told the reason, the deadline and who needs the GPUs",
            notice[:160],
        )
        ops = farm.messages(channel=OPERATORS_CHANNEL, contains=f"IR-{borrower} borrowed")
        ctx.check(bool(ops), "the operators are told")
        return lease.preempt_at is not None


def _preempted(ctx: DemoContext, farm: LocalFarm, borrower: int, lender: int) -> None:
    with ctx.step(f"30 minutes on, IR-{borrower} is reclaimed (preempted) and IR-{lender} allocated"):
        _advance(farm, 31 * MINUTE_S)
        farm.wait_for(lambda: farm.allocation(lender).phase is Phase.ALLOCATED, timeout=20)
        lease = farm.allocation(borrower)
        ctx.check(
            lease.phase is Phase.RECLAIMED and lease.reclaim_reason is ReclaimReason.PREEMPTED,
            "the borrower is reclaimed, reason preempted",
        )
        back = farm.allocation(lender)
        ctx.check(back.phase is Phase.ALLOCATED, f"{ALICE.name}'s request is allocated", ", ".join(back.hosts))
        # On the sandbox clock, for benchmarks/lending.py: when each step happened.
        steps = {e.step: e.at for e in (history.parse(line) for line in lease.history) if e is not None}
        ctx.shared["lending_times"] = {
            "borrower_allocated": lease.allocated_at,
            "notice": steps.get("preempting"),
            "reclaimed": steps.get("reclaimed"),
            "lender_asked": next((e.at for e in map(history.parse, back.history) if e is not None), None),
            "lender_allocated": back.allocated_at,
        }


def _history(ctx: DemoContext, farm: LocalFarm, ir: int) -> None:
    with ctx.step(f"/gpu status IR-{ir}: the preempted lease's history"):
        farm.slash(CAROL, f"status IR-{ir}")
        farm.settle()
        text = (farm.answer(CAROL, "History (") or {}).get("text", "")
        ctx.check("[preemption-notice]" in text and "[preempted]" in text, "the notice and the end, with their reasons")
        ctx.shared["lending_history"] = text
        for line in text.splitlines():
            ctx.info(line)
        ctx.check(ir_in(text) == ir, "the status names the lease")
