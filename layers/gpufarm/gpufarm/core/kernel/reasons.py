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


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason: the code to count by, the sentence to show."""

    code: ReasonCode
    sentence: str

    def line(self) -> str:
        """How a history line or a status shows it: the sentence, then the code in brackets."""
        return f"{self.sentence} [{self.code.value}]"
