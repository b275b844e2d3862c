"""Upload tokens for a lease: `/gpu profile-token IR-n` mints one, and whoever accepts an upload checks it here.

A token (gpufarm.core.kernel.upload_token) proves that gpufarm gave `user` the right to upload profiler runs to one
lease until an expiry, at most MAX_LIFETIME away and never past the lease's end. It is given only to those who may
upload to the lease now (its requester, or a member of its team: gpufarm.core.leases.profile_runs.check_uploader),
and only after the same visibility check as `/gpu status`, so someone of another team learns nothing but "IR-n
belongs to another team". The answer is ephemeral, to the asker alone; no channel message ever carries a token.

A valid signature is not enough to upload: `check_for_lease` re-reads the lease's rule when the token is used, so
a token is dead once its lease has ended or its user has left the team, and is never good for another lease.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufarm.core.chat.block_kit import Message, section
from gpufarm.core.context.lease_context import LeaseContext, invocation
from gpufarm.core.governance import visibility
from gpufarm.core.governance.membership import Membership
from gpufarm.core.kernel.errors import Conflict
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.model import Allocation, isoformat
from gpufarm.core.kernel.upload_token import Claims, InvalidUploadToken, mint
from gpufarm.core.leases.profile_runs import check_uploader

# The longest a token lives: a leaked one is useless by the next day even on a long lease.
MAX_LIFETIME = timedelta(hours=24)


def expiry(alloc: Allocation, now: datetime) -> datetime:
    """When a token minted `now` for `alloc` stops: MAX_LIFETIME from now, or the lease's end if that is sooner."""
    bound = now + MAX_LIFETIME
    if alloc.expires_at is not None and alloc.expires_at < bound:
        return alloc.expires_at
    return bound


def check_for_lease(claims: Claims, alloc: Allocation, membership: Membership) -> None:
    """Refuse a verified token that does not hold for `alloc` now.

    InvalidUploadToken for a token of another lease; Conflict for a lease that has ended; NotAllowed for a user
    who is no longer its requester or a member of its team (the upload rule, profile_runs.check_uploader).
    """
    if claims.ir != alloc.ir:
        raise InvalidUploadToken(f"the upload token is not for {alloc.ir_label}")
    check_uploader(alloc, claims.user, membership)


@invocation
def profile_token(ctx: LeaseContext, ir: int, user: str, key: bytes) -> Message:
    """`/gpu profile-token IR-n`: a token for `user` to upload profiler runs to the lease, told to `user` alone."""
    alloc = ctx.get(ir)
    membership = ctx.membership()
    visibility.check(membership, user, alloc)
    check_uploader(alloc, user, membership)
    now = ctx.clock.now()
    ends = expiry(alloc, now)
    if alloc.state is State.RESOLVED or ends <= now:
        raise Conflict(f"{alloc.ir_label} has ended; upload tokens are given for open leases")
    token = mint(alloc.ir, user, ends, key)
    return token_message(alloc, token, ends)


def token_message(alloc: Allocation, token: str, ends: datetime) -> Message:
    """The ephemeral answer: the token, what it allows, until when, and that it is the asker's alone.

    The token is in the blocks only: the fallback text is what notifications show and what the worker returns as
    its summary (which logs may keep), so it names the token without carrying it.
    """
    head = (
        f":key: Upload token for {alloc.ir_label}, yours alone, valid until {isoformat(ends)} (or until the lease ends)"
    )
    body = (
        f"{head}:\n`{token}`\n"
        f"It lets whoever holds it upload profiler runs to {alloc.ir_label} as you: keep it out of channels, "
        f"shared files and logs. Ask `/gpu profile-token {alloc.ir_label}` again for a new one."
    )
    return Message(f"{head}.", [section(body)])
