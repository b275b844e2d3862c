"""When a budget runs out at this rate: the last 7 days' burn, floored by what is already committed.

Pure. **The trend**: what the budget's leases burned over the last 7 days (GPU-hours held, or their cost; counted
from the period's start when it began less than 7 days ago, since the ended leases of an earlier period are not
read) per hour. **The commitments**: each holding lease's GPUs from now to its end (`expires_at`, else the period's
end) and each reservation (gpufarm.core.calendar) from its start to its end, inside the period, at its GPU-hour
price for a budget in money. The expected burn at a time `t` of the period is what is burned now plus the larger of
the trend's and the commitments' burn up to `t`: the leases already granted burn at least that much, and the trend
stands in for the requests still to come. The budget runs out at the first hour that reaches it, or lasts the
period. A budget in money some of whose leases are unpriced has no date: it is incomplete, never under budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpufarm.core.accounting.burn import Burn, applies, period_bounds
from gpufarm.core.kernel import accrued
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import HOLDING, Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.money.card import RateCard
from gpufarm.core.money.lease_cost import lease_cost, lease_hours
from gpufarm.core.money.lease_rate import lease_rate

TREND_DAYS = 7
HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Commitment:
    """One live lease or reservation of the budget: its GPUs, from when to when, and its price per GPU-hour."""

    alloc: Allocation
    gpus: int
    start: datetime
    end: datetime
    # Money per GPU-hour (None: unpriced; a budget in GPU-hours counts 1).
    price: float | None

    def hours_to_end(self, now: datetime) -> float:
        """GPU-hours from now (or its start) to its end."""
        return self.gpus * max(0.0, (self.end - max(now, self.start)).total_seconds() / 3600)

    def cost_to_end(self, now: datetime) -> Decimal | None:
        """What those GPU-hours cost; None when unpriced."""
        return None if self.price is None else Decimal(repr(self.price)) * Decimal(repr(self.hours_to_end(now)))


@dataclass(frozen=True)
class Forecast:
    """A budget's outlook for the rest of its period."""

    burn: Burn
    now: datetime
    period_end: datetime
    # The trend in the budget's unit per day, what the commitments add by the period's end, and the expected end.
    per_day: float
    committed: float
    expected: float
    runs_out: datetime | None
    commitments: list[Commitment] = field(default_factory=list)

    @property
    def lasts(self) -> bool:
        """True when the budget lasts the period at this rate (and is not incomplete)."""
        return self.runs_out is None and not self.burn.incomplete

    def sentence(self) -> str:
        """`nlp's December budget runs out on Dec 19 at this rate`, or that it lasts the period, or why no date."""
        who = f"{self.burn.budget.label()}'s {period_name(self.burn.period)} budget"
        if self.burn.incomplete:
            return f"{who} is incomplete (no rate prices {', '.join(self.burn.unpriced) or 'its leases'}): no forecast"
        if self.runs_out is not None and self.runs_out <= self.now:
            return f"{who} has run out ({self.burn.percent:.0f} % used)"
        if self.runs_out is not None:
            return f"{who} runs out on {day(self.runs_out)} at this rate"
        last = self.period_end - timedelta(seconds=1)
        return (
            f"{who} lasts the period at this rate "
            f"({100.0 * self.expected / self.burn.budget.limit:.0f} % expected by {day(last)})"
        )


def period_name(label: str) -> str:
    """`2026-12` → `December`; a quarter stays `2026-Q4`."""
    if "-Q" in label:
        return label
    return datetime(int(label[:4]), int(label[5:7]), 1, tzinfo=UTC).strftime("%B")


def day(moment: datetime) -> str:
    """`Dec 19` (UTC)."""
    moment = moment.astimezone(UTC)
    return f"{moment:%b} {moment.day}"


def commitments(card: RateCard | None, burn: Burn, leases: Sequence[Allocation], now: datetime) -> list[Commitment]:
    """The budget's holding leases and reservations with what they still hold in the period, ending soonest first."""
    budget = burn.budget
    _, period_end = period_bounds(budget.period, now)
    out: list[Commitment] = []
    seen: set[int] = set()
    for alloc in leases:
        if alloc.ir in seen or not applies(budget, alloc):
            continue
        seen.add(alloc.ir)
        if alloc.phase in HOLDING:
            gpus = sum(accrued.held_by_host(alloc).values()) or alloc.gpu_count
            start, end = now, min(alloc.expires_at or period_end, period_end)
        elif alloc.phase is Phase.RESERVED and alloc.reserved_from and alloc.reserved_until:
            gpus = alloc.gpu_count
            start, end = max(now, alloc.reserved_from), min(alloc.reserved_until, period_end)
        else:
            continue
        if end <= start or gpus <= 0:
            continue
        price: float | None = 1.0
        if budget.in_money:
            rate = lease_rate(card, alloc.environment, alloc.gpu_model, alloc.devices) if card else None
            price = None if rate is None else float(rate.per_gpu_hour)
        out.append(Commitment(alloc, gpus, start, end, price))
    return sorted(out, key=lambda c: (c.end, c.alloc.ir))


def trend(card: RateCard | None, burn: Burn, leases: Sequence[LeaseFacts], now: datetime) -> float:
    """The budget's burn per hour over the last 7 days (or since its period began), in its unit."""
    start, _ = period_bounds(burn.budget.period, now)
    since = max(now - timedelta(days=TREND_DAYS), start)
    span = (now - since).total_seconds() / 3600
    if span < 1:
        return 0.0
    total = 0.0
    seen: set[int] = set()
    for lease in leases:
        if lease.ir in seen or not applies(burn.budget, lease):
            continue
        seen.add(lease.ir)
        hours = lease_hours(lease, since, now, now)
        if not burn.budget.in_money:
            total += hours.held
        elif card is not None and hours.held > 0:
            cost = lease_cost(card, lease, hours)
            total += float(cost.amount) if cost.amount is not None else 0.0
    return total / span


def forecast(card: RateCard | None, burn: Burn, leases: Sequence[Allocation], now: datetime) -> Forecast:
    """The budget's forecast from its burn now and the team's leases (see the module docstring)."""
    _, period_end = period_bounds(burn.budget.period, now)
    facts = [LeaseFacts.of(a) for a in leases]
    per_hour = trend(card, burn, facts, now)
    held = commitments(card, burn, leases, now)
    limit = burn.budget.limit
    steps = max(0, int((period_end - now) / HOUR + 0.999999))
    # What the commitments burn in each hour ahead.
    ahead = [0.0] * (steps + 1)
    for c in held:
        if c.price is None:
            continue
        first = max(0, int((c.start - now) / HOUR))
        last = min(steps, int((c.end - now) / HOUR + 0.999999))
        for k in range(first, last):
            ahead[k] += c.gpus * c.price
    runs_out: datetime | None = now if burn.used >= limit else None
    committed = 0.0
    expected = burn.used
    for k in range(steps):
        committed += ahead[k]
        hours = min(float(k + 1), (period_end - now) / HOUR)
        expected = burn.used + max(per_hour * hours, committed)
        if runs_out is None and expected >= limit:
            runs_out = min(period_end, now + HOUR * (k + 1))
    return Forecast(burn, now, period_end, per_hour * 24, committed, expected, runs_out, held)
