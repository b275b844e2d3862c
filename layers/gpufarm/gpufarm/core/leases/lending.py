"""Borrowing: a request beyond its team's quota is approved on the idle quota other teams of the pool lend.

A team below its quota in a pool lends what it does not use. Where the pool's lending policy lets the team borrow
(gpufarm.core.config.lending: `when-idle`, or `priority` for the teams of the pool's classes), a request the policy
would send to the operators only because it goes beyond the team's quota is approved instead when the part beyond
quota fits both what the other teams leave unused (less what is lent already) and the GPUs free in the pool now.
The lease carries what it borrowed (`gpufarm_borrowed`) and can be taken back on notice when a lender needs its
quota (gpufarm.core.leases.preemption). The hard limit still holds, and budgets still apply after. The decision
runs in the pool's queue group with every other grant (docs/design.md, rule 7).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufarm.core.accounting import overrides
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.governance.charging import waste_verdict
from gpufarm.core.governance.policy import GRANTED_PHASES, Ask, Decision, Verdict, team_usage
from gpufarm.core.inventory.placement import pool_hosts
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.reasons import Reason, ReasonCode


@dataclass(frozen=True)
class Lendable:
    """What a pool can lend for one model now: the other teams' unused quota less what is lent, and the free GPUs."""

    unused: int
    lent: int
    free: int

    @property
    def available(self) -> int:
        """GPUs a borrower may take now."""
        return max(0, min(self.unused - self.lent, self.free))


def pool_gpus(ctx: LeaseContext, environment: str, gpu_model: str) -> int:
    """GPUs (units on a shared pool) of the pool's model on hosts that are up."""
    down = ctx.down(environment)
    shared = ctx.shared(environment)
    hosts = [h for h in pool_hosts(ctx.inventory(environment), environment, gpu_model) if h.name not in down]
    return sum(len(h.units) if shared else h.gpu_count for h in hosts)


def granted_in(live: list[Allocation], environment: str, gpu_model: str) -> list[Allocation]:
    """The pool's granted leases of one model."""
    model = gpu_model.upper()
    return [a for a in live if a.phase in GRANTED_PHASES and a.environment == environment and a.gpu_model == model]


def lendable(ctx: LeaseContext, team: str, environment: str, gpu_model: str, *, exclude: int | None = None) -> Lendable:
    """The idle quota of the pool's other teams, what borrowers hold of it, and the GPUs held by nobody now."""
    model = gpu_model.upper()
    live = [a for a in ctx.live(environment) if a.ir != exclude]
    farm = overrides.effective_farm(ctx, environment)
    unused = 0
    for name in farm.teams:
        quota = farm.quota(name, environment, model)
        if name != team and quota is not None:
            unused += max(0, quota.gpus - team_usage(live, name, environment, model, charge=ctx.held))
    granted = granted_in(live, environment, model)
    lent = sum(min(a.borrowed, ctx.held(a)) for a in granted)
    holding = sum(ctx.held(a) for a in granted if a.phase in HOLDING)
    return Lendable(unused, lent, max(0, pool_gpus(ctx, environment, model) - holding))


def borrow(ctx: LeaseContext, ask: Ask, team_used: int, decision: Decision, *, exclude: int | None = None) -> Decision:
    """The decision with borrowing applied: approved on lent capacity when only the quota sent it to operators."""
    if decision.verdict is not Verdict.NEEDS_OPERATOR or not ctx.farm.lending.may_borrow(ask.environment, ask.team):
        return decision
    if ask.charge is not None and waste_verdict(ctx.farm, ask.team, ask.charge) is not None:
        return decision  # whole hosts charged for a few GPUs: an operator decides that, lent capacity or not
    beyond = min(ask.charged, team_used + ask.charged - decision.entitled)
    if beyond <= 0:
        return decision
    pool = lendable(ctx, ask.team, ask.environment, ask.gpu_model, exclude=exclude)
    if beyond > pool.available or ask.charged > pool.free:
        return decision
    reason = borrowed_reason(ask, beyond, decision.entitled, pool)
    return replace(decision, verdict=Verdict.APPROVE, reason=reason.line(), borrowed=beyond)


def borrowed_reason(ask: Ask, beyond: int, entitled: int, pool: Lendable) -> Reason:
    """Why a request beyond quota was approved: what it borrows, from what, and that it can be taken back."""
    where = f"{ask.gpu_model} in {ask.environment}"
    return Reason(
        ReasonCode.BORROWED,
        f"team {ask.team} borrows {beyond} idle {where} beyond its quota of {entitled} "
        f"({pool.unused - pool.lent} lent by teams below their quota, {pool.free} free); "
        "taken back on notice when a lender needs them",
    )
