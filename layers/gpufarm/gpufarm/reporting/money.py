"""Money in a report: each lease's GPU-hours by kind priced at its rate (gpufarm.core.money.lease_cost), summed per
row, and per pool the cost of the capacity no lease held.

Each lease's cost of each kind (busy, idle with no process, idle-held, unmeasured) is rounded to the cent once, and
its held cost is the sum of those, so every row, every kind and the total add up to the cent. A lease whose pool or
model has no rate is **unpriced**: it adds no money and is counted; a row of only unpriced leases shows "unpriced",
never 0, and a row with some is **incomplete** (its money is the priced leases' alone, and says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.money.card import RateCard, round_cents
from gpufarm.core.money.lease_cost import KINDS, HoursByKind, lease_cost
from gpufarm.reporting.model import PoolLine, Row

HELD = "held"
# Every money column a report shows, beside the hours of the same kind.
SHOWN = (HELD, *KINDS)
WASTED = ("idle", "idle_held")
ZERO = Decimal("0.00")
UNPRICED = "unpriced"
# Marks an incomplete amount (some of the row's leases unpriced) in the table, the HTML and Slack.
INCOMPLETE_MARK = "*"


def lease_money(card: RateCard, lease: LeaseFacts, hours: HoursByKind) -> dict[str, Decimal] | None:
    """The lease's cost per kind and held, in cents, or None when unpriced."""
    cost = lease_cost(card, lease, hours)
    if not cost.priced:
        return None
    out = {kind: round_cents(amount) for kind, amount in cost.by_kind.items() if amount is not None}
    out[HELD] = sum(out.values(), ZERO)
    return out


def add_lease(row: Row, money: dict[str, Decimal] | None, held: float) -> None:
    """Count one lease's money (or its being unpriced) into a row; a lease with no hours counts for neither."""
    if held <= 0:
        return
    if money is None:
        row.unpriced_leases += 1
        return
    row.priced_leases += 1
    for kind, amount in money.items():
        row.cost[kind] = row.cost.get(kind, ZERO) + amount


def add_rows(row: Row, other: Row) -> None:
    """Add another row's money into this one (the total)."""
    row.priced_leases += other.priced_leases
    row.unpriced_leases += other.unpriced_leases
    for kind, amount in other.cost.items():
        row.cost[kind] = row.cost.get(kind, ZERO) + amount


def amount(row: Row, kind: str) -> Decimal | None:
    """A row's cost of a kind, or None when every lease with hours in it is unpriced."""
    if row.unpriced_leases and not row.priced_leases:
        return None
    return row.cost.get(kind, ZERO)


def incomplete(row: Row) -> bool:
    """True when the row's money leaves out unpriced leases."""
    return bool(row.unpriced_leases and row.priced_leases)


def money_text(row: Row, kind: str) -> str:
    """`1,234.56`, `1,234.56*` when incomplete, or `unpriced`."""
    value = amount(row, kind)
    if value is None:
        return UNPRICED
    return f"{value:,.2f}{INCOMPLETE_MARK if incomplete(row) else ''}"


def wasted(money: dict[str, Decimal] | None) -> Decimal | None:
    """A lease's idle and idle-held cost (None: unpriced)."""
    return None if money is None else sum((money[k] for k in WASTED), ZERO)


def money_note(total: Row, currency: str) -> str | None:
    """What the money figures are, and which leases they leave out; None when no lease had hours."""
    if not total.priced_leases and not total.unpriced_leases:
        return None
    said = f"money in {currency}, each lease's GPU-hours by kind at its pool's rate"
    if total.unpriced_leases:
        said += (
            f"; {total.unpriced_leases} lease(s) on a pool or model with no rate are unpriced (never 0): "
            f"an amount marked {INCOMPLETE_MARK} leaves them out"
        )
    return said


def pool_lines(
    card: RateCard,
    offered: Mapping[str, tuple[str, ...]],
    held: Mapping[tuple[str, str], float],
    gpus: Mapping[tuple[str, str], float] | None,
    hours: float,
) -> list[PoolLine]:
    """Per pool and model: held GPU-hours, and with the inventory gauges read, capacity and the unallocated rest."""
    out: list[PoolLine] = []
    keys = {(env, model.upper()) for env, models in offered.items() for model in models} | set(held)
    for env, model in sorted(keys):
        used = held.get((env, model), 0.0)
        rate = card.rate(env, model)
        if gpus is None:
            out.append(PoolLine(env, model, used, priced=rate is not None))
            continue
        mean = gpus.get((env, model), 0.0)
        capacity = mean * hours
        free = max(0.0, capacity - used)
        cost = None if rate is None else round_cents(rate.cost(free))
        out.append(PoolLine(env, model, used, mean, capacity, free, cost, rate is not None))
    return out


def pools_cost(pools: list[PoolLine]) -> Decimal | None:
    """The unallocated capacity's cost of the priced pools (None when none was measured and priced)."""
    priced = [p.unallocated_cost for p in pools if p.unallocated_cost is not None]
    return sum(priced, ZERO) if priced else None
