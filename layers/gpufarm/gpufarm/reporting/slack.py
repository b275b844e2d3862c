"""`/gpu report [team | project]` in Slack: a summary of the last 30 days, and the CSV in the asker's DM.

Operators may ask for any team or project, or for the whole farm (no argument); a researcher for their own team
(no argument: their only team) or a project of their teams' leases, else the answer is an ephemeral refusal and
nothing is read beyond the membership. The report is the one `gpufarm report` builds (gpufarm.reporting.make),
grouped by project for a team and by team otherwise. The summary is the worker's answer (Block Kit, through the
command's response_url); the CSV goes to the asker's direct message with the app (the app can always post there,
and a team's numbers stay with whoever asked), uploaded through the Slack port's `upload_file` (files_upload_v2).
An upload Slack refuses does not lose the summary: it says the CSV could not be attached.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpufarm.core.chat.block_kit import Message, context, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.governance.membership import MembershipUnavailable
from gpufarm.core.kernel.display import visible
from gpufarm.core.kernel.errors import NotAllowed, UpstreamError, ValidationFailed
from gpufarm.core.kernel.model import validate_name
from gpufarm.reporting import money, reasons
from gpufarm.reporting.cells import NOTE_CHARS
from gpufarm.reporting.make import make_report
from gpufarm.reporting.model import Report, Row
from gpufarm.reporting.query import GroupBy
from gpufarm.reporting.render_csv import render_csv

if TYPE_CHECKING:
    from gpufarm.core.context.lease_context import LeaseContext

log = logging.getLogger(__name__)

SINCE = "30d"
# Rows the summary shows (the CSV has every one).
MAX_SUMMARY_ROWS = 10


def _cost(row: Row, kind: str, currency: str) -> str:
    """` (1,234.56 EUR)`, ` (unpriced)`, or ` (1,234.56* EUR)` when some of the row's leases are unpriced."""
    text = money.money_text(row, kind)
    return f" ({text})" if text == money.UNPRICED else f" ({text} {inert(currency)})"


def _row_line(row: Row, currency: str) -> str:
    util = "-" if row.utilisation is None else f"{row.utilisation:.0f}%"
    line = (
        f"*{inert(visible(row.key))}*: {row.held:,.1f} GPU-h held{_cost(row, 'held', currency)} · "
        f"{row.busy:,.1f} busy{_cost(row, 'busy', currency)} · {row.idle:,.1f} idle{_cost(row, 'idle', currency)} · "
        f"{row.idle_held:,.1f} idle-held{_cost(row, 'idle_held', currency)} · "
        f"{row.unmeasured:,.1f} unmeasured{_cost(row, 'unmeasured', currency)} · util {util} · {row.leases} lease(s)"
    )
    extras = []
    if row.idle_warnings or row.keeps or row.exemptions:
        extras.append(f"{row.idle_warnings} idle warning(s), {row.keeps} keep(s), {row.exemptions} exemption(s)")
    if row.squatter_episodes or row.squatter_stops:
        extras.append(f"{row.squatter_episodes} squatter episode(s), {row.squatter_stops} stopped")
    if row.reclaims:
        extras.append(f"reclaims: {inert(row.reclaims_text())}")
    if row.wait_avg is not None:
        extras.append(f"wait {row.wait_avg:.1f} h avg")
    if row.quota_text():
        extras.append(f"holds {inert(row.quota_text())} of its quota")
    if row.budgets:
        extras.append(f"budget {inert(visible(row.budgets_text(), NOTE_CHARS))}")
    return line + (f"\n    {'; '.join(extras)}" if extras else "")


def summary(report: Report, attached: str) -> Message:
    """The report in a few Slack blocks: the total, the largest groups, the notes and where the CSV went.

    Group keys come from incident fields (editable by hand in Datadog): every name is made inert.
    """
    described = inert(report.query.describe())
    title = f"*GPU report: {described}*"
    total = report.total
    util = "-" if total.utilisation is None else f"{total.utilisation:.0f}%"
    cur = report.currency
    head = (
        f"{title}\n{total.held:,.1f} GPU-hours held{_cost(total, 'held', cur)}: "
        f"{total.busy:,.1f} busy{_cost(total, 'busy', cur)}, {total.idle:,.1f} idle{_cost(total, 'idle', cur)}, "
        f"{total.idle_held:,.1f} idle-held{_cost(total, 'idle_held', cur)}, "
        f"{total.unmeasured:,.1f} unmeasured{_cost(total, 'unmeasured', cur)} (never counted as idle); "
        f"utilisation {util}; {total.leases} lease(s)"
    )
    shown = report.rows[:MAX_SUMMARY_ROWS]
    rows = "\n".join(_row_line(r, cur) for r in shown) or "no GPU-hours in this period"
    if len(report.rows) > len(shown):
        rows += f"\n… and {len(report.rows) - len(shown)} more in the CSV"
    notes = [visible(n, NOTE_CHARS) for n in report.notes]
    if report.reasons:
        rows += f"\nreasons: {inert(reasons.reasons_text(report.reasons))}"
    blocks = [section(head), section(rows), context(inert(" · ".join([*notes, attached])))]
    return Message(f"GPU report: {described}: {total.held:,.1f} GPU-hours held", blocks)


def _scope(ctx: LeaseContext, user: str, word: str | None) -> tuple[str | None, str | None, bool]:
    """(team, project, operator) the asker may see; NotAllowed or ValidationFailed otherwise."""
    membership = ctx.membership()
    try:
        operator = membership.is_operator(user)
    except UpstreamError as exc:
        raise MembershipUnavailable(f"Slack could not say who the GPU operators are ({exc}); try again") from None
    name = validate_name("team", word) if word else None
    if name is not None and name in ctx.farm.teams:
        membership.check(user, name, f"see team {name}'s report")
        return name, None, operator
    if name is not None:
        return None, name, operator
    if operator or not ctx.farm.membership_checked:
        return None, None, operator
    mine = membership.teams_of(user)
    if len(mine) == 1:
        return mine[0], None, operator
    if not mine:
        raise NotAllowed("you are in no team, so there is no report of yours; ask the GPU operators")
    raise ValidationFailed("team", f"say which team: /gpu report {mine[0]} (your teams: {', '.join(mine)})")


def report_answer(ctx: LeaseContext, user: str, word: str | None) -> Message:
    """Build the report the asker may see, DM them its CSV, and answer with the summary."""
    with ctx.reading():
        team, project, operator = _scope(ctx, user, word)
        by = GroupBy.PROJECT if team is not None else GroupBy.TEAM
        report = make_report(
            ctx.incidents,
            FarmView.of(ctx.farm),
            ctx.now(),
            since=SINCE,
            by=by.value,
            team=team,
            project=project,
            card=ctx.rate_card(),
        )
        if project is not None and not operator and ctx.farm.membership_checked:
            mine = set(ctx.membership().teams_of(user))
            others = sorted(r.key for r in report.rows if r.leases and r.key not in mine)
            if others:
                raise NotAllowed(
                    f"project {project} holds GPUs of team {', '.join(others)}; only their members or the GPU "
                    "operators can see its report"
                )
    scope = team or project or "farm"
    filename = f"gpufarm-report-{scope}-{report.query.period.end.strftime('%Y-%m-%d')}.csv"
    try:
        channel = ctx.chat.open_dm(user)
        ctx.chat.upload_file(
            channel,
            filename,
            render_csv(report).encode(),
            title=f"GPU report: {report.query.describe()}",
            initial_comment=(
                f"GPU report: {inert(report.query.describe())} (CSV, one line per {by.value} and the total)"
            ),
        )
        attached = f"CSV `{filename}` sent to you in a direct message"
    except UpstreamError as exc:
        log.warning("report CSV for %s could not be uploaded: %s", user, exc)
        attached = f"the CSV could not be attached ({exc}); ask again in a minute"
    return summary(report, attached)
