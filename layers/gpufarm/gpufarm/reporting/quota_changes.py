"""The report's part of quota changes (gpufarm.core.accounting.override_terms): an override's incident is never a lease
row; the changes in effect at the report's time raise the team rows' entitlement, and each is named in the notes
with its approver."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpufarm.core.accounting import override_terms as overrides
from gpufarm.core.config.farm_view import FarmView, QuotaView, TeamView
from gpufarm.core.kernel.lease_facts import LeaseFacts

MAX_NOTES = 10


def leases_only(read: Sequence[LeaseFacts]) -> list[LeaseFacts]:
    """The leases the report counts: every incident read but the quota changes."""
    return [a for a in read if not a.is_quota_override]


def with_changes(farm: FarmView, read: Sequence[LeaseFacts], now: datetime) -> FarmView:
    """The farm's quotas with the changes in effect at `now` (as decisions read them then)."""
    return changed(farm, overrides.in_effect(read, now))


def changed(farm: FarmView, changes: Sequence[overrides.Override]) -> FarmView:
    """The farm with each change added to its team's quota, as override_terms.apply does to a FarmConfig."""
    if not changes:
        return farm
    teams = dict(farm.teams)
    for o in changes:
        team = teams.get(o.team)
        if team is None:
            continue
        pools = {env: dict(models) for env, models in team.quotas.items()}
        base = pools.get(o.environment, {}).get(o.gpu_model)
        gpus, hard = overrides.changed_quota(o, (0, 0) if base is None else (base.gpus, base.hard_limit))
        pools.setdefault(o.environment, {})[o.gpu_model] = QuotaView(gpus, hard)
        teams[o.team] = TeamView(pools, team.cost_center, team.channel)
    return farm.with_teams(teams)


def notes(read: Sequence[LeaseFacts], now: datetime) -> list[str]:
    """One note per quota change in effect at `now`, the soonest to end first."""
    changes = sorted(overrides.in_effect(read, now), key=lambda c: (c.until, c.ir))
    found = [f"quota change in effect: {c.label()}, approved by {c.approved_by or 'unknown'}" for c in changes]
    if len(found) > MAX_NOTES:
        found = [*found[:MAX_NOTES], f"{len(found) - MAX_NOTES} more quota changes in effect"]
    return found
