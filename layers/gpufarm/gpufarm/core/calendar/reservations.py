"""Reservations on the pool's calendar: booked in the pool's one writer, honoured at their start, released as no-shows.

A reservation is a request incident with a window (`reserved_from`, `reserved_until`). Its decision runs where
every request's does, in the pool's queue group (gpufarm.core.leases.requests decide_request hands it here), so
two bookings racing for the last capacity resolve as a sequential order would: the second counts the first.
Admitted, it waits in phase `reserved`; at its start the sweep brings it to the allocation step like an approved
lease (gpufarm.core.leases.allocation), which ends it with its window. Meanwhile a new lease may not take the
reserved capacity (`blocks`) and a live lease may not be extended into it (`extension_refusal`).

**No-show**: a reservation's lease whose GPUs the agents saw idle and never busy through its no-show window
(the ledger's accrued GPU-hours cover the window, none busy, some idle) is released with reason `no-show` and
its hours go back to the pool. A lease nothing measured (no metrics) is never called a no-show: an outage of the
metrics must not read as an absent researcher.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from gpufarm.core.calendar.admission import Booking, decide, stamp, well_formed, window
from gpufarm.core.calendar.booking import Calendar, Limits
from gpufarm.core.calendar.booking import holds as holds  # noqa: PLC0414 - its home before
from gpufarm.core.chat.block_kit import Message, context, linked, section
from gpufarm.core.chat.escape import inert
from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.lifecycle import HOLDING, Phase, State
from gpufarm.core.kernel.model import Allocation, GpuRequest, isoformat
from gpufarm.core.kernel.reasons import Reason, ReasonCode

log = logging.getLogger(__name__)

# A pool's GPUs are counted whole (the calendar never asks "at least n").
_ALL = 1 << 30


def limits(ctx: LeaseContext, environment: str, gpu_model: str, team: str) -> Limits:
    """The pool's GPUs of the model and the team's quota there (0 without one).

    A dedicated pool's GPUs are counted per host size (a sample page and one count per size, `Reads.host_sizes`)
    rather than listed: the calendar needs the pool's whole size, and listing a pool of thousands of hosts costs a
    page per thousand."""
    shared = ctx.shared(environment)
    if not shared:
        ctx.reads().host_sizes(environment, gpu_model.upper())
    capacity = ctx.reads().capacity(environment, gpu_model.upper(), _ALL, units=shared)
    quota = ctx.farm.quota(team, environment, gpu_model)
    return Limits(capacity, quota.gpus if quota else 0)


def calendar(ctx: LeaseContext, booking: Booking, *, skip: int = 0) -> Calendar:
    """The pool's calendar for the booking's model and team, as this invocation reads the pool."""
    live = ctx.live(booking.environment)
    found = holds(live, booking.environment, booking.gpu_model, ctx.now(), skip=skip)
    return Calendar(found, limits(ctx, booking.environment, booking.gpu_model, booking.team), booking.team)


def booking_of(alloc: Allocation | GpuRequest) -> Booking | None:
    """The booking a reservation asks for; None for a lease from now."""
    if alloc.reserved_from is None or alloc.reserved_until is None:
        return None
    return Booking(
        alloc.team or "",
        alloc.environment or "",
        (alloc.gpu_model or "").upper(),
        alloc.gpu_count,
        alloc.reserved_from,
        alloc.reserved_until,
    )


def precheck(ctx: LeaseContext, request: GpuRequest) -> Reason | None:
    """The up-front check of a booking: a window in the past, too long or beyond the horizon is refused here (the
    pool read only then, for the nearest window that would fit) and creates no incident. Capacity and quota are
    weighed once, by the decision that counts in the pool's writer (`book`): the pool's live incidents are the
    booking's largest read, so it is made once."""
    booking = booking_of(request)
    if booking is None:
        return None
    policy, now = ctx.farm.reservations.policy(booking.environment), ctx.now()
    if well_formed(booking, policy, now):
        return None
    return decide(booking, calendar(ctx, booking), policy, now)


def book(ctx: LeaseContext, alloc: Allocation) -> Message:
    """The decision that counts, in the pool's queue group: reserved when the window fits, else refused."""
    booking = booking_of(alloc)
    assert booking is not None  # decide_request hands only reservations here
    policy = ctx.farm.reservations.policy(booking.environment)
    refusal = decide(booking, calendar(ctx, booking, skip=alloc.ir), policy, ctx.now())
    links = ctx.links_for(alloc)
    if refusal is not None:
        # Recorded as every refusal is (gpufarm.core.kernel.reason_trail): the field and the history's `[code]`.
        recorded = reason_trail.fields(refusal, ctx.now())
        ctx.write(
            alloc, Phase.REJECTED, recorded, step=ctx.step(history.POLICY, Step.REFUSED, reason_trail.detail(refusal))
        )
        ctx.write_fields(alloc, {}, title=f"{alloc.title} (refused: {refusal.code.value})"[:250])
        log.info("%s booking refused: %s", alloc.ir_label, refusal.code.value)
        text = f":no_entry: {alloc.ir_label} refused: {inert(refusal.line())}. Nothing was reserved."
        return linked(alloc, Message(text, [section(text)]), links)
    detail = f"{booking.what()} {window(booking.start, booking.end)} UTC"
    updated = ctx.write(
        alloc,
        Phase.RESERVED,
        {f.APPROVED_BY: "policy", f.EXPIRES_AT: isoformat(booking.end)},
        step=ctx.step(history.POLICY, Step.RESERVED, detail),
    )
    minutes = policy.no_show_minutes
    text = (
        f":calendar: *{alloc.ir_label}* reserved: {detail}. Its hosts are allocated at the start; unused for "
        f"{minutes} minutes after it, the reservation is released."
    )
    return linked(
        updated, Message(text.replace("*", ""), [section(text), context("`/gpu calendar` shows the pool")]), links
    )


def started(alloc: Allocation, now: datetime) -> bool:
    """True when a booked reservation's window has begun: the sweep brings it to the allocation step."""
    return (
        alloc.state is not State.RESOLVED
        and alloc.phase is Phase.RESERVED
        and alloc.reserved_from is not None
        and alloc.reserved_from <= now
    )


def blocks(ctx: LeaseContext, alloc: Allocation) -> Reason | None:
    """Why a lease from now may not take GPUs now: capacity reserved within its term; None when it may (or when no
    reservation overlaps its term, where allocation is as it always was)."""
    if alloc.reserved_from is not None or not alloc.environment:
        return None
    now = ctx.now()
    end = now + timedelta(days=alloc.duration_days or ctx.farm.defaults.duration_days)
    return _into_reserved(ctx, alloc, now, end, "its term")


def extension_refusal(ctx: LeaseContext, alloc: Allocation, new_end: datetime) -> Reason | None:
    """Why a live lease may not be extended to `new_end`: the capacity is reserved then; None when it may."""
    start = max(alloc.expires_at or ctx.now(), ctx.now())
    if new_end <= start or not alloc.environment:
        return None
    return _into_reserved(ctx, alloc, start, new_end, "the extension")


def _into_reserved(ctx: LeaseContext, alloc: Allocation, start: datetime, end: datetime, what: str) -> Reason | None:
    env, model = alloc.environment or "", (alloc.gpu_model or "").upper()
    # The pool's reservations first, by their phase alone (one narrow search; a reservation that began waiting at its
    # start is among the waiting requests allocation has read already): only when one overlaps is the pool read whole.
    booked = [*ctx.live(env, phases={Phase.RESERVED}), *ctx.live(env, phases={Phase.WAITING})]
    if not any(h.start < end and h.end > start for h in holds(booked, env, model, ctx.now(), skip=alloc.ir)):
        return None
    found = holds(ctx.live(env), env, model, ctx.now(), skip=alloc.ir)
    # Only the pool binds here: the lease's quota was weighed when it was granted.
    cal = Calendar(found, Limits(limits(ctx, env, model, alloc.team or "").capacity, _ALL), alloc.team or "")
    short = cal.shortfall(start, end, alloc.gpu_count)
    if short is None:
        return None
    reserved_then = sum(h.gpus for h in found if h.reserved and h.start <= short.at < h.end)
    return Reason(
        ReasonCode.RESERVED_CAPACITY,
        f"{reserved_then} {model} in {env} are reserved from {stamp(short.at)} UTC, within {what} "
        f"({stamp(start)} to {stamp(end)} UTC); {max(short.pool_free, 0)} would be free for {alloc.gpu_count}",
    )


def window_over(alloc: Allocation, now: datetime) -> bool:
    """True when a reservation that never got its hosts (booked, or waiting since its start) has seen its window end."""
    return (
        alloc.state is not State.RESOLVED
        and alloc.phase in (Phase.RESERVED, Phase.APPROVED, Phase.WAITING)
        and alloc.reserved_until is not None
        and alloc.reserved_until <= now
    )


def no_show_due(alloc: Allocation, ctx: LeaseContext, now: datetime) -> bool:
    """True when a reservation's lease went unused through its no-show window (see the module's note)."""
    if alloc.reserved_from is None or alloc.phase not in HOLDING or alloc.state is State.RESOLVED:
        return False
    since = alloc.allocated_at or alloc.reserved_from
    deadline = since + timedelta(minutes=ctx.farm.reservations.policy(alloc.environment).no_show_minutes)
    if now < deadline or alloc.hours_until is None or alloc.hours_until < deadline:
        return False
    return alloc.hours_busy == 0 and alloc.hours_idle > 0


def no_show_reason(alloc: Allocation, farm: FarmConfig) -> Reason:
    """The reason a no-show's end carries (gpufarm.core.leases.end_reasons writes it with the end)."""
    minutes = farm.reservations.policy(alloc.environment).no_show_minutes
    since = alloc.allocated_at or alloc.reserved_from
    at = f" from {stamp(since)} UTC" if since else ""
    return Reason(
        ReasonCode.NO_SHOW,
        f"its {alloc.gpu_count} {alloc.gpu_model} were idle, never busy, for the {minutes}-minute no-show window{at}; "
        f"released, its {alloc.hours_held:g} GPU-hours so far charged and the rest of the window back to the pool",
    )
