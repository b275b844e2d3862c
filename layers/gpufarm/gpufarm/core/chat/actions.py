"""The action ids of gpufarm's buttons: what a click names, and all the Slack ingress needs to know of a message.

Kept apart from the Block Kit builders (block_kit.py, which re-exports them) so the ingress answers a click
without importing the models that build messages (tests/unit/test_ingress_imports.py).
"""

from __future__ import annotations

ACTION_APPROVE = "gpu_approve"
ACTION_REJECT = "gpu_reject"
ACTION_RELEASE = "gpu_release"
ACTION_EXTEND = "gpu_extend"
ACTION_KEEP = "gpu_keep"
# Operators' buttons that open a reason form first (gpufarm.core.chat.reason_form), as Reject does.
ACTION_RECLAIM = "gpu_reclaim"
ACTION_EXEMPT = "gpu_exempt"
ACTIONS = (ACTION_APPROVE, ACTION_REJECT, ACTION_RELEASE, ACTION_EXTEND, ACTION_KEEP, ACTION_RECLAIM, ACTION_EXEMPT)
