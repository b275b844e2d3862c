"""A DM that must land before what it announces is recorded: an idle warning (gpufarm.core.idle.delivery) or a
preemption notice (gpufarm.core.leases.preemption). Slack refusing for a reason that may pass raises, so nothing is
recorded and the step is retried; a refusal no retry can change (the account is gone) answers False, and the caller
records the notice undelivered rather than hold GPUs forever.
"""

from __future__ import annotations

import logging

from gpufarm.core.chat.block_kit import Message
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import Chat

log = logging.getLogger(__name__)


def deliver_warning(chat: Chat, user: str | None, message: Message) -> bool:
    """DM the notice; True when delivered, False when it never can be. UpstreamError when it may pass later."""
    if not user:
        return False
    try:
        chat.tell_user(user, message.text, message.blocks)
    except UpstreamError as exc:
        if may_pass_later(exc):
            raise
        log.warning("a notice for %s cannot be delivered (%s); recorded undelivered", user, exc)
        return False
    return True


def may_pass_later(exc: UpstreamError) -> bool:
    """Whether retrying can deliver: no HTTP answer, a rate limit or a server error (Slack's errors carry status)."""
    status = getattr(exc, "status", None)
    return not isinstance(status, int) or status == 429 or status >= 500
