"""The squatter monitor's alerts on a lease: tell once per episode, stop after the grace where the pool says so,
end the episode on recovery (gpufarm.core.squatters.episodes holds the rules; this carries them out).

Each runs as a squatter command in the lease's pool group (gpufarm.core.commands.executor), so the lease has one
writer. The episode's state is the lease's `gpufarm_squatters` field, written with a history line in one PATCH;
posts go first and the record after (as an idle warning, gpufarm.core.idle.delivery): a post that fails is logged
and the record still lands, so a retried webhook never posts again. A squatter on a device no lease holds has no
incident to keep state in: the operators alone are told, once per monitor notification (the command's dedup id is
the alert's id, transition and time, so Datadog's retries of one notification collapse in the queue).

Stop-after: the monitor re-notifies while the group stays in alert (gpufarm.setup.squatter_monitor), and the
re-notification past the grace publishes `gpufarm_stop:<uuid>/<since>` on the host, unless the host carries
`gpufarm_exempt:squatters`. The host's node agent stops only processes that squat that device now and started by
`since` (gpufarm_node.squatter_stops). The recovery removes the tag.
"""

from __future__ import annotations

import logging
from datetime import datetime

from gpufarm.core.chat import squatter_notices as notices
from gpufarm.core.config.squatters import REPORT, SquatterPolicy
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step as HistoryStep
from gpufarm.core.kernel.hosts import EXEMPT_SQUATTERS_TAG, MAX_STOP_TAGS, STOP_KEY, stop_tag, tag_values
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.serial import SquatterScope
from gpufarm.core.squatters import episodes, who
from gpufarm.core.squatters.episodes import Episode, Step

log = logging.getLogger(__name__)


def policy_of(ctx: LeaseContext, alloc: Allocation) -> SquatterPolicy:
    """The squatter policy of the lease's pool (report where the pool is unknown)."""
    env = ctx.farm.environments.get(alloc.environment or "")
    return env.squatters if env is not None else REPORT


@invocation
def squatter_alerted(ctx: LeaseContext, ir: int, scope: SquatterScope) -> Outcome:
    """The squatter monitor says a device of the lease is squatted: open the episode (tell once), or stop its
    squatter once the grace is over (stop-after), or nothing."""
    alloc = ctx.get(ir)
    if alloc.state is State.RESOLVED:
        return Outcome(ir, f"nothing to do: {alloc.ir_label} has ended")
    host = _held_host(alloc, scope.host)
    if host is None:
        return Outcome(ir, f"ignored: {scope.host} is not held by {alloc.ir_label}")
    now = ctx.now()
    policy = policy_of(ctx, alloc)
    part = episodes.part_of(scope.host, scope.device)
    open_now = episodes.decode(alloc.squatters)
    exempt = _exempt(ctx, host) if policy.stops else False
    step, episode = episodes.decide_alert(open_now, part, now, policy, exempt=exempt)
    if step is Step.NOTHING:
        return Outcome(ir, f"nothing to do: the squatter on {part} was told at {episode.since:%H:%M}")
    if step is Step.OPEN:
        return _open(ctx, alloc, scope, episode, policy, exempt=exempt, open_now=open_now)
    return _stop(ctx, alloc, host, episode, policy, open_now=open_now)


@invocation
def squatter_cleared(ctx: LeaseContext, ir: int, scope: SquatterScope) -> Outcome:
    """The squatter monitor's group recovered: the episode ends (its stop tag goes); the next alert is a new one."""
    alloc = ctx.get(ir)
    part = episodes.part_of(scope.host, scope.device)
    open_now = episodes.decode(alloc.squatters)
    episode = open_now.pop(part, None)
    if episode is None:
        return Outcome(ir, f"nothing to do: no squatter episode open on {part}")
    if episode.stop_at is not None:
        _lift_stop(ctx, _held_host(alloc, scope.host) or scope.host, episode)
    minutes = episodes.minutes_between(episode.since, ctx.now())
    stopped = " (stopped)" if episode.stop_at is not None else ""
    entry = ctx.step(history.MONITOR, HistoryStep.SQUATTER_CLEARED, f"on {part} after {minutes} min{stopped}")
    _record(ctx, alloc, open_now, entry)
    return Outcome(ir, f"squatter episode on {part} ended after {minutes} min")


def unheld_alert(ctx: LeaseContext, scope: SquatterScope) -> str:
    """A squatter on a device no lease holds: the operators alone are told (no incident keeps the episode)."""
    facts = notices.SquatterFacts(
        scope.host,
        scope.device,
        ctx.now(),
        who.seen_on(ctx.usage, scope.host, scope.device, ctx.now()),
        count=int(scope.value) if scope.value is not None else None,
    )
    ctx.post_operators(notices.squatter_to_operators(None, facts, ctx.links))
    return f"told the operators: squatter on {scope.host} {scope.device} (no lease)"


def _open(
    ctx: LeaseContext,
    alloc: Allocation,
    scope: SquatterScope,
    episode: Episode,
    policy: SquatterPolicy,
    *,
    exempt: bool,
    open_now: dict[str, Episode],
) -> Outcome:
    seen = who.seen_on(ctx.usage, scope.host, scope.device, episode.since)
    stop_at = None if exempt else episodes.stop_due(episode, policy)
    count = int(scope.value) if scope.value is not None else None
    facts = notices.SquatterFacts(scope.host, scope.device, episode.since, seen, count, stop_at, exempt)
    links = ctx.links_for(alloc)
    # Told first, recorded after: the grace (and so the stop) runs from a notice that was sent.
    ctx.post_operators(notices.squatter_to_operators(alloc, facts, links))
    ctx.tell(alloc.requester, notices.squatter_to_holder(alloc, facts, links))
    who_text = "; ".join(s.describe() for s in seen[:3]).replace("`", "") or f"{count or 'some'} process(es)"
    entry = ctx.step(history.MONITOR, HistoryStep.SQUATTED, f"on {episode.part}", who_text)
    _record(ctx, alloc, {**open_now, episode.part: episode}, entry)
    return Outcome(alloc.ir, f"squatter on {episode.part} told")


def _stop(
    ctx: LeaseContext,
    alloc: Allocation,
    host: str,
    episode: Episode,
    policy: SquatterPolicy,
    *,
    open_now: dict[str, Episode],
) -> Outcome:
    if not _publish_stop(ctx, host, episode):
        return Outcome(alloc.ir, f"stop not published on {host}: unknown, or it holds {MAX_STOP_TAGS} stops already")
    facts = notices.SquatterFacts(host, episode.device, episode.since, stop_at=episode.stop_at)
    links = ctx.links_for(alloc)
    message = notices.squatter_stopped(alloc, facts, policy.grace_minutes, links)
    ctx.post_operators(message)
    ctx.tell(alloc.requester, message)
    entry = ctx.step(
        history.MONITOR, HistoryStep.SQUATTER_STOPPED, f"on {episode.part}", f"after {policy.grace_minutes} min grace"
    )
    _record(ctx, alloc, {**open_now, episode.part: episode}, entry)
    return Outcome(alloc.ir, f"squatter on {episode.part} stopped after {policy.grace_minutes} min")


def _record(ctx: LeaseContext, alloc: Allocation, open_now: dict[str, Episode], entry: history.Entry) -> None:
    """The lease's open episodes and the step's history line, in one PATCH (the command's id with them)."""
    values: dict[str, object] = {
        f.SQUATTERS: episodes.encode(open_now),
        f.HISTORY: history.appended(alloc.history, entry),
    }
    ctx.write_fields(alloc, values)


def _exempt(ctx: LeaseContext, host: str) -> bool:
    """Whether an operator exempted the host from squatter stops; a host Datadog does not know is not stopped."""
    tags = ctx.user_tags(host)
    return tags is None or EXEMPT_SQUATTERS_TAG in tags


def _held_host(alloc: Allocation, host: str) -> str | None:
    """The lease's host the alert names (Datadog lowercases tags, the lease keeps the host's own spelling)."""
    return next((h for h in alloc.hosts if h.lower() == host.lower()), None)


def _publish_stop(ctx: LeaseContext, host: str, episode: Episode) -> bool:
    """Add the episode's stop tag to its host (at most MAX_STOP_TAGS there); False when the host is full."""
    tags = ctx.user_tags(host)
    if tags is None:
        return False
    tag = stop_tag(episode.device, _epoch(episode.since))
    if tag in tags:
        return True
    if len(tag_values(tags, STOP_KEY)) >= MAX_STOP_TAGS:
        log.warning("host %s holds %d squatter stops; no more", host, MAX_STOP_TAGS)
        return False
    ctx.put_tags(host, [*tags, tag])
    return True


def _lift_stop(ctx: LeaseContext, host: str, episode: Episode) -> None:
    """Remove the episode's stop tag from its host (and any other stop of that device's)."""
    tags = ctx.user_tags(host)
    if tags is None:
        return
    prefix = f"{STOP_KEY}:{episode.device}/"
    kept = [t for t in tags if not t.startswith(prefix)]
    if kept != tags:
        ctx.put_tags(host, kept)


def _epoch(moment: datetime) -> int:
    return int(moment.timestamp())
