"""Whether a booking fits the pool's calendar, and if not, why and what would: pure, from a `Calendar`.

A window must start now or later, last no longer than the pool's longest reservation, and end within its booking
horizon; then the pool's GPUs and the team's quota must hold the ask at every moment of it, counting the other
reservations and the expected ends of the live leases (gpufarm.core.calendar.booking). Every refusal is a
`Reason` that names the nearest window that would fit, or says none does within the horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufarm.core.calendar.booking import Calendar
from gpufarm.core.config.reservations import ReservationPolicy
from gpufarm.core.kernel.reasons import Reason, ReasonCode


@dataclass(frozen=True, slots=True)
class Booking:
    """What is asked: `gpus` of `gpu_model` in `environment` for `team` over [start, end)."""

    team: str
    environment: str
    gpu_model: str
    gpus: int
    start: datetime
    end: datetime

    @property
    def length(self) -> timedelta:
        """How long the window is."""
        return self.end - self.start

    def what(self) -> str:
        """`8 H100 in onprem-hpc`."""
        return f"{self.gpus} {self.gpu_model} in {self.environment}"


def well_formed(booking: Booking, policy: ReservationPolicy, now: datetime) -> bool:
    """True when the window starts now or later, is no longer than the policy allows and ends within the horizon:
    what can be said without reading the pool."""
    return (
        booking.start >= now - timedelta(minutes=1)
        and booking.length <= timedelta(days=policy.max_days)
        and booking.end <= now + timedelta(days=policy.horizon_days)
    )


def decide(booking: Booking, calendar: Calendar, policy: ReservationPolicy, now: datetime) -> Reason | None:
    """None when the booking fits; else the reason it does not, with the nearest window that would."""
    horizon_end = now + timedelta(days=policy.horizon_days)
    longest = timedelta(days=policy.max_days)
    if booking.start < now - timedelta(minutes=1):
        nearest = calendar.nearest(now, booking.length, booking.gpus, now, horizon_end)
        return Reason(
            ReasonCode.RESERVATION_IN_PAST,
            f"{window(booking.start, booking.end)} starts in the past (it is {stamp(now)} UTC); "
            + suggest(booking, nearest),
        )
    if booking.length > longest:
        nearest = calendar.nearest(booking.start, longest, booking.gpus, now, horizon_end)
        return Reason(
            ReasonCode.RESERVATION_TOO_LONG,
            f"{span(booking.length)} is longer than the {policy.max_days} days a reservation in "
            f"{booking.environment} may last; " + suggest(booking, nearest, longest),
        )
    if booking.end > horizon_end:
        nearest = calendar.nearest(booking.start, booking.length, booking.gpus, now, horizon_end)
        return Reason(
            ReasonCode.RESERVATION_BEYOND_HORIZON,
            f"{window(booking.start, booking.end)} ends beyond {booking.environment}'s booking horizon of "
            f"{policy.horizon_days} days (until {stamp(horizon_end)} UTC); " + suggest(booking, nearest),
        )
    short = calendar.shortfall(booking.start, booking.end, booking.gpus)
    if short is None:
        return None
    nearest = calendar.nearest(booking.start, booking.length, booking.gpus, now, horizon_end)
    if short.quota_binds:
        code = ReasonCode.RESERVATION_OVER_QUOTA
        tight = f"team {booking.team} has only {max(short.quota_left, 0)} of its {calendar.limits.quota} quota left"
    else:
        code = ReasonCode.RESERVATION_NO_CAPACITY
        tight = f"only {max(short.pool_free, 0)} of the pool's {calendar.limits.capacity} are free"
    return Reason(
        code,
        f"{booking.what()} {window(booking.start, booking.end)} does not fit: at {stamp(short.at)} UTC {tight}; "
        + suggest(booking, nearest),
    )


def suggest(booking: Booking, start: datetime | None, length: timedelta | None = None) -> str:
    """`the nearest free window is 2026-12-12 09:00 for 3d`, or that none is within the horizon."""
    if start is None:
        return f"no window of {span(length or booking.length)} for {booking.gpus} GPUs fits within the horizon"
    size = length or booking.length
    return f"the nearest free window is from {stamp(start)} for {span(size)}"


def stamp(moment: datetime) -> str:
    """`2026-12-10 09:00`, as the command takes it (UTC)."""
    return moment.strftime("%Y-%m-%d %H:%M")


def window(start: datetime, end: datetime) -> str:
    """`from 2026-12-10 09:00 for 3d`."""
    return f"from {stamp(start)} for {span(end - start)}"


def span(length: timedelta) -> str:
    """`3d` for whole days, else `36h` (rounded up to the hour)."""
    hours = math.ceil(length.total_seconds() / 3600)
    return f"{hours // 24}d" if hours % 24 == 0 else f"{hours}h"
