"""Idle warnings are delivered before they are recorded: a lease is reclaimed only after its holder was told.

The grace period runs from the warning recorded in the incident (`gpufarm_idle_warned_at`, the `warned` history
step), and the reclaim follows the grace. Recording a warning Slack never took would start that clock for a
warning nobody saw, so the warning's DM goes first and the record after it. When Slack does not take it for a
reason that may pass (a rate limit, a 5xx, no answer), the error propagates: nothing is recorded, the command
fails and is redelivered by the queue, and the idle monitor re-notifies while the lease stays idle, so the
warning is retried and the reclaim waits for it. A refusal no retry can change (the requester's account is gone:
`user_not_found`, `account_inactive`) would hold the GPUs forever, so that warning is recorded undelivered and
logged, and the operators see it in the incident.

A DM delivered whose record then fails is sent again by the redelivery: a rare second copy of one warning, never
a reclaim without one.
"""

from __future__ import annotations

# The delivery rule is shared with preemption notices (gpufarm.core.leases.preemption), so it lives below both.
from gpufarm.core.chat.delivery import deliver_warning, may_pass_later

__all__ = ["deliver_warning", "may_pass_later"]
