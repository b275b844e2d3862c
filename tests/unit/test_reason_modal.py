"""The reason form of Reject, Reclaim and Exempt (gpufarm.core.chat.reason_form)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufarm.core.chat import block_kit, reason_form
from gpufarm.core.chat.reason_form import Submitted
from gpufarm.core.kernel.errors import ValidationFailed

pytestmark = pytest.mark.unit


def _values(reason: str | None, days: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
    if days is not None:
        out["days"] = {"days": {"type": "number_input", "value": days}}
    return out


def test_each_button_opens_its_form_and_only_exempt_asks_for_days() -> None:
    for action in (block_kit.ACTION_REJECT, block_kit.ACTION_RECLAIM, block_kit.ACTION_EXEMPT):
        view = reason_form.modal(action, 12)
        assert view["callback_id"] == reason_form.REASON_CALLBACK
        assert json.loads(view["private_metadata"]) == {"action": action, "ir": 12}
        blocks = [b["block_id"] for b in view["blocks"]]
        assert blocks == (["reason", "days"] if action == block_kit.ACTION_EXEMPT else ["reason"])
        assert view["blocks"][0]["element"]["max_length"] == reason_form.MAX_REASON
        assert "IR-12" in view["blocks"][0]["label"]["text"]
        assert len(view["title"]["text"]) <= 24
    assert set(reason_form.FORMS) <= set(block_kit.ACTIONS)


def test_a_submission_reads_back_bounded_and_on_one_line() -> None:
    meta = reason_form.modal(block_kit.ACTION_EXEMPT, 7)["private_metadata"]
    got = reason_form.read(_values("paper\ndeadline\x00 friday", "5"), meta)
    assert got == Submitted(block_kit.ACTION_EXEMPT, 7, "paper deadline friday", 5)
    meta = reason_form.modal(block_kit.ACTION_REJECT, 7)["private_metadata"]
    assert reason_form.read(_values("x" * 1000), meta).reason == "x" * reason_form.MAX_REASON


@pytest.mark.parametrize(
    ("action", "values", "meta", "field"),
    [
        (block_kit.ACTION_REJECT, _values("   "), None, "reason"),
        (block_kit.ACTION_REJECT, _values(None), None, "reason"),
        (block_kit.ACTION_EXEMPT, _values("why", "0"), None, "days"),
        (block_kit.ACTION_EXEMPT, _values("why", "²"), None, "days"),
        (block_kit.ACTION_EXEMPT, _values("why", "9" * 5000), None, "days"),
        (block_kit.ACTION_REJECT, _values("why"), '{"action": "gpu_approve", "ir": 3}', "form"),
        (block_kit.ACTION_REJECT, _values("why"), '{"action": "gpu_reject", "ir": true}', "form"),
        (block_kit.ACTION_REJECT, _values("why"), '{"action": "gpu_reject"}', "form"),
        (block_kit.ACTION_REJECT, _values("why"), "[[[[", "form"),
    ],
)
def test_a_bad_submission_names_what_is_wrong(action: str, values: Any, meta: str | None, field: str) -> None:
    metadata = meta if meta is not None else reason_form.modal(action, 3)["private_metadata"]
    with pytest.raises(ValidationFailed) as info:
        reason_form.read(values, metadata)
    assert info.value.field == field
