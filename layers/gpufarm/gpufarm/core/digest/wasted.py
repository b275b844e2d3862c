"""The digest's money: the day's GPU-hours by kind with their cost, and the day's top wasted cost (the leases and
teams whose idle and idle-held GPU-hours cost the most since the last digest); pure.

Each lease's hours inside the window (gpufarm.core.money.lease_cost: the live ones and those that ended in it)
are priced at its rate; a lease whose pool or model has no rate is unpriced, counted apart and never as 0. Shown
beside the news, never as news itself: money alone does not post a digest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from gpufarm.core.chat.escape import inert
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.money.card import RateCard, round_cents
from gpufarm.core.money.lease_cost import KINDS, lease_cost, lease_hours

TITLE = "The day in money (idle + idle-held is wasted)"
TOP_LEASES = 5
TOP_TEAMS = 3
WASTED = ("idle", "idle_held")
_NAMES = {"busy": "busy", "idle": "idle", "idle_held": "idle-held", "unmeasured": "unmeasured"}


@dataclass
class _Tally:
    hours: dict[str, float] = field(default_factory=dict)
    cost: dict[str, Decimal] = field(default_factory=dict)
    unpriced: int = 0

    def wasted(self) -> Decimal:
        return sum((self.cost.get(k, Decimal(0)) for k in WASTED), Decimal(0))

    def wasted_hours(self) -> float:
        return sum(self.hours.get(k, 0.0) for k in WASTED)


def lines(leases: Iterable[Allocation], card: RateCard, since: datetime, until: datetime, now: datetime) -> list[str]:
    """The day's hours and cost by kind, then the top wasted cost per lease and per team; [] when nothing held."""
    day = _Tally()
    teams: dict[str, _Tally] = {}
    per_lease: list[tuple[Decimal, float, Allocation]] = []
    seen: set[int] = set()
    for alloc in leases:
        if alloc.ir in seen:
            continue
        seen.add(alloc.ir)
        hours = lease_hours(alloc, since, until, now)
        if hours.held <= 0:
            continue
        cost = lease_cost(card, alloc, hours)
        team = teams.setdefault(alloc.team or "(none)", _Tally())
        for tally in (day, team):
            for kind in KINDS:
                tally.hours[kind] = tally.hours.get(kind, 0.0) + hours.of(kind)
            tally.hours["held"] = tally.hours.get("held", 0.0) + hours.held
            if not cost.priced:
                tally.unpriced += 1
                continue
            for kind, amount in cost.by_kind.items():
                tally.cost[kind] = tally.cost.get(kind, Decimal(0)) + round_cents(amount or Decimal(0))
        if cost.priced:
            wasted = sum((round_cents(cost.by_kind[k] or Decimal(0)) for k in WASTED), Decimal(0))
            per_lease.append((wasted, hours.idle + hours.idle_held, alloc))
    if not seen or not day.hours:
        return []
    cur = inert(card.currency)
    out = [_day_line(day, cur)]
    for wasted, idle, alloc in sorted(per_lease, key=lambda x: (-x[0], x[2].ir))[:TOP_LEASES]:
        if wasted <= 0:
            break
        who = inert("/".join(p for p in (alloc.team, alloc.project) if p) or "unknown team")
        out.append(f"{alloc.ir_label} {who}: {wasted:,.2f} {cur} wasted ({idle:,.1f} idle and idle-held GPU-h)")
    ranked = sorted(teams.items(), key=lambda t: (-t[1].wasted(), t[0]))
    top = [
        f"`{inert(name)}` {t.wasted():,.2f} {cur} ({t.wasted_hours():,.1f} GPU-h)"
        for name, t in ranked
        if t.wasted() > 0
    ]
    if top:
        out.append("Teams by wasted cost: " + ", ".join(top[:TOP_TEAMS]))
    return out


def _day_line(day: _Tally, cur: str) -> str:
    """`1,234.0 GPU-h held (3,085.00 USD): 800.0 busy (2,000.00), ...`, and the unpriced leases left out."""
    held_cost = sum(day.cost.values(), Decimal(0))
    parts = [
        f"{day.hours.get(kind, 0.0):,.1f} {_NAMES[kind]} ({day.cost.get(kind, Decimal(0)):,.2f})" for kind in KINDS
    ]
    said = f"{day.hours.get('held', 0.0):,.1f} GPU-h held ({held_cost:,.2f} {cur}): " + ", ".join(parts)
    if day.unpriced:
        said += f"; {day.unpriced} lease(s) unpriced (no rate), their hours counted and their cost left out"
    return said
