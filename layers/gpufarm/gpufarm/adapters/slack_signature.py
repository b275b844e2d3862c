"""Slack's request signature (v0: HMAC-SHA256 of `v0:<timestamp>:<body>` with the app's signing secret, the
timestamp within 5 minutes of now), checked on the standard library alone.

Slack documents the scheme ("Verifying requests from Slack"); it is what slack_sdk's SignatureVerifier computes,
which tests/unit/test_slack_signature.py checks signature by signature. Kept apart from the Slack Web API adapter
(slack.py, which re-exports it): importing slack_sdk (its Web client, asyncio, package metadata) was a large part
of what a cold Slack ingress paid just to check a signature (benchmarks/RESULTS.md, "Slack ingress").
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping

# Slack's window: a request whose timestamp is further than this from now is refused (a replay).
MAX_AGE_S = 5 * 60
# Epoch seconds as ASCII digits, at most 12 (until the year 33658).
_MAX_TIMESTAMP_DIGITS = 12


class SignatureCheck:
    """Verifies Slack's request signature (v0 HMAC-SHA256, 5-minute window) with an injectable clock."""

    def __init__(self, signing_secret: str, *, clock: Callable[[], float] | None = None) -> None:
        if not signing_secret or not signing_secret.strip():
            raise ValueError("the Slack signing secret is empty")
        self._secret = signing_secret.encode()
        self._clock = clock or time.time

    def verify(self, body: bytes | str, headers: Mapping[str, str]) -> bool:
        """True when the headers carry a valid, fresh signature of exactly these body bytes."""
        normalized = {str(k).lower(): str(v) for k, v in headers.items()}
        timestamp = normalized.get("x-slack-request-timestamp", "")
        signature = normalized.get("x-slack-signature", "")
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= _MAX_TIMESTAMP_DIGITS):
            return False
        if not signature.startswith("v0=") or abs(self._clock() - int(timestamp)) > MAX_AGE_S:
            return False
        try:
            expected = self._signature(body, timestamp)
        except UnicodeDecodeError:
            return False  # Slack signs UTF-8 text; other bytes were not signed by Slack
        # Bytes on both sides: a header with non-ASCII characters is a mismatch, never an exception.
        return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass"))

    def sign(self, body: bytes | str, timestamp: int | str) -> dict[str, str]:
        """The two headers Slack would send with this body at this time (for tests and the sandbox)."""
        ts = str(timestamp)
        return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": self._signature(body, ts)}

    def _signature(self, body: bytes | str, timestamp: str) -> str:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        base = f"v0:{timestamp}:{text}".encode("utf-8", "surrogatepass")
        return "v0=" + hmac.new(self._secret, base, hashlib.sha256).hexdigest()
