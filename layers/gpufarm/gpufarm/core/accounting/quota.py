"""`/gpu quota`: quotas and use per team, free and total GPUs per pool, and the ledger's part: held, used, idle and
unmeasured GPUs per team and project with what they cost an hour (held, and the idle part) at the rate card's
prices, and the budgets' burn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal

from gpufarm.core.accounting import agent_usage, budgets, gpu_hours, overrides
from gpufarm.core.accounting.budget_text import figure
from gpufarm.core.accounting.budgets import Burn
from gpufarm.core.accounting.gpu_hours import Accounts, LedgerLine, LineKey
from gpufarm.core.accounting.ledger_cost import hourly_cost
from gpufarm.core.chat import messages
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.chat.escape import inert
from gpufarm.core.chat.messages import QuotaRow
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance.policy import team_usage
from gpufarm.core.money.card import round_cents

MAX_LINES = 40


Hourly = Mapping[LineKey, Decimal | None]


def quota_lines(
    acc: Accounts, burned: Sequence[Burn], team: str | None = None, hourly: Hourly | None = None, currency: str = ""
) -> list[str]:
    """`/gpu quota` lines: the measured ledger (one line per team, project, pool and model) and budget burn."""
    return [*_ledger_lines(acc, team, hourly or {}, currency), *_measure_notes(acc, team), *budget_lines(burned, team)]


def _cost_text(line: LedgerLine, per_hour: Decimal | None, currency: str) -> str:
    """`: 20.00 USD/h, idle 15.00 USD/h`, or `: unpriced`; nothing for a line the card was not asked about."""
    if per_hour is None:
        return " · unpriced"
    idle = per_hour * Decimal(repr(line.idle)) / line.allocated if line.allocated else Decimal(0)
    cur = inert(currency)
    return f" · {round_cents(per_hour):,.2f} {cur}/h, idle {round_cents(idle):,.2f} {cur}/h"


def _ledger_lines(acc: Accounts, team: str | None, hourly: Hourly, currency: str) -> list[str]:
    """The ledger's heading and a line per team, project, pool and model (at most MAX_LINES, then how many more)."""
    lines = ["*Ledger* (held: used / idle / unmeasured GPUs" + (", and what they cost an hour)" if hourly else ")")]
    shown = [(k, v) for k, v in sorted(acc.lines.items()) if team is None or k[0] == team]
    for key, line in shown[:MAX_LINES]:
        name, project, env, model = key
        cost = _cost_text(line, hourly[key], currency) if key in hourly else ""
        lines.append(
            f"• `{inert(f'{name}/{project}')}` {inert(model)} in `{inert(env)}`: {line.allocated} held: "
            f"{line.used:g} used / {line.idle:g} idle / {line.unmeasured} unmeasured{cost}"
        )
    if len(shown) > MAX_LINES:
        lines.append(f"• {len(shown) - MAX_LINES} more")
    if not shown:
        lines.append("• nothing held")
    return lines


def _measure_notes(acc: Accounts, team: str | None) -> list[str]:
    """What the ledger could not tell: that nothing was measured now, and busy GPUs no lease claims."""
    lines: list[str] = []
    if not acc.measured:
        lines.append("_busy GPUs could not be measured now: held GPUs show as unmeasured, not idle_")
    unattributed = sum(v for (_, owner, _), v in acc.unattributed.items() if team is None or owner == team)
    if unattributed:
        lines.append(f"• busy GPUs no lease claims: {unattributed:g}")
    return lines


def budget_lines(burned: Sequence[Burn], team: str | None) -> list[str]:
    """The budgets' burn this period, with their heading; nothing when no budget is the team's."""
    mine = [b for b in burned if team is None or b.budget.team == team]
    if not mine:
        return []
    hours = [b for b in mine if not b.budget.in_money]
    money = [b for b in mine if b.budget.in_money]
    lines = ["*GPU-hour budgets* (used / budget this period)"] if hours else []
    lines += [f"• `{inert(b.budget.label())}` {b.period}: {figure(b)}" for b in hours]
    lines += ["*Budgets in money* (spent / budget this period)"] if money else []
    lines += [f"• `{inert(b.budget.label())}` {b.period}: {figure(b)}" for b in money]
    return lines


@invocation
def quota(ctx: LeaseContext, team: str | None = None) -> Message:
    """Quotas and use per team, and free/total GPUs per pool."""
    if team is not None:
        ctx.farm.team(team)
    live = ctx.live()
    # The file's quotas with the quota changes in effect (gpufarm.core.accounting.overrides), listed below them.
    farm = overrides.effective_farm(ctx)
    rows = [
        QuotaRow(name, env, model, q.gpus, q.hard_limit, team_usage(live, name, env, model, charge=ctx.held))
        for name, spec in sorted(farm.teams.items())
        if team is None or name == team
        for env, models in sorted(spec.quotas.items())
        for model, q in sorted(models.items())
    ]
    usage = gpu_hours.measure(ctx.usage, ctx.now(), ctx.farm.ledger, agent_usage.for_farm(ctx.farm))
    acc = gpu_hours.accounts(live, usage, ctx.inventory())
    burned = budgets.burns(ctx, [b for b in ctx.farm.budgets if team is None or b.team == team])
    changes = overrides.quota_lines(ctx, team)
    card = ctx.rate_card()
    ledger = quota_lines(acc, burned, team, hourly_cost(card, live), card.currency)
    return messages.quota_message(rows, ctx.inventory_summary(), [*changes, *ledger])
