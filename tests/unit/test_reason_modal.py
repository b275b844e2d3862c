"""The reason form of Reject, Reclaim and Exempt (gpufarm.core.chat.reason_form)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufarm.core.chat import messages, reason_form
from gpufarm.core.chat.reason_form import Submitted
from gpufarm.core.kernel.errors import ValidationFailed

pytestmark = pytest.mark.unit


def _values(reason: str | None, days: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
    if days is not None:
        out["days"] = {"days": {"type": "number_input", "value": days}}
    return out


def test_each_button_opens_its_form_and_only_exempt_asks_for_days() -> None:
    for action in (messages.ACTION_REJECT, messages.ACTION_RECLAIM, messages.ACTION_EXEMPT):
        view = reason_form.modal(action, 12)
        assert view["callback_id"] == reason_form.REASON_CALLBACK
        assert json.loads(view["private_metadata"]) == {"action": action, "ir": 12}
        blocks = [b["block_id"] for b in view["blocks"]]
        assert blocks == (["reason", "days"] if action == messages.ACTION_EXEMPT else ["reason"])
        assert view["blocks"][0]["element"]["max_length"] == reason_form.MAX_REASON
        assert "IR-12" in view["blocks"][0]["label"]["text"]
        assert len(view["title"]["text"]) <= 24
    assert set(reason_form.FORMS) <= set(messages.ACTIONS)


def test_a_submission_reads_back_bounded_and_on_one_line() -> None:
    meta = reason_form.modal(messages.ACTION_EXEMPT, 7)["private_metadata"]
    got = reason_form.read(_values("paper\ndeadline\x00 friday", "5"), meta)
    assert got == Submitted(messages.ACTION_EXEMPT, 7, "paper deadline friday", 5)
    meta = reason_form.modal(messages.ACTION_REJECT, 7)["private_metadata"]
    assert reason_form.read(_values("x" * 1000), meta).reason == "x" * reason_form.MAX_REASON


@pytest.mark.parametrize(
    ("action", "values", "meta", "field"),
    [
        (messages.ACTION_REJECT, _values("   "), None, "reason"),
        (messages.ACTION_REJECT, _values(None), None, "reason"),
        (messages.ACTION_EXEMPT, _values("why", "0"), None, "days"),
        (messages.ACTION_EXEMPT, _values("why", "²"), None, "days"),
        (messages.ACTION_EXEMPT, _values("why", "9" * 5000), None, "days"),
        (messages.ACTION_REJECT, _values("why"), '{"action": "gpu_approve", "ir": 3}', "form"),
        (messages.ACTION_REJECT, _values("why"), '{"action": "gpu_reject", "ir": true}', "form"),
        (messages.ACTION_REJECT, _values("why"), '{"action": "gpu_reject"}', "form"),
        (messages.ACTION_REJECT, _values("why"), "[[[[", "form"),
    ],
)
def test_a_bad_submission_names_what_is_wrong(action: str, values: Any, meta: str | None, field: str) -> None:
    metadata = meta if meta is not None else reason_form.modal(action, 3)["private_metadata"]
    with pytest.raises(ValidationFailed) as info:
        reason_form.read(values, metadata)
    assert info.value.field == field
