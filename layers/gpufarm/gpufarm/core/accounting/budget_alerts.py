"""Budget alerts: each threshold of a budget (default 50, 80 and 100 %) told once per period, with a forecast.

**Where "told" lives.** State lives in incident fields only (docs/design.md, rule 1), and the leases come and go
within a period, so none of them can say what the team was told. A budget's period gets an incident of its own, as
a quota change does (gpufarm.core.accounting.overrides): gpufarm's type, kind `budget-period`, the team, project and
period, and `gpufarm_budget_alerts` holding each threshold told (`80=<time>`). It is created **ended** (resolved,
rejected), as a doctor's probe is, so no live read, quota, sweep or report counts it, and its request id is derived
from the budget and the period (`budget:nlp:-:2026-12`), so a create retried after a failure finds the first one.

**One writer.** The sync (after the ledger's accruals) reads every budget's burn once (the same read the gauges
use), reads the period's budget incidents in one search, and for each budget with a threshold crossed and not yet
recorded queues a `budget` message in the team's own queue group (`budget-<team>`) with a dedup id derived from the
budget, the period and the threshold: overlapping syncs collapse into one message, and what runs in the group is the
only writer of the team's budget incidents (rule 7). There, `tell` reads the burn and the incident again, records
the thresholds crossed in the incident **first**, then tells them: a redelivered or late message finds them recorded
and tells nothing, so a threshold is told at most once (a post Slack loses is logged, as every notice). Thresholds
crossed together are told in one message naming the highest. Without a queue `tell` runs at once, the same code.

**Whom.** The team's channel (`teams.<team>.channel`), else a DM to each user its `members` names, and the
operators' channel: the burn, the budget, the forecast sentence (gpufarm.core.accounting.forecast) and the top
leases of the period.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from gpufarm.core.accounting import budgets
from gpufarm.core.accounting.budget_text import alert_message, top_leases
from gpufarm.core.accounting.burn import Burn
from gpufarm.core.accounting.forecast import forecast
from gpufarm.core.chat.block_kit import Message
from gpufarm.core.config.accounting import Budget, BudgetPeriod
from gpufarm.core.config.budget_terms import BudgetTerms
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import IncidentRecord, isoformat
from gpufarm.core.kernel.search import IncidentQuery

log = logging.getLogger(__name__)

GROUP_PREFIX = "budget-"
MAX_DMS = 20


def request_id(budget: BudgetTerms, period: str) -> str:
    """The budget period incident's request id: `budget:nlp:-:2026-12`, `budget:nlp:llm-ko:2026-Q4`."""
    return f"budget:{budget.team}:{budget.project or '-'}:{period}"


def group(team: str) -> str:
    """The queue group every write of a team's budget incidents runs in."""
    return f"{GROUP_PREFIX}{team}"


def told(record: IncidentRecord | None) -> dict[int, str]:
    """The thresholds a budget period's incident records as told, with when (malformed entries skipped)."""
    if record is None:
        return {}
    value = record.fields.get(f.BUDGET_ALERTS)
    entries = [value] if isinstance(value, str) else list(value or [])
    out: dict[int, str] = {}
    for entry in entries:
        percent, sep, when = entry.partition("=")
        if sep and percent.isascii() and percent.isdigit() and len(percent) <= 4:
            out[int(percent)] = when
    return out


def due(burn: Burn, already: Mapping[int, str]) -> list[int]:
    """The budget's thresholds crossed now and not yet told this period, ascending."""
    return [t for t in burn.budget.alerts if burn.percent >= t and t not in already]


def period_incidents(ctx: LeaseContext, periods: Iterable[str]) -> dict[str, IncidentRecord]:
    """The budget period incidents of these periods, by request id (one search; the lowest IR of twins)."""
    wanted = ((f.BUDGET_PERIOD_LABEL, tuple(sorted(set(periods)))), (f.KIND, (f.BUDGET_PERIOD,)))
    query = IncidentQuery(frozenset({State.RESOLVED}), wanted)
    found: dict[str, IncidentRecord] = {}
    for record in ctx.incidents.search(query):
        rid = record.fields.get(f.REQUEST_ID)
        if isinstance(rid, str) and (rid not in found or record.public_id < found[rid].public_id):
            found[rid] = record
    return found


def check(ctx: LeaseContext, burned: Sequence[Burn], origin: str) -> list[str]:
    """The sync's part: each budget with a threshold crossed and not recorded is queued in its team's group (run at
    once without a queue). `burned` is the sync's one read of the budgets. What was sent, for the report."""
    crossed = [b for b in burned if due(b, {})]
    if not crossed:
        return []
    recorded = period_incidents(ctx, {b.period for b in crossed})
    sent: list[str] = []
    for b in crossed:
        pending = due(b, told(recorded.get(request_id(b.budget, b.period))))
        if not pending:
            continue
        body = {"budget": {"team": b.budget.team, "project": b.budget.project, "period": b.budget.period.value}}
        if ctx.queue is not None:
            dedup = f"{request_id(b.budget, b.period)}:{pending[-1]}".replace(":", "-")
            ctx.queue.send({**body, "reason": origin}, group=group(b.budget.team), dedup_id=dedup[:128])
        else:
            tell(ctx, b.budget.team, b.budget.project, b.budget.period)
        sent.append(f"{b.budget.label()} {b.period} {pending[-1]} %")
    return sent


@invocation
def tell(ctx: LeaseContext, team: str, project: str | None, period: BudgetPeriod) -> str:
    """In the team's budget group: read the burn and the period's incident again, record the thresholds crossed and
    not yet told, then tell them (see the module docstring). What it did, for the log."""
    budget = next((b for b in ctx.farm.budgets if b.key == (team, project, period)), None)
    if budget is None:
        return "no such budget (the farm file changed); nothing to tell"
    ((burn, leases),) = budgets.burns_with_leases(ctx, [budget])
    rid = request_id(budget, burn.period)
    record = ctx.incidents.find_by_request_id(rid)
    already = told(record)
    pending = due(burn, already)
    if not pending:
        return f"{budget.label()} {burn.period}: nothing new to tell"
    now = isoformat(ctx.now())
    entries = [f"{t}={when}" for t, when in sorted(already.items())] + [f"{t}={now}" for t in pending]
    if record is None:
        _create(ctx, budget, burn.period, rid, entries)
    else:
        ctx.incidents.update(record.id, {f.BUDGET_ALERTS: entries})
    card = ctx.rate_card()
    outlook = forecast(card, burn, leases, ctx.now())
    priced = card if card.settings.environments else None
    message = alert_message(outlook, pending[-1], top_leases(priced, burn, leases, ctx.now()))
    _tell_team(ctx, team, message)
    ctx.post_operators(message)
    return f"{budget.label()} {burn.period}: told {pending[-1]} %"


def _create(ctx: LeaseContext, budget: Budget, period: str, rid: str, entries: list[str]) -> IncidentRecord:
    values: dict[str, object] = {
        f.STATE: State.RESOLVED.value,
        f.PHASE: Phase.REJECTED.value,
        f.KIND: f.BUDGET_PERIOD,
        f.TEAM: budget.team,
        f.REQUEST_ID: rid,
        f.BUDGET_PERIOD_LABEL: period,
        f.BUDGET_ALERTS: entries,
    }
    if budget.project:
        values[f.PROJECT] = budget.project
    title = f"GPU budget alerts: {budget.label()} {period}"
    return ctx.incidents.create(title, values, initial_note="The budget thresholds told this period (gpufarm)")


def _tell_team(ctx: LeaseContext, team: str, message: Message) -> None:
    """The team's channel, else a DM to each user the farm file names for it."""
    spec = ctx.farm.teams.get(team)
    if spec is None:
        return
    if spec.channel:
        try:
            ctx.chat.post_message(spec.channel, message.text, message.blocks)
        except UpstreamError:
            log.warning("could not post a budget alert to team %s's channel", team)
        return
    for user in (spec.members.users if spec.members else ())[:MAX_DMS]:
        ctx.tell(user, message)
