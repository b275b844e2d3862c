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
    # Reservations on the pool's calendar (gpufarm.core.calendar): a booking refused for capacity, quota, horizon,
    # length or a past start; a lease held back or an extension refused because the capacity is reserved; a
    # reservation released as a no-show.
    RESERVATION_NO_CAPACITY = "reservation-no-capacity"
    RESERVATION_OVER_QUOTA = "reservation-over-quota"
    RESERVATION_BEYOND_HORIZON = "reservation-beyond-horizon"
    RESERVATION_TOO_LONG = "reservation-too-long"
    RESERVATION_IN_PAST = "reservation-in-past"
    RESERVED_CAPACITY = "reserved-capacity"
    NO_SHOW = "no-show"


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason: the code to count by, the sentence to show."""

    code: ReasonCode
    sentence: str

    def line(self) -> str:
        """How a history line or a status shows it: the sentence, then the code in brackets."""
        return f"{self.sentence} [{self.code.value}]"
