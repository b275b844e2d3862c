"""The standard-library signature check signs and verifies exactly as slack_sdk's SignatureVerifier does."""

from __future__ import annotations

import random

import pytest
from slack_sdk.signature import SignatureVerifier

from gpufarm.adapters.slack_signature import MAX_AGE_S, SignatureCheck

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_700_000_000


class _Clock:
    def now(self) -> float:
        return float(NOW)


def _bodies() -> list[str]:
    rng = random.Random(7)
    alphabet = "abcXYZ019=&%+ \n\t\u00e9\u4e2d\U0001f680\"'<>"
    return ["", "token=x&command=%2Fgpu&text=request+8+H100"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(200)
    ]


def test_signatures_match_slack_sdk_for_any_body() -> None:
    ours = SignatureCheck(SECRET, clock=lambda: NOW)
    theirs = SignatureVerifier(SECRET, clock=_Clock())
    for body in _bodies():
        for ts in (str(NOW), str(NOW - 299)):
            expected = theirs.generate_signature(timestamp=ts, body=body)
            assert ours.sign(body, ts)["X-Slack-Signature"] == expected
            assert ours.sign(body.encode(), ts)["X-Slack-Signature"] == expected
            headers = {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": str(expected)}
            assert ours.verify(body.encode(), headers) is True
            assert theirs.is_valid(body=body, timestamp=ts, signature=str(expected)) is True


@pytest.mark.parametrize(
    ("timestamp", "signature", "body"),
    [
        (str(NOW - MAX_AGE_S - 1), None, b"a=1"),  # stale
        (str(NOW + MAX_AGE_S + 1), None, b"a=1"),  # from the future
        ("\u00b2", None, b"a=1"),  # a digit that is not ASCII
        ("9" * 400, None, b"a=1"),  # overflows a float
        ("", None, b"a=1"),
        (str(NOW), "v1=abc", b"a=1"),  # another scheme
        (str(NOW), "v0=" + "\u00e9" * 64, b"a=1"),  # non-ASCII: a mismatch, not an exception
        (str(NOW), None, b"\xff\xfe"),  # not UTF-8: Slack never signed it
    ],
)
def test_bad_requests_are_refused_without_an_exception(timestamp: str, signature: str | None, body: bytes) -> None:
    check = SignatureCheck(SECRET, clock=lambda: NOW)
    good = check.sign(b"a=1", str(NOW))["X-Slack-Signature"]
    headers = {"x-slack-request-timestamp": timestamp, "x-slack-signature": signature or good}
    assert check.verify(body, headers) is False


def test_a_body_changed_by_one_byte_is_refused() -> None:
    check = SignatureCheck(SECRET, clock=lambda: NOW)
    headers = check.sign(b"command=%2Fgpu&text=release+IR-1", NOW)
    assert check.verify(b"command=%2Fgpu&text=release+IR-1", headers) is True
    assert check.verify(b"command=%2Fgpu&text=release+IR-2", headers) is False
    assert SignatureCheck("another-secret-0000", clock=lambda: NOW).verify(b"command=%2Fgpu", headers) is False


def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        SignatureCheck("  ")
