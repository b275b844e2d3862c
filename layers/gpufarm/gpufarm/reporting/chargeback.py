"""The month's chargeback for finance (`gpufarm report --month 2026-11 --format chargeback`): one row per team x
project x environment with its cost center, GPU-hours by kind and their cost, and a totals row.

**Hours** are the report's own for the month (gpufarm.core.money.lease_cost.lease_hours over the month: the
incidents' accrued GPU-hours, and a live lease's stretch since its last accrual as unmeasured): held, and of those
busy, idle (no process), idle-held (memory held, no work) and unmeasured.

**Money** is each lease's hours times its GPU-hour price (gpufarm.core.money.lease_cost.lease_cost: its pool's rate
for its model, MIG shares applied), summed unrounded per row, then rounded half-even to cents per row
(gpufarm.core.money.card.round_cents). The totals row is the sum of the rounded rows, so the file adds up in a
spreadsheet; it equals **the month's ledger** (every lease's GPU-hours held in the month times its rate, summed per
row and rounded the same way) to the cent. A row's cost is the held hours' cost; the costs by kind are each rounded
on their own, so they may differ from it by a cent or so.

**Unpriced.** A lease whose pool's model has no rate has no money (never zero). A row with none priced says
`priced=no` and leaves its money empty; one with some says `partial` and its money covers the priced leases; both
count in `unpriced_gpu_hours`, and the totals row says how many rows are unpriced or partly priced. Money totals
hold only priced leases.

**Cost center** is the team's `cost_center` in the farm file, else DEFAULT_COST_CENTER.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.ports import IncidentStore, LeaseReads
from gpufarm.core.money.card import CloudPrice, PriceKey, RateCard, round_cents
from gpufarm.core.money.lease_cost import HoursByKind, lease_cost, lease_hours
from gpufarm.reporting import quota_changes
from gpufarm.reporting.query import Period, month_period
from gpufarm.reporting.read import MAX_LEASES, read_leases

DEFAULT_COST_CENTER = "unassigned"
NONE = "(none)"
# GPU-hours by kind, as the columns name them; `held` is all of them.
HOUR_KINDS = ("busy", "idle", "idle_held", "unmeasured", "held")
# The kinds priced apart (held's cost is the row's total).
COST_KINDS = ("busy", "idle", "idle_held", "unmeasured")


@dataclass
class ChargeRow:
    """One team x project x environment of the month."""

    team: str
    project: str
    environment: str
    cost_center: str
    leases: int = 0
    hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HOUR_KINDS, 0.0))
    # Unrounded money of the priced leases, by kind and in all (`total`).
    money: dict[str, Decimal] = field(default_factory=lambda: dict.fromkeys((*COST_KINDS, "total"), Decimal(0)))
    priced_leases: int = 0
    unpriced_leases: int = 0
    unpriced_hours: float = 0.0

    @property
    def priced(self) -> str:
        """`yes` (every lease priced), `partial` or `no`."""
        if self.unpriced_leases == 0:
            return "yes"
        return "no" if self.priced_leases == 0 else "partial"

    def cost(self, kind: str) -> Decimal | None:
        """The row's money of one kind (or `total`), rounded to cents; None when nothing in it is priced."""
        return None if self.priced_leases == 0 else round_cents(self.money[kind])

    def add(self, lease: LeaseFacts, hours: HoursByKind, card: RateCard) -> None:
        """Count one lease's hours in the month and their cost."""
        self.leases += 1
        for kind in HOUR_KINDS:
            self.hours[kind] += float(getattr(hours, kind))
        cost = lease_cost(card, lease, hours)
        if cost.amount is None:
            self.unpriced_leases += 1
            self.unpriced_hours += hours.held
            return
        self.priced_leases += 1
        self.money["total"] += cost.amount
        for kind in COST_KINDS:
            self.money[kind] += cost.by_kind.get(kind) or Decimal(0)


@dataclass(frozen=True)
class Chargeback:
    """A month's chargeback: its rows (by team, project, environment) and what they add up to."""

    month: str
    period: Period
    currency: str
    generated: datetime
    rows: list[ChargeRow]
    cut: bool = False

    def total_hours(self, kind: str) -> float:
        """GPU-hours of one kind over every row."""
        return sum(r.hours[kind] for r in self.rows)

    def total_cost(self, kind: str = "total") -> Decimal:
        """The sum of the rows' rounded money of one kind (or `total`): priced rows only."""
        return sum((c for c in (r.cost(kind) for r in self.rows) if c is not None), Decimal("0.00"))

    @property
    def unpriced_rows(self) -> int:
        """Rows with any unpriced lease (none priced, or partly)."""
        return sum(1 for r in self.rows if r.priced != "yes")


def cost_center(farm: FarmView, team: str | None) -> str:
    """The team's cost center in the farm file, else DEFAULT_COST_CENTER."""
    spec = farm.teams.get(team or "")
    return spec.cost_center if spec is not None and spec.cost_center else DEFAULT_COST_CENTER


def build_chargeback(
    leases: Iterable[LeaseFacts], farm: FarmView, card: RateCard, period: Period, now: datetime, *, cut: bool = False
) -> Chargeback:
    """The month's rows from the leases read (pure); a lease that held nothing in the month has no part in it."""
    rows: dict[tuple[str, str, str], ChargeRow] = {}
    for lease in quota_changes.leases_only(list(leases)):
        hours = lease_hours(lease, period.start, period.end, now)
        if hours.held <= 0:
            continue
        key = (lease.team or NONE, lease.project or NONE, lease.environment or NONE)
        row = rows.get(key)
        if row is None:
            row = rows[key] = ChargeRow(*key, cost_center(farm, lease.team))
        row.add(lease, hours, card)
    ordered = sorted(rows.values(), key=lambda r: (r.team, r.project, r.environment))
    return Chargeback(period.label, period, card.currency, now, ordered, cut)


def check_options(month: str | None, since: str | None, team: str | None, project: str | None) -> str:
    """The chargeback covers one whole calendar month of the whole farm: --month, and no --since, --team, --project."""
    if month is None or since is not None:
        raise ValidationFailed("month", "--format chargeback needs --month YYYY-MM (a calendar month), not --since")
    if team is not None or project is not None:
        raise ValidationFailed("month", "--format chargeback covers every team and project: no --team or --project")
    return month


def make_chargeback(
    incidents: IncidentStore | LeaseReads,
    farm: FarmView,
    now: datetime,
    month: str,
    prices: Mapping[PriceKey, CloudPrice] | None = None,
    *,
    limit: int = MAX_LEASES,
) -> Chargeback:
    """Validate the month (YYYY-MM, started, within the report's reach), read its leases, build the rows."""
    period = month_period(month, now)
    read = read_leases(incidents, period.months, limit=limit)
    return build_chargeback(read.leases, farm, RateCard(farm.rates, prices), period, now, cut=read.cut)
