"""Budgets in words, for Slack: a burn's figures, a threshold's alert, and `/gpu budget`'s answer.

Money shows its currency code and is rounded half-even to the cent only here (`round_cents`); an unpriced amount
reads "unpriced", never 0, and a budget in money with an unpriced lease says it is incomplete instead of what is
left. Every name from an incident or the farm file is inert.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from gpufarm.core.accounting.burn import Burn, applies, period_bounds
from gpufarm.core.accounting.forecast import Forecast, day
from gpufarm.core.chat.amounts import gpu_amount
from gpufarm.core.chat.block_kit import Message, context, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.money.card import RateCard, round_cents
from gpufarm.core.money.lease_cost import lease_cost, lease_hours
from gpufarm.core.money.lease_rate import lease_rate

TOP_LEASES = 3
MAX_LEASE_LINES = 20


def money(amount: Decimal | None, currency: str) -> str:
    """`EUR 1,234.50`, or `unpriced`."""
    if amount is None:
        return "unpriced"
    return f"{inert(currency)} {round_cents(amount):,}"


def figure(b: Burn) -> str:
    """`768 / 2,000 (38 %, 1,232 left)` GPU-hours, `EUR 1,200.00 / EUR 2,000.00 (60 %, EUR 800.00 left)`, or an
    incomplete budget in money: what is priced, and which pools nothing prices."""
    if b.budget.amount is None:
        return f"{b.burned:,.0f} / {b.budget.limit:,.0f} ({b.percent:.0f} %, {b.remaining:,.0f} left)"
    spent, limit = money(b.spent or Decimal(0), b.currency), money(b.budget.amount, b.currency)
    if b.incomplete:
        pools = ", ".join(inert(p) for p in b.unpriced) or "some leases"
        return f"{spent} priced / {limit}, incomplete: no rate prices {pools} ({b.burned:,.0f} GPU-hours held)"
    left = money(Decimal(repr(b.remaining)), b.currency)
    return f"{spent} / {limit} ({b.percent:.0f} %, {left} left; {b.burned:,.0f} GPU-hours)"


def top_leases(card: RateCard | None, b: Burn, leases: Sequence[Allocation], now: datetime) -> list[str]:
    """The budget's leases that burned most in the period: `IR-12 8x H100 (onprem-hpc): 640 GPU-hours, EUR 1,280.00`."""
    start, end = period_bounds(b.budget.period, now)
    rows: list[tuple[float, str]] = []
    seen: set[int] = set()
    for alloc in leases:
        if alloc.ir in seen or not applies(b.budget, alloc):
            continue
        seen.add(alloc.ir)
        facts = LeaseFacts.of(alloc)
        hours = lease_hours(facts, start, end, now)
        if hours.held <= 0:
            continue
        line = f"{alloc.ir_label} {gpu_amount(alloc)} ({inert(alloc.environment)}): {hours.held:,.0f} GPU-hours"
        if card is not None:
            line += f", {money(lease_cost(card, facts, hours).amount, card.currency)}"
        rows.append((hours.held, line))
    rows.sort(key=lambda r: -r[0])
    return [line for _, line in rows[:TOP_LEASES]]


def alert_message(f: Forecast, threshold: int, top: Sequence[str]) -> Message:
    """A threshold crossed: the burn, the budget, the forecast and the top leases."""
    b = f.burn
    head = f"{inert(b.budget.label())}'s budget for {b.period} passed {threshold} %"
    text = f":money_with_wings: {head}: {figure(b)}. {inert(f.sentence())}."
    blocks = [section(f":money_with_wings: *{head}*\n{figure(b)}\n{inert(f.sentence())}.")]
    if top:
        blocks.append(section("*Top leases this period*\n" + "\n".join(f"• {line}" for line in top)))
    blocks.append(context("Told once per threshold and period; `/gpu budget` shows the rest."))
    return Message(text, blocks)


def budget_lines(f: Forecast, card: RateCard | None) -> list[str]:
    """`/gpu budget`'s lines for one budget: burn, budget, percent, forecast, and each live lease's cost to its end."""
    b = f.burn
    lines = [
        f"*`{inert(b.budget.label())}` {b.period}*: {figure(b)}",
        f"{inert(f.sentence())}; the last 7 days burned {_per_day(f)} a day.",
    ]
    held = f.commitments
    if held:
        lines.append("Live leases and reservations, to their end:")
    for c in held[:MAX_LEASE_LINES]:
        what = f"{c.alloc.ir_label} {gpu_amount(c.alloc)} ({inert(c.alloc.environment)})"
        hours = c.hours_to_end(f.now)
        cost = ""
        if card is not None:
            price = c.cost_to_end(f.now) if b.budget.in_money else _lease_cost(card, c.alloc, hours)
            cost = f", {money(price, card.currency)}"
        lines.append(f"• {what} until {day(c.end)}: {hours:,.0f} GPU-hours{cost}")
    if len(held) > MAX_LEASE_LINES:
        lines.append(f"• {len(held) - MAX_LEASE_LINES} more")
    return lines


def _lease_cost(card: RateCard, alloc: Allocation, hours: float) -> Decimal | None:
    rate = lease_rate(card, alloc.environment, alloc.gpu_model, alloc.devices)
    return None if rate is None else rate.cost(hours)


def _per_day(f: Forecast) -> str:
    if f.burn.budget.in_money:
        return money(Decimal(repr(f.per_day)), f.burn.currency)
    return f"{f.per_day:,.0f} GPU-hours"
