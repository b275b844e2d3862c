"""A report's rows and lines: plain data the renderers (table, CSV, JSON, HTML, Slack) read and never change."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from gpufarm.core.money.card import round_cents
from gpufarm.reporting.query import ReportQuery

HOURS_DIGITS = 1
# Lines of the "unmeasured" and "top idle" lists a report keeps (the rows count every lease).
MAX_LEASE_LINES = 20


@dataclass(frozen=True)
class BudgetUse:
    """One budget of a row's team or project in its period (gpufarm.core.accounting.burn): GPU-hours, or money.

    `burned` is the GPU-hours its leases held; a GPU-hour budget's limit is `gpu_hours`. A budget in money has its
    `amount`, what the priced leases cost (`spent`, unrounded) in `currency`, and the pools nothing prices
    (`unpriced`): any makes it **incomplete**, shown as such and never as under budget.
    """

    label: str
    period: str
    burned: float
    gpu_hours: float | None = None
    amount: Decimal | None = None
    spent: Decimal | None = None
    currency: str = ""
    unpriced: tuple[str, ...] = ()

    @property
    def in_money(self) -> bool:
        """True for a budget of an amount of money."""
        return self.amount is not None

    @property
    def incomplete(self) -> bool:
        """A budget in money some of whose leases no rate prices."""
        return self.in_money and (bool(self.unpriced) or self.spent is None)

    @property
    def percent(self) -> float:
        """Share burned (of the priced part, for an incomplete budget in money)."""
        if self.amount is not None:
            return 100.0 * float(self.spent or 0) / float(self.amount) if self.amount else 0.0
        return 100.0 * self.burned / self.gpu_hours if self.gpu_hours else 0.0

    def text(self) -> str:
        """`nlp 2026-11: 1,200/2,000 (60%)`, `nlp 2026-11: EUR 1,200.00/2,000.00 (60%)`, or an incomplete one:
        `nlp 2026-11: EUR 1,200.00 priced/2,000.00, incomplete (no rate prices cloud)`."""
        head = f"{self.label} {self.period}: "
        if self.amount is None:
            return f"{head}{self.burned:,.0f}/{self.gpu_hours or 0:,.0f} ({self.percent:.0f}%)"
        spent, amount = round_cents(self.spent or Decimal(0)), round_cents(self.amount)
        if self.incomplete:
            pools = ", ".join(self.unpriced) or "some leases"
            return f"{head}{self.currency} {spent:,} priced/{amount:,}, incomplete (no rate prices {pools})"
        return f"{head}{self.currency} {spent:,}/{amount:,} ({self.percent:.0f}%)"


@dataclass
class Row:
    """One group of a report (a team, project, lease or environment), or the total."""

    key: str
    leases: int = 0
    held: float = 0.0
    busy: float = 0.0
    # Idle with no process, and idle with memory held and no work (gpufarm.core.money.lease_cost: apart).
    idle: float = 0.0
    idle_held: float = 0.0
    unmeasured: float = 0.0
    unmeasured_leases: int = 0
    # Money (gpufarm.reporting.money): each kind's cost of the priced leases in cents, and the leases priced or not.
    cost: dict[str, Decimal] = field(default_factory=dict)
    priced_leases: int = 0
    unpriced_leases: int = 0
    idle_warnings: int = 0
    keeps: int = 0
    exemptions: int = 0
    # Squatting on the group's leases' devices (gpufarm.reporting.squatting): episodes begun, squatters stopped.
    squatter_episodes: int = 0
    squatter_stops: int = 0
    reclaims: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)
    # Team rows: the GPUs the farm file entitles the team to (the sum of its quotas) and the GPUs it holds now.
    entitled: int | None = None
    held_now: int | None = None
    budgets: list[BudgetUse] = field(default_factory=list)
    # GPU-hours of reservations' windows in the period (gpufarm.reporting.reserved).
    reserved: float = 0.0

    @property
    def utilisation(self) -> float | None:
        """Busy share of the measured GPU-hours, in percent (None when nothing was measured)."""
        measured = self.busy + self.idle + self.idle_held
        return 100.0 * self.busy / measured if measured > 0 else None

    @property
    def wait_avg(self) -> float | None:
        """Mean hours from request to allocation of the leases allocated in the period."""
        return sum(self.waits) / len(self.waits) if self.waits else None

    @property
    def wait_max(self) -> float | None:
        """Longest such wait, in hours."""
        return max(self.waits) if self.waits else None

    def reclaims_text(self) -> str:
        """`idle 2, released 5` (reasons sorted)."""
        return ", ".join(f"{reason} {n}" for reason, n in sorted(self.reclaims.items())) or "-"

    def budgets_text(self) -> str:
        """`nlp 2026-11: 1,200/2,000 (60%); nlp 2026-11: EUR 1,200.00/2,000.00 (60%)` (BudgetUse.text)."""
        return "; ".join(b.text() for b in self.budgets)

    def quota_text(self) -> str:
        """`12/16 GPUs` held now of the entitlement, or '' for rows without one."""
        if self.entitled is None:
            return ""
        return f"{self.held_now or 0}/{self.entitled} GPUs"


@dataclass(frozen=True)
class LeaseLine:
    """One lease in a report's lists (top idle, unmeasured)."""

    ir: int
    team: str
    project: str
    environment: str
    held: float
    busy: float
    idle: float
    unmeasured: float
    idle_held: float = 0.0
    # Its idle and idle-held cost in the card's currency, in cents (None: unpriced).
    wasted: Decimal | None = None


@dataclass(frozen=True)
class PoolLine:
    """One pool and model over the period: its capacity, what leases held of it, and the rest, unallocated.

    Capacity is the mean of the `gpufarm.inventory.gpus.total` gauge the sync publishes (None when it was not
    read) times the period's hours; unallocated is capacity less the held GPU-hours, never below 0.
    """

    environment: str
    model: str
    held: float
    gpus: float | None = None
    capacity: float | None = None
    unallocated: float | None = None
    # The unallocated hours' cost in cents at the pool's whole-GPU rate (None: unpriced or not measured).
    unallocated_cost: Decimal | None = None
    priced: bool = False


@dataclass(frozen=True)
class UsageSeries:
    """One team's GPUs over time from the ledger gauges: (epoch seconds, value) points."""

    team: str
    metric: str
    points: tuple[tuple[int, float], ...]


@dataclass
class Report:
    """A whole report: what it covers, its rows and total, and the leases worth naming."""

    query: ReportQuery
    generated: datetime
    rows: list[Row]
    total: Row
    top_idle: list[LeaseLine] = field(default_factory=list)
    unmeasured: list[LeaseLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    usage: list[UsageSeries] = field(default_factory=list)
    # Reasons given in the period, by code (gpufarm.reporting.reasons).
    reasons: Counter[str] = field(default_factory=Counter)
    # The rate card's currency, and per pool and model the capacity no lease held (gpufarm.reporting.money).
    currency: str = ""
    pools: list[PoolLine] = field(default_factory=list)
