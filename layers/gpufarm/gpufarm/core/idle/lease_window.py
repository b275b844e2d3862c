"""A lease's own idle window and grace, chosen at request time within its pool's bounds (`idle=30m grace=2h`).

**Choosing** is the request's (gpufarm.core.governance.idle_choice); the lease keeps them in its fields
(`idle_window_minutes`, `idle_grace_minutes`).

**Honouring the window** costs no monitor: the pool's monitors stay one per kind and policy group whatever the
leases choose (docs/scheduling.md, "Idle settings per lease"). A monitor fires after its kind's window; for a
lease whose own window is longer, the alert is held back (`hold_back`): the lease records since when it is idle
(`gpufarm_idle_pending`, its start being the alert's time less the monitor's window) and the sweep sends the
idle command once the lease's window has passed since then (`pending_due`), unless the monitor recovered first
(which clears it). **The grace** is the lease's own where it chose one (`policy_for`): the warning, the sweep's
reclaim and a partial reclaim all count it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufarm.core.config.farm import FarmConfig, IdlePolicy
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import IdleScope


def policy_for(farm: FarmConfig, alloc: Allocation) -> IdlePolicy:
    """The lease's idle policy: its pool's and team's, with the grace it chose."""
    policy = farm.idle.policy(alloc.environment, alloc.team)
    if alloc.idle_grace_minutes:
        return policy.model_copy(update={"grace_minutes": alloc.idle_grace_minutes})
    return policy


def hold_back(alloc: Allocation, scope: IdleScope | None, now: datetime) -> datetime | None:
    """When the lease's own window will have passed, if an idle alert now comes before it (else None: judge now).

    The lease has been idle since the alert's time less the monitor's window, or since it was first seen idle."""
    window = alloc.idle_window_minutes
    if not window or alloc.phase is not Phase.ALLOCATED or alloc.state is State.RESOLVED:
        return None
    monitor = (scope.window_minutes if scope is not None else None) or 0
    if monitor >= window:
        return None
    since = idle_since(alloc, now, monitor)
    due = since + timedelta(minutes=window)
    return due if now < due else None


def idle_since(alloc: Allocation, now: datetime, monitor_minutes: int) -> datetime:
    """Since when the lease is idle: as first recorded, else the alert's time less the monitor's window."""
    seen = now - timedelta(minutes=monitor_minutes)
    return min(alloc.idle_pending, seen) if alloc.idle_pending else seen


def pending_due(alloc: Allocation, now: datetime) -> bool:
    """True when a held-back idle alert's lease window has passed (the sweep then sends the idle command)."""
    return (
        alloc.idle_pending is not None
        and alloc.idle_window_minutes is not None
        and alloc.phase is Phase.ALLOCATED
        and alloc.state is not State.RESOLVED
        and now >= alloc.idle_pending + timedelta(minutes=alloc.idle_window_minutes)
    )


def lease_scope(alloc: Allocation) -> IdleScope:
    """The scope the sweep's idle command carries: the lease's own window, every part of it."""
    return IdleScope(kind="idle", window_minutes=alloc.idle_window_minutes)
