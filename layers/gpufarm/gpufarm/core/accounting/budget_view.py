"""`/gpu budget [team]`: each budget's burn this period, its forecast, and what each live lease will cost to its end.

Shown as the reports show a team (gpufarm.reporting.slack): a named team to its members and the GPU operators; no
team, the asker's teams (every budget for an operator). A team that is not the farm's, or one the asker may not
see, is an ephemeral error and reads nothing more. Read from incidents only, as the budget gate reads them.
"""

from __future__ import annotations

from gpufarm.core.accounting import budgets
from gpufarm.core.accounting.budget_text import budget_lines
from gpufarm.core.accounting.forecast import forecast
from gpufarm.core.chat.block_kit import MAX_MESSAGE_BLOCKS, Message, context, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance.membership import MembershipUnavailable
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError

MAX_BUDGETS_SHOWN = 20


def teams_shown(ctx: LeaseContext, user: str, team: str | None) -> list[str]:
    """The teams whose budgets the asker sees; ValidationFailed or NotAllowed otherwise."""
    membership = ctx.membership()
    if team is not None:
        ctx.farm.team(team)
        membership.check(user, team, f"see team {team}'s budget")
        return [team]
    try:
        operator = membership.is_operator(user)
    except UpstreamError as exc:
        raise MembershipUnavailable(f"Slack could not say who the GPU operators are ({exc}); try again") from None
    if operator or not ctx.farm.membership_checked:
        return sorted(ctx.farm.teams)
    mine = membership.teams_of(user)
    if not mine:
        raise NotAllowed("you are in no team, so there is no budget of yours; ask the GPU operators")
    return mine


@invocation
def budget(ctx: LeaseContext, user: str, team: str | None = None) -> Message:
    """The answer to `/gpu budget [team]` (see the module docstring)."""
    teams = teams_shown(ctx, user, team)
    chosen = [b for b in ctx.farm.budgets if b.team in teams]
    if not chosen:
        scope = f"team {inert(team)} has" if team else "your teams have"
        text = f"{scope} no budget in the farm file."
        return Message(text, [section(text)])
    card = ctx.rate_card()
    priced = card if card.settings.environments else None
    blocks = []
    lines: list[str] = []
    for burn, leases in budgets.burns_with_leases(ctx, chosen[:MAX_BUDGETS_SHOWN]):
        outlook = forecast(card, burn, leases, ctx.now())
        shown = budget_lines(outlook, priced)
        lines += shown
        blocks.append(section("\n".join(shown)))
    if len(chosen) > MAX_BUDGETS_SHOWN:
        blocks.append(context(f"{len(chosen) - MAX_BUDGETS_SHOWN} more budgets; name a team to see its own."))
    return Message("\n".join(lines), blocks[:MAX_MESSAGE_BLOCKS])
