"""The ledger's part of `/gpu quota`: held, used, idle and unmeasured GPUs per team and project, and the budgets."""

from __future__ import annotations

from collections.abc import Sequence

from gpufarm.core.accounting import Accounts
from gpufarm.core.budgets import Burn

MAX_LINES = 40


def quota_lines(acc: Accounts, burned: Sequence[Burn], team: str | None = None) -> list[str]:
    """`/gpu quota` lines: the measured ledger (one line per team, project, pool and model) and budget burn."""
    lines = ["*Ledger* (held: used / idle / unmeasured GPUs)"]
    shown = [(k, v) for k, v in sorted(acc.lines.items()) if team is None or k[0] == team]
    for (name, project, env, model), line in shown[:MAX_LINES]:
        lines.append(
            f"• `{name}/{project}` {model} in `{env}`: {line.allocated} held: "
            f"{line.used:g} used / {line.idle:g} idle / {line.unmeasured} unmeasured"
        )
    if len(shown) > MAX_LINES:
        lines.append(f"• {len(shown) - MAX_LINES} more")
    if not shown:
        lines.append("• nothing held")
    if not acc.measured:
        lines.append("_busy GPUs could not be measured now: held GPUs show as unmeasured, not idle_")
    unattributed = sum(v for (_, owner, _), v in acc.unattributed.items() if team is None or owner == team)
    if unattributed:
        lines.append(f"• busy GPUs no lease claims: {unattributed:g}")
    mine = [b for b in burned if team is None or b.budget.team == team]
    if mine:
        lines.append("*GPU-hour budgets* (used / budget this period)")
        lines += [
            f"• `{b.budget.label()}` {b.period}: {b.burned:,.0f} / {b.budget.gpu_hours:,.0f} "
            f"({b.percent:.0f} %, {b.remaining:,.0f} left)"
            for b in mine
        ]
    return lines
