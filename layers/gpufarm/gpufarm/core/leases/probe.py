"""`gpufarm doctor`'s probe incidents: scratch incidents of gpufarm's type that no part of gpufarm treats as a lease.

A probe is created ended (resolved, rejected), so no live read, quota, sweep or report counts it. When the incident
webhook brings one to the pool's queue, the consumer records how the call arrived (where its token was, how its
fields were encoded, which change triggered it) in the probe's history, and does nothing else: the doctor reads
that line back to tell a confirmed behaviour from a fallback.
"""

from __future__ import annotations

from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.context.outcome import Outcome
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.model import PROBE_PREFIX, Allocation, IncidentRecord

PROBE_REQUESTER = "gpufarm-doctor"
# A month no real lease accrues in, for the probe's accrual-month search form.
PROBE_MONTH = "1970-01"
WEBHOOK_NOTE = "webhook: "


def probe_fields(token: str, environment: str, team: str) -> dict[str, object]:
    """The fields a probe is created with: ended already, in a real pool and team so every search form finds it."""
    return {
        f.STATE: State.RESOLVED.value,
        f.PHASE: Phase.REJECTED.value,
        f.RECLAIM_REASON: ReclaimReason.CANCELLED.value,
        f.REQUEST_ID: f"{PROBE_PREFIX}{token}",
        f.REQUESTER: PROBE_REQUESTER,
        f.ENVIRONMENT: environment,
        f.TEAM: team,
        f.GPU_COUNT: "0",
        f.GPU_HOURS_BY_MONTH: [f"{PROBE_MONTH}=0.000"],
        f.GPU_HOURS_MONTHS: [PROBE_MONTH],
    }


def note_webhook(ctx: LeaseContext, alloc: Allocation, arrival: str) -> Outcome:
    """Record in the probe's history how the webhook arrived (its only write; phase and state stay as they are)."""
    step = ctx.step(history.GPUFARM, Step.PROBED, f"{WEBHOOK_NOTE}{arrival}")
    ctx.write_fields(alloc, {f.HISTORY: history.appended(alloc.history, step)})
    return Outcome(alloc.ir, "probe noted")


def webhook_seen(record: IncidentRecord) -> str | None:
    """How the latest webhook call for this probe arrived; None until one did."""
    arrivals = webhook_arrivals(record)
    return arrivals[-1] if arrivals else None


def webhook_arrivals(record: IncidentRecord) -> list[str]:
    """How each webhook call for this probe arrived, oldest first (empty until one did)."""
    seen = []
    for line in Allocation.from_record(record).history:
        entry = history.parse(line)
        if entry is not None and entry.step == Step.PROBED.value and entry.details.startswith(WEBHOOK_NOTE):
            seen.append(entry.details.removeprefix(WEBHOOK_NOTE))
    return seen
