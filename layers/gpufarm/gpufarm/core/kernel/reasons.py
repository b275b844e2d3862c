"""Why a request waits, is refused, or a lease ends: a machine-readable code beside a sentence with the numbers.

Every outcome that keeps a researcher waiting or takes GPUs away carries a `Reason`: its `code` is what the history,
`/gpu status`, `/gpu why` and the reports count by; its `sentence` is what a person reads (position, what is ahead,
the earliest start, the deadline). Each capability adds the codes it decides by to `ReasonCode`, so the set stays
one vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ReasonCode(StrEnum):
    """The reasons gpufarm gives, one vocabulary for every capability."""

    # Waiting for hosts in the pool's queue (gpufarm.core.leases.allocation).
    QUEUED_CAPACITY = "queued-capacity"
    # Approved beyond quota on the pool's idle capacity, lent by teams below their quota (gpufarm.core.leases.lending).
    BORROWED = "borrowed"
    # A borrowing lease told it is taken back on notice, then taken back (gpufarm.core.leases.preemption).
    PREEMPTION_NOTICE = "preemption-notice"
    PREEMPTED = "preempted"
    # A lending team's request waits for borrowers under notice, or protected until a time (leases.preemption).
    QUEUED_PREEMPTION = "queued-preemption"
    QUEUED_PROTECTED = "queued-protected"
    # A quota change asked in chat, in effect, then ended at its end (gpufarm.core.accounting.overrides).
    QUOTA_CHANGED = "quota-changed"
    QUOTA_EXPIRED = "quota-expired"
    # Waiting because the pool's fair-share order serves other teams first (gpufarm.core.leases.ordering).
    QUEUED_FAIR_SHARE = "queued-fair-share"
    # Waiting for a GPU operator's decision: beyond the team's quota (gpufarm.core.leases.requests).
    AWAITING_OPERATOR = "awaiting-operator"
    # Refused by the policy (hard limit, capacity, budget) or rejected by an operator (gpufarm.core.leases.requests).
    REFUSED_POLICY = "refused-policy"
    REJECTED_OPERATOR = "rejected-operator"
    # Withdrawn: no hosts within the waiting limit (gpufarm.core.sync.expiry), or no operator could approve it
    # within the hard limit for the pool's policy time (gpufarm.core.leases.unapprovable).
    WITHDRAWN_WAIT_LIMIT = "withdrawn-wait-limit"
    WITHDRAWN_UNAPPROVABLE = "withdrawn-unapprovable"
    # A lease's end (gpufarm.core.leases.ending), one code per gpufarm.core.kernel.lifecycle.ReclaimReason.
    ENDED_RELEASED = "ended-released"
    ENDED_CANCELLED = "ended-cancelled"
    ENDED_EXPIRED = "ended-expired"
    RECLAIMED_IDLE = "reclaimed-idle"
    RECLAIMED_OPERATOR = "reclaimed-operator"
    RECLAIMED_IN_DATADOG = "reclaimed-in-datadog"


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason: the code to count by, the sentence to show."""

    code: ReasonCode
    sentence: str

    def line(self) -> str:
        """How a history line or a status shows it: the sentence, then the code in brackets."""
        return f"{self.sentence} [{self.code.value}]"
