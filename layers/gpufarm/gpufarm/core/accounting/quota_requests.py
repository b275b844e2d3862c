"""Quota changes asked in chat: `/gpu quota request team=nlp +16 H100 env=onprem-hpc until 2027-01-31 reason=...`.

The worker validates the ask against the farm (an unknown team, pool or model, a model the pool lacks, a change of
zero, an end not in the future or past MAX_DAYS, no reason, or a quota the change would take below zero: a clear
error, nothing created), creates the override's incident once per Slack request (phase requested;
gpufarm.core.accounting.overrides) and posts the operators' card with the team's use and the pool's capacity, with
Approve / Reject. Those buttons and `/gpu approve|reject IR-n` are the lease's own commands, run in the pool's queue
group: `requests.approve` and `requests.reject` hand an override to `approve` and `reject` here, which check again
(still in the future, still not below zero), write the decision and its approver in the history, and tell the
asker. An approved change applies at once and ends at its `until`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpufarm.core.accounting import overrides
from gpufarm.core.chat.block_kit import ACTION_APPROVE, ACTION_REJECT, Message, actions, button, context, section
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance.policy import Action, authorize, team_usage
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.errors import Conflict, GpufarmError, ValidationFailed
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import MAX_GPU_COUNT, QUOTA_OVERRIDE, Allocation, isoformat
from gpufarm.core.kernel.reasons import Reason, ReasonCode

MAX_DAYS = 366
MAX_REASON = 300
_DELTA = re.compile(r"^[+-][0-9]{1,5}$")
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2})?Z?)?$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:\-]{8,80}$")


@dataclass(frozen=True)
class QuotaAsk:
    """A validated quota change, before anything is created."""

    team: str
    environment: str
    gpu_model: str
    delta: int
    until: datetime
    reason: str

    def title(self) -> str:
        """The incident's title."""
        return f"Quota change: {self.team} {self.delta:+d} {self.gpu_model} ({self.environment}) until {self.day()}"

    def day(self) -> str:
        """The end as the asker wrote it, to the minute."""
        return self.until.strftime("%Y-%m-%d %H:%M UTC")


def build(values: Mapping[str, str], farm: FarmConfig, now: datetime) -> QuotaAsk:
    """Validate a quota change's words against the farm; ValidationFailed naming the first bad one."""
    team = _required(values, "team", "say whose quota: team=nlp").lower()
    farm.team(team)
    env_name = _required(values, "environment", "say which pool: env=onprem-hpc").lower()
    env = farm.environment(env_name)
    model = farm.model(_required(values, "gpu_model", "say which GPU model, e.g. +16 H100"))
    if model not in env.gpu_models:
        raise ValidationFailed("gpu_model", f"{env_name} offers no {model}")
    text = _required(values, "delta", "say the change with its sign, e.g. +16 or -8")
    if not _DELTA.match(text) or int(text) == 0 or abs(int(text)) > MAX_GPU_COUNT:
        raise ValidationFailed("delta", f"the change is a signed number of GPUs up to {MAX_GPU_COUNT}, e.g. +16 or -8")
    until = _until(_required(values, "until", "say until when: until 2027-01-31"), now)
    reason = " ".join(_required(values, "reason", "say why: reason=...").split())
    if len(reason) > MAX_REASON or any(not ch.isprintable() for ch in reason):
        raise ValidationFailed("reason", f"the reason is at most {MAX_REASON} printable characters")
    return QuotaAsk(team, env_name, model, int(text), until, reason)


def resulting(farm: FarmConfig, ask: QuotaAsk) -> tuple[int, int]:
    """The team's quota for the model in the pool now (the file plus changes in effect) and after this one."""
    quota = farm.quota(ask.team, ask.environment, ask.gpu_model)
    now = quota.gpus if quota is not None else 0
    return now, now + ask.delta


@invocation
def ask(ctx: LeaseContext, requester: str, values: Mapping[str, str], *, request_id: str) -> Message:
    """Validate, create the override's incident (once per Slack request) and ask the operators."""
    if not _REQUEST_ID.match(request_id or ""):
        raise ValidationFailed("request", "the quota change carries no request id; ask again")
    change = build(values, ctx.farm, ctx.now())
    if requester not in ctx.operators():
        ctx.membership().check(requester, change.team, f"ask for a quota change for team {change.team}")
    before, after = resulting(overrides.effective_farm(ctx, change.environment, change.team), change)
    if after < 0:
        raise ValidationFailed(
            "delta",
            f"team {change.team}'s quota for {change.gpu_model} in {change.environment} is {before}; "
            f"{change.delta:+d} would make it {after}. Nothing was asked",
        )
    record = ctx.incidents.find_by_request_id(request_id)
    if record is None:
        asked = f"{change.delta:+d} {change.gpu_model} in {change.environment} for team {change.team} until "
        entry = history.entry(ctx.now(), requester, Step.REQUESTED, asked + isoformat(change.until), change.reason)
        record = ctx.incidents.create(
            change.title()[:250],
            {
                f.STATE: State.ACTIVE.value,
                f.PHASE: Phase.REQUESTED.value,
                f.KIND: QUOTA_OVERRIDE,
                f.TEAM: change.team,
                f.ENVIRONMENT: change.environment,
                f.GPU_MODEL: change.gpu_model,
                f.QUOTA_DELTA: f"{change.delta:+d}",
                f.QUOTA_UNTIL: isoformat(change.until),
                f.REQUESTER: requester,
                f.PURPOSE: change.reason,
                f.REQUEST_ID: request_id,
                f.HISTORY: [entry.line()],
            },
            initial_note=f"Quota change asked from Slack by <@{requester}>",
        )
        alloc = Allocation.from_record(record)
        _post_card(ctx, alloc, change, before, after)
    alloc = Allocation.from_record(record)
    text = (
        f"{alloc.ir_label}: your quota change ({change.delta:+d} {change.gpu_model} in {change.environment} for team "
        f"{change.team}, {before} → {after}, until {change.day()}) is with the GPU operators."
    )
    return Message(text, [section(inert(text))])


def _post_card(ctx: LeaseContext, alloc: Allocation, change: QuotaAsk, before: int, after: int) -> None:
    """The operators' card: the ask, the team's use, the pool's capacity, Approve / Reject; its place recorded."""
    if not ctx.operators_channel:
        return
    message = card(ctx, alloc, change, before, after)
    ts = ctx.chat.post_message(ctx.operators_channel, message.text, message.blocks)
    step = ctx.step(history.GPUFARM, Step.ASKED, "quota change for an operator")
    ctx.write_fields(
        alloc, {f.SLACK_MESSAGE: f"{ctx.operators_channel}/{ts}", f.HISTORY: history.appended(alloc.history, step)}
    )


def card(ctx: LeaseContext, alloc: Allocation, change: QuotaAsk, before: int, after: int) -> Message:
    """The operators' card for a quota change."""
    env, model = change.environment, change.gpu_model
    try:
        held: str = str(team_usage(ctx.live(env, change.team), change.team, env, model, charge=ctx.held))
    except GpufarmError:
        held = "unknown"
    try:
        free, total = ctx.inventory_summary().get((env, model), (0, 0))
        pool = f"{free} of {total} {model} free"
    except GpufarmError:
        pool = "capacity unavailable"
    text = (
        f"*{alloc.ir_label}*: {mention(alloc.requester)} asks to change team `{inert(change.team)}`'s quota for "
        f"{inert(model)} in `{inert(env)}` by {change.delta:+d} ({before} → {after}) until {change.day()}."
    )
    facts = f"• Team holds {held} {inert(model)} there\n• Pool `{inert(env)}` now: {pool}"
    value = alloc.ir_label
    return Message(
        f"{alloc.ir_label}: quota change needs approval",
        [
            section(text),
            section(facts),
            context(inert(change.reason)),
            actions(
                f"decide:{alloc.ir}",
                button("Approve", ACTION_APPROVE, value, "primary"),
                button("Reject", ACTION_REJECT, value, "danger"),
            ),
        ],
    )


def approve(ctx: LeaseContext, alloc: Allocation, actor: str) -> Message:
    """An operator approves a quota change: in effect at once, its approver and the new quota on record."""
    authorize(Action.APPROVE, actor, ctx.operators())
    _expect_asked(alloc, "approved")
    if alloc.quota_until is None or alloc.quota_until <= ctx.now():
        raise Conflict(f"{alloc.ir_label} cannot be approved: its end has passed")
    change = _of(alloc)
    before, after = resulting(overrides.effective_farm(ctx, change.environment, change.team), change)
    if after < 0:
        raise Conflict(f"{alloc.ir_label} cannot be approved: it would take the quota from {before} to {after}")
    reason = Reason(
        ReasonCode.QUOTA_CHANGED,
        f"team {change.team}'s quota for {change.gpu_model} in {change.environment} is {after} "
        f"({before} {change.delta:+d}) until {isoformat(change.until)}, approved by {actor}",
    )
    step = ctx.step(actor, Step.APPROVED, reason.line())
    updated = ctx.write(alloc, Phase.ALLOCATED, {f.APPROVED_BY: actor}, check=False, step=step)
    outcome = f"Approved by {mention(actor)}: quota {before} → {after} until {change.day()}"
    _update_card(ctx, updated, outcome)
    told = f"{alloc.ir_label}: your quota change is approved by {mention(actor)}: {inert(reason.sentence)}."
    ctx.tell(updated.requester, Message(told, [section(told)]))
    return Message(inert(f"{alloc.ir_label} approved: {reason.sentence}."))


def reject(ctx: LeaseContext, alloc: Allocation, actor: str, reason: str | None) -> Message:
    """An operator rejects a quota change, with a reason on record."""
    authorize(Action.REJECT, actor, ctx.operators())
    _expect_asked(alloc, "rejected")
    step = ctx.step(actor, Step.REJECTED, f"reason: {reason}" if reason else "no reason given")
    updated = ctx.write(alloc, Phase.REJECTED, {}, step=step)
    _update_card(ctx, updated, f"Rejected by {mention(actor)}" + (f": {inert(reason)}" if reason else ""))
    told = f"{alloc.ir_label}: your quota change is rejected by {mention(actor)}" + (
        f": {inert(reason)}" if reason else "."
    )
    ctx.tell(updated.requester, Message(told, [section(told)]))
    return Message(f"{alloc.ir_label} rejected.")


def _update_card(ctx: LeaseContext, alloc: Allocation, outcome: str) -> None:
    channel, _, ts = (alloc.slack_message or "").partition("/")
    if not channel or not ts:
        return
    text = f"*{alloc.ir_label}* ({inert(alloc.title)}): {outcome}"
    try:
        ctx.chat.update_message(channel, ts, f"{alloc.ir_label}: {outcome}", [section(text)])
    except GpufarmError:
        return  # the decision is in the incident; a stale card must not undo it


def _expect_asked(alloc: Allocation, verb: str) -> None:
    if alloc.state is State.RESOLVED or alloc.phase is not Phase.REQUESTED:
        raise Conflict(f"{alloc.ir_label} cannot be {verb}: the quota change is already {alloc.phase.value}")


def _of(alloc: Allocation) -> QuotaAsk:
    """The change an override's incident asks for."""
    if alloc.quota_delta is None or alloc.quota_until is None or not (alloc.team and alloc.environment):
        raise Conflict(f"{alloc.ir_label} is not a complete quota change")
    model = (alloc.gpu_model or "").upper()
    return QuotaAsk(alloc.team, alloc.environment, model, alloc.quota_delta, alloc.quota_until, alloc.purpose or "")


def _required(values: Mapping[str, str], name: str, hint: str) -> str:
    value = (values.get(name) or "").strip()
    if not value:
        raise ValidationFailed(name, hint)
    return value


def _until(text: str, now: datetime) -> datetime:
    if not _DATE.match(text):
        raise ValidationFailed("until", "give the end as a date, e.g. until 2027-01-31 (UTC)")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "").replace(" ", "T")).replace(tzinfo=UTC)
    except ValueError:
        raise ValidationFailed("until", f"'{text}' is not a date") from None
    if moment <= now:
        raise ValidationFailed("until", f"the end {isoformat(moment)} has passed; give a date in the future")
    if moment > now + timedelta(days=MAX_DAYS):
        raise ValidationFailed("until", f"a quota change lasts at most {MAX_DAYS} days")
    return moment
