"""The reason form an operator's Reject, Reclaim or Exempt button opens, and reading its submission back.

Reject and force-reclaim take a reason, an exemption its length in days too: the button does not act at once, it
opens this modal with the click's 3-second trigger_id (docs/design.md, rule 6), and the submission becomes the same
incident command as `/gpu reject IR-n <reason>` (or reclaim, exempt). Pure: no Slack SDK and no network, so the
ingress builds and reads it inside Slack's 3 seconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufarm.core.chat.actions import ACTION_EXEMPT, ACTION_RECLAIM, ACTION_REJECT
from gpufarm.core.kernel import bounded
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.ir import format_ir

REASON_CALLBACK = "gpu_reason"
REASON_BLOCK = "reason"
DAYS_BLOCK = "days"
MAX_REASON = 300
MAX_EXEMPT_DAYS = 365


@dataclass(frozen=True)
class Form:
    """What one of the three buttons asks for."""

    title: str
    submit: str
    prompt: str
    days: bool = False


FORMS: dict[str, Form] = {
    ACTION_REJECT: Form("Reject request", "Reject", "Why is {ir} rejected? The requester reads this."),
    ACTION_RECLAIM: Form("Reclaim GPUs", "Reclaim", "Why are {ir}'s GPUs taken back? The holder reads this."),
    ACTION_EXEMPT: Form(
        "Exempt from idle reclaim", "Exempt", "Why is {ir} exempt? Operators and the holder read this.", days=True
    ),
}


@dataclass(frozen=True)
class Submitted:
    """A submitted reason form: which button, which lease, why, and (exempt) for how many days."""

    action: str
    ir: int
    reason: str
    days: int | None = None


def modal(action: str, ir: int) -> dict[str, Any]:
    """The reason form for one button on one lease; private_metadata says which (nothing else is trusted)."""
    form = FORMS[action]
    label = format_ir(ir)
    blocks: list[dict[str, Any]] = [
        {
            "type": "input",
            "block_id": REASON_BLOCK,
            "label": _plain(form.prompt.format(ir=label)),
            "element": {
                "type": "plain_text_input",
                "action_id": REASON_BLOCK,
                "multiline": True,
                "max_length": MAX_REASON,
            },
        }
    ]
    if form.days:
        blocks.append(
            {
                "type": "input",
                "block_id": DAYS_BLOCK,
                "label": _plain("For how many days"),
                "element": {
                    "type": "number_input",
                    "action_id": DAYS_BLOCK,
                    "is_decimal_allowed": False,
                    "min_value": "1",
                    "max_value": str(MAX_EXEMPT_DAYS),
                    "initial_value": "3",
                },
            }
        )
    return {
        "type": "modal",
        "callback_id": REASON_CALLBACK,
        "title": _plain(form.title[:24]),
        "submit": _plain(form.submit),
        "close": _plain("Cancel"),
        "private_metadata": json.dumps({"action": action, "ir": ir}),
        "blocks": blocks,
    }


def read(state_values: Mapping[str, Any], private_metadata: str) -> Submitted:
    """The submission, validated; ValidationFailed naming the block (reason, days) or 'form' for the metadata."""
    try:
        meta = bounded.loads(private_metadata, max_bytes=3000) if private_metadata else None
    except bounded.BadJson:
        meta = None
    action = meta.get("action") if isinstance(meta, dict) else None
    ir = meta.get("ir") if isinstance(meta, dict) else None
    if action not in FORMS or isinstance(ir, bool) or not isinstance(ir, int) or not 1 <= ir < 10**9:
        raise ValidationFailed("form", "this form does not say which lease it is for; click the button again")
    typed = (_value(state_values, REASON_BLOCK) or "")[:MAX_REASON]
    reason = " ".join("".join(ch if ch.isprintable() else " " for ch in typed).split())
    if not reason:
        raise ValidationFailed(REASON_BLOCK, "say why")
    days = None
    if FORMS[action].days:
        days = bounded.whole_number(_value(state_values, DAYS_BLOCK) or "", DAYS_BLOCK, "days", maximum=MAX_EXEMPT_DAYS)
    return Submitted(action, ir, reason, days)


def _value(state_values: Mapping[str, Any], block_id: str) -> str | None:
    block = state_values.get(block_id)
    element = block.get(block_id) if isinstance(block, Mapping) else None
    value = element.get("value") if isinstance(element, Mapping) else None
    return value if isinstance(value, str) else None


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text[:150]}
