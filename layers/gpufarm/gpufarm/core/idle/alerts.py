"""Idle alerts on a lease: a monitor says its GPUs are idle (warn once, reclaim once still idle past the grace
period) or busy again (drop the warning). Per host or device where the lease holds hosts (gpufarm.core.idle.partial);
an alert for hosts or devices the lease does not hold changes nothing, and a keep or an operator's exemption holds
idle reclaim off until its end (gpufarm.core.idle.keeps)."""

from __future__ import annotations

from gpufarm.core.chat import idle_notices, messages
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.idle import keeps, lease_window, partial
from gpufarm.core.idle.delivery import deliver_warning
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.serial import IdleScope
from gpufarm.core.kernel.units import lease_devices
from gpufarm.core.leases import metrics
from gpufarm.core.leases.ending import resolve


@invocation
def idle_triggered(ctx: LeaseContext, ir: int, scope: IdleScope | None = None) -> Outcome:
    """A monitor says the IR's GPUs (on `scope`'s hosts or devices) are idle: warn once, reclaim if still idle
    after the grace period. An alert for hosts the lease does not hold changes nothing."""
    alloc = ctx.get(ir)
    early = _not_judged(ctx, alloc, scope)
    if early is not None:
        return early
    if alloc.idle_pending is not None:
        alloc = ctx.write_fields(alloc, {f.IDLE_PENDING: None})
    judged = partial.idle(ctx, alloc, scope)  # per host or device: warn, give the idle part back, or reclaim
    if judged is not None:
        return judged
    where = f" {scope.describe()}" if scope is not None and scope.describe() else ""
    if alloc.phase is Phase.ALLOCATED and alloc.state is State.STABLE:
        _warn(ctx, alloc, scope)
        return Outcome(ir, f"warned{where}")
    if alloc.phase is Phase.IDLE_WARNED and partial.grace_over(ctx.farm, alloc, ctx.now()):
        resolve(ctx, alloc, ReclaimReason.IDLE, by=None)
        return Outcome(ir, f"resolved (idle){where}")
    return Outcome(ir, f"nothing to do ({alloc.phase.value})")


def _not_judged(ctx: LeaseContext, alloc: Allocation, scope: IdleScope | None) -> Outcome | None:
    """The outcome when the alert is not to be judged now (kept, exempted, foreign parts, held back), else None."""
    ir = alloc.ir
    held = keeps.suppressed(alloc, ctx.now())
    if held is not None and alloc.state is not State.RESOLVED:
        # A keep or an operator's exemption holds idle reclaim off until its end (gpufarm.core.idle.keeps); a held-back
        # alert is dropped with it, so the sweep does not send it again each minute.
        if alloc.idle_pending is not None:
            ctx.write_fields(alloc, {f.IDLE_PENDING: None})
        return Outcome(ir, f"nothing to do: {alloc.ir_label} is {held}")
    foreign = foreign_parts(alloc, scope)
    if foreign:
        return Outcome(ir, f"ignored: {', '.join(foreign)[:200]} not held by {alloc.ir_label}")
    due = lease_window.hold_back(alloc, scope, ctx.now())
    if due is None:
        return None
    # The lease chose a longer idle window than the monitor's: idle since then, judged once it has passed (the sweep
    # sends the idle command then; gpufarm.core.idle.lease_window).
    monitor = (scope.window_minutes if scope is not None else None) or 0
    since = lease_window.idle_since(alloc, ctx.now(), monitor)
    if alloc.idle_pending != since:
        ctx.write_fields(alloc, {f.IDLE_PENDING: isoformat(since)})
    return Outcome(ir, f"held back: {alloc.ir_label} chose idle={alloc.idle_window_minutes}m, due {isoformat(due)}")


def _warn(ctx: LeaseContext, alloc: Allocation, scope: IdleScope | None) -> None:
    """Warn the holder, then record the warning: the grace (and so the reclaim) starts from a warning they got."""
    now = ctx.now()
    evidence = scope.describe() if scope is not None else ""
    warned = ctx.step(history.MONITOR, Step.WARNED, f"kind {(scope.kind if scope else None) or 'idle'}", evidence)
    policy = lease_window.policy_for(ctx.farm, alloc)
    warning = idle_notices.idle_warning(alloc, policy, now, scope, ctx.links_for(alloc))
    deliver_warning(ctx.chat, alloc.requester, warning)
    ctx.write(alloc, Phase.IDLE_WARNED, {f.IDLE_WARNED_AT: isoformat(now)}, step=warned)
    metrics.warned(ctx, alloc)


@invocation
def idle_recovered(ctx: LeaseContext, ir: int, scope: IdleScope | None = None) -> Outcome:
    """The GPUs are busy again: drop the warning (a recovery on hosts the lease does not hold changes nothing)."""
    alloc = ctx.get(ir)
    foreign = foreign_parts(alloc, scope)
    if foreign:
        return Outcome(ir, f"ignored: {', '.join(foreign)[:200]} not held by {alloc.ir_label}")
    if alloc.idle_pending is not None and alloc.state is not State.RESOLVED:
        # Busy again before its own idle window passed: nothing to judge (gpufarm.core.idle.lease_window).
        alloc = ctx.write_fields(alloc, {f.IDLE_PENDING: None})
        if alloc.phase is Phase.ALLOCATED:
            return Outcome(ir, "recovered before its own idle window passed")
    cleared = partial.busy(ctx, alloc, scope)  # per host or device: only the parts the recovery names
    if cleared is not None:
        return cleared
    if alloc.phase is not Phase.IDLE_WARNED or alloc.state is State.RESOLVED:
        return Outcome(ir, f"nothing to do ({alloc.phase.value})")
    busy = ctx.step(history.MONITOR, Step.RECOVERED, scope.describe() if scope is not None else "")
    updated = ctx.write(alloc, Phase.ALLOCATED, {f.IDLE_WARNED_AT: None}, step=busy)
    ctx.tell(updated.requester, messages.busy_again(updated, ctx.links_for(updated)))
    return Outcome(ir, "recovered")


def foreign_parts(alloc: Allocation, scope: IdleScope | None) -> list[str]:
    """Hosts an idle alert names that the allocation does not hold (Datadog lowercases host tags), and devices
    it does not hold where it records its units (a shared pool's lease; gpufarm.core.kernel.units)."""
    if scope is None:
        return []
    held = {h.lower() for h in alloc.hosts}
    foreign = [h for h in scope.hosts if h.lower() not in held]
    mine = {u.uuid for units in lease_devices(alloc).values() for u in units if u.uuid}
    return foreign + ([d for d in scope.devices if d not in mine] if mine else [])
