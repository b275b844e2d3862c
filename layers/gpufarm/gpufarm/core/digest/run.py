"""Running the operators' daily digest: is it due, one read of the farm, one post to the operators' channel.

The digest function runs every DIGEST_TICK_MINUTES (template.yaml) and posts on the first run at or after the
farm file's `digest.time` in `digest.timezone`, so the farm file alone moves the hour (and daylight saving never
does). The run's moment is the schedule's own time when the event carries it (EventBridge Scheduler's
`<aws.scheduler.scheduled-time>`), so a retry of a run decides as the run did; otherwise the clock's now.

"Since the last digest" is the span between the previous digest time and this one, both computed from the
settings: nothing is stored (docs/design.md, rule 1), a retried run reports the same window, and two digests
never count one repair twice. The reads are one view of the invocation (LeaseContext.reading): the live incidents and
the host list once, one metrics query for unattributed use, the budgets' searches (gpufarm.core.accounting.budgets),
and, for the squatter section and the day's money, one search of the leases that ended after accruing in the
window's months (as the budgets read ended leases), at most MAX_ENDED, of which those resolved since the window
began are kept; for the outlook line, one search of the requests that ended with a reason in the window's months
(refused, withdrawn), at most MAX_ENDED.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gpufarm.core.accounting import budgets, overrides
from gpufarm.core.config.digest import DIGEST_TICK_MINUTES, DigestSettings
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.digest.build import DigestFacts, QuotaUse, build
from gpufarm.core.governance.policy import team_usage
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.search import IncidentQuery, ended_query
from gpufarm.core.leases import fair_share
from gpufarm.core.leases.ordering import Order
from gpufarm.core.squatters.counts import squatted

if TYPE_CHECKING:
    from gpufarm.core.kernel.ports import MetricsQuery

log = logging.getLogger(__name__)

UNATTRIBUTED_METRIC = "gpufarm.ledger.gpus.unattributed"
# The sync's gauge of busy devices no lease claims (gpufarm.core.accounting.series.ledger_series); its peak per host
# since the last digest, so a night of unattributed use is not missed by a morning reading.
UNATTRIBUTED_QUERY = f"max:{UNATTRIBUTED_METRIC}{{*}} by {{host,team,environment}}"
MAX_UNATTRIBUTED = 10_000
# Ended leases the squatter section reads at most (a day's window: a farm ending more is read up to this many).
MAX_ENDED = 5_000


@dataclass(frozen=True)
class DigestRun:
    """What one run did: posted or why not, the digest's time and window, and how many lines each section had."""

    posted: bool
    reason: str
    slot: datetime | None = None
    since: datetime | None = None
    ts: str | None = None
    sections: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """A JSON-able account for the function's answer and log."""
        return {
            "posted": self.posted,
            "reason": self.reason,
            "slot": self.slot.isoformat() if self.slot else None,
            "since": self.since.isoformat() if self.since else None,
            "ts": self.ts,
            "sections": dict(self.sections),
        }


def digest_time_on(day: datetime, settings: DigestSettings) -> datetime:
    """The digest's time on the local calendar day of `day` (timezone-aware)."""
    local = day.astimezone(settings.zone())
    at = settings.local_time()
    # In UTC: arithmetic between two times of one ZoneInfo is wall-clock arithmetic, blind to daylight saving.
    return local.replace(hour=at.hour, minute=at.minute, second=0, microsecond=0).astimezone(UTC)


def latest_slot(moment: datetime, settings: DigestSettings) -> datetime:
    """The last digest time at or before `moment`."""
    today = digest_time_on(moment, settings)
    if today <= moment:
        return today
    return previous_slot(today, settings)


def previous_slot(slot: datetime, settings: DigestSettings) -> datetime:
    """The digest time of the local day before `slot`'s (23 or 25 hours before across daylight saving)."""
    return digest_time_on(slot.astimezone(settings.zone()).replace(hour=12) - timedelta(days=1), settings)


def due_slot(moment: datetime, settings: DigestSettings) -> datetime | None:
    """The digest time this run posts for: the latest one when it passed less than one tick ago, else None."""
    slot = latest_slot(moment, settings)
    return slot if moment - slot < timedelta(minutes=DIGEST_TICK_MINUTES) else None


def unattributed(
    query: MetricsQuery | None, since: datetime, until: datetime
) -> dict[tuple[str, str, str], float] | None:
    """Peak busy GPUs no lease claims per (host, team, pool) over the window; None when it cannot be read."""
    if query is None or until <= since:
        return None
    try:
        results = query.scalar(UNATTRIBUTED_QUERY, since, until, aggregator="max")
    except GpufarmError as exc:
        log.warning("unattributed use could not be read for the digest: %s", exc)
        return None
    out: dict[tuple[str, str, str], float] = {}
    for result in results[:MAX_UNATTRIBUTED]:
        tags = dict(t.partition(":")[::2] for t in result.group_tags)
        host = tags.get("host", "")
        if not host or result.value is None or not 0 < result.value <= 1024:
            continue
        out[(host, tags.get("team", ""), tags.get("environment", ""))] = float(result.value)
    return out


def window_months(since: datetime, until: datetime) -> list[str]:
    """The `YYYY-MM` months (UTC) a window touches: a digest's day spans two at a month's turn."""
    return sorted({f"{m.year:04d}-{m.month:02d}" for m in (since.astimezone(UTC), until.astimezone(UTC))})


def ended_squatted(ctx: LeaseContext, since: datetime, until: datetime) -> list[Allocation]:
    """Leases resolved since `since` whose history holds squatting (of ended_in_window)."""
    return [a for a in ended_in_window(ctx, since, until) if squatted(a)]


def ended_in_window(ctx: LeaseContext, since: datetime, until: datetime) -> list[Allocation]:
    """Leases resolved since `since`: one search of the leases that ended after accruing in the window's months,
    read up to MAX_ENDED; [] when it cannot be read (said in the log)."""
    query = ended_query(window_months(since, until))
    found: list[Allocation] = []
    try:
        for index, record in enumerate(ctx.incidents.search(query)):
            if index >= MAX_ENDED:
                log.warning(
                    "digest: more than %d leases ended in the window; the rest's squatting and hours not counted",
                    MAX_ENDED,
                )
                break
            if record.resolved is not None and record.resolved < since:
                continue
            found.append(Allocation.from_record(record))
    except GpufarmError as exc:
        log.warning("ended leases could not be read for the digest (squatters, the day's money): %s", exc)
        return []
    return found


def ended_unmet(ctx: LeaseContext, since: datetime, until: datetime) -> list[LeaseFacts]:
    """Requests that ended with a reason in the window's months (the outlook's refusals and withdrawals): one search,
    read up to MAX_ENDED; [] when it cannot be read (said in the log)."""
    query = IncidentQuery.where({State.RESOLVED}, gpufarm_reason_month=window_months(since, until))
    found: list[LeaseFacts] = []
    try:
        for index, record in enumerate(ctx.incidents.search(query)):
            if index >= MAX_ENDED:
                log.warning("digest: more than %d requests ended in the window; the rest not in the outlook", MAX_ENDED)
                break
            if record.resolved is None or record.resolved >= since:
                found.append(LeaseFacts.decode(record.public_id, record.state, record.fields, record.modified))
    except GpufarmError as exc:
        log.warning("ended requests could not be read for the digest's outlook: %s", exc)
        return []
    return found


def gather(ctx: LeaseContext, since: datetime, until: datetime) -> DigestFacts:
    """The digest's facts from this invocation's one view of the farm (see the module docstring)."""
    now = ctx.now()
    live = ctx.live()
    # The quotas as decisions read them: the farm file's plus the changes in effect.
    changes = overrides.live(ctx)
    quotas = [
        QuotaUse(name, env, model, team_usage(live, name, env, model, charge=ctx.held), q.gpus, q.hard_limit)
        for name, spec in sorted(overrides.apply(ctx.farm, changes).teams.items())
        for env, models in sorted(spec.quotas.items())
        for model, q in sorted(models.items())
    ]
    burned: list[budgets.Burn] | None
    try:
        burned = budgets.burns(ctx, ctx.farm.budgets)
    except GpufarmError as exc:
        log.warning("budgets could not be read for the digest: %s", exc)
        burned = None
    return DigestFacts(
        now=now,
        since=since,
        until=until,
        leases=live,
        farm=ctx.farm,
        ended=ended_in_window(ctx, since, until),
        capacity=ctx.inventory_summary(),
        quotas=quotas,
        burns=burned,
        unattributed=unattributed(ctx.usage, since, now),
        changes=changes,
        orders=_orders(ctx, live),
        unmet=ended_unmet(ctx, since, until),
        card=ctx.rate_card(),
    )


def _orders(ctx: LeaseContext, live: Sequence[Allocation]) -> dict[tuple[str, str], Order]:
    """The order of each pool queue that has a request waiting (FIFO pools read nothing)."""
    pools = {(a.environment or "", (a.gpu_model or "").upper()) for a in live if a.phase is Phase.WAITING}
    return {pool: fair_share.pool_order(ctx, *pool) for pool in sorted(pools)}


def run(ctx: LeaseContext, *, at: datetime | None = None, force: bool = False) -> DigestRun:
    """Post the digest when it is due at `at` (the schedule's time, else now), or at once with `force`.

    Raises UpstreamError when Slack refuses the post, so the scheduler retries the run; nothing else is written.
    """
    settings = ctx.farm.digest
    moment = at or ctx.now()
    slot = moment if force else due_slot(moment, settings)
    if slot is None:
        return DigestRun(False, f"not digest time (the digest is at {settings.time} {settings.timezone})")
    if not ctx.operators_channel:
        log.warning("the daily digest has no operators channel to go to")
        return DigestRun(False, "no operators channel is configured", slot)
    since = previous_slot(slot, settings)
    if force:
        # By hand: the window since the last scheduled digest.
        since = latest_slot(moment, settings)
        since = since if since < moment else previous_slot(since, settings)
    with ctx.reading():
        facts = gather(ctx, since, slot)
    digest = build(facts, settings, ctx.links)
    if digest is None:
        return DigestRun(False, "nothing to say", slot, since)
    ts = ctx.chat.post_message(ctx.operators_channel, digest.message.text, digest.message.blocks)
    return DigestRun(True, "posted", slot, since, ts, digest.counts)
