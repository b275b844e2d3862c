"""Per-lease upload tokens: who may upload a profiler run to which lease, until when, signed by gpufarm.

A token is `gfu1.<payload>.<signature>`: the payload is `<ir>:<user>:<expiry>` (IR number, Slack user id, expiry
in epoch seconds) in unpadded base64url, and the signature is HMAC-SHA256 under the deployment's
`upload_token_secret` over the version and the payload, also base64url. The version is signed too, so a later
format cannot be passed off as this one. Only gpufarm holds the key: a token is minted by `/gpu profile-token`
(gpufarm.core.leases.upload_tokens) and checked by whatever accepts an upload, which also checks the lease itself
(`check_for_lease`: ended, user no longer on it, another lease).

Verification refuses before it decodes anything it has not bounded: the whole token is at most MAX_TOKEN_CHARS,
the signature is compared in constant time before the payload is parsed, and every field is matched against a
strict pattern. Every refusal is the same InvalidUploadToken naming only the kind of failure, never the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufarm.core.kernel.errors import NotAllowed

VERSION = "gfu1"
# A token is about 110 characters for a realistic IR and user; anything longer is refused unread.
MAX_TOKEN_CHARS = 200
# A key shorter than this is a misconfiguration, not a secret (HMAC-SHA256 wants at least its 32-byte output).
MIN_KEY_BYTES = 16
MAX_IR = 10**9
# Slack user ids (U…, W…) and the sandbox's; no `:` so the payload splits one way only.
_USER = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PAYLOAD = re.compile(r"([1-9][0-9]{0,9}):([A-Za-z0-9_-]{1,64}):([1-9][0-9]{0,10})")
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_SIGNATURE_CHARS = 43  # 32 bytes of SHA-256, base64url without padding


class InvalidUploadToken(NotAllowed):
    """A token that is forged, expired, malformed or oversize: the caller is not authorised (HTTP 401)."""


@dataclass(frozen=True)
class Claims:
    """What a valid token says: the lease (IR number), the Slack user it was given to, and when it stops."""

    ir: int
    user: str
    expires: datetime


def mint(lease_ir: int, user: str, expires: datetime, key: bytes) -> str:
    """A token for `user` to upload to lease `lease_ir` until `expires` (timezone-aware, whole seconds kept).

    ValueError on a key too short, an IR out of range, a user id that is not one, or a naive expiry: these are
    gpufarm's own mistakes, never a caller's input.
    """
    _check_key(key)
    if not 1 <= lease_ir < MAX_IR:
        raise ValueError("the lease's IR number is out of range")
    if not _USER.fullmatch(user):
        raise ValueError("the user is not a Slack user id")
    if expires.tzinfo is None:
        raise ValueError("the expiry must be timezone-aware")
    epoch = int(expires.timestamp())
    if epoch < 1:
        raise ValueError("the expiry is before 1970")
    payload = _b64(f"{lease_ir}:{user}:{epoch}".encode())
    return f"{VERSION}.{payload}.{_b64(_sign(key, payload))}"


def verify(token: str, key: bytes, now: datetime) -> Claims:
    """The token's claims when gpufarm signed it and it has not expired at `now`; InvalidUploadToken otherwise."""
    _check_key(key)
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
        raise InvalidUploadToken("the upload token is malformed")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != VERSION:
        raise InvalidUploadToken("the upload token is malformed")
    payload, signature = parts[1], parts[2]
    if not _B64URL.fullmatch(payload) or not _B64URL.fullmatch(signature) or len(signature) != _SIGNATURE_CHARS:
        raise InvalidUploadToken("the upload token is malformed")
    # The signature is checked before the payload is read: a forged token tells nothing about parsing.
    if not hmac.compare_digest(_b64(_sign(key, payload)), signature):
        raise InvalidUploadToken("the upload token is not gpufarm's")
    claims = _claims(payload)
    if now >= claims.expires:
        raise InvalidUploadToken("the upload token has expired")
    return claims


def _claims(payload: str) -> Claims:
    try:
        text = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidUploadToken("the upload token is malformed") from None
    match = _PAYLOAD.fullmatch(text)
    if match is None:
        raise InvalidUploadToken("the upload token is malformed")
    ir, user, epoch = int(match[1]), match[2], int(match[3])
    if ir >= MAX_IR:
        raise InvalidUploadToken("the upload token is malformed")
    try:
        expires = datetime.fromtimestamp(epoch, UTC)
    except (OverflowError, OSError, ValueError):
        raise InvalidUploadToken("the upload token is malformed") from None
    return Claims(ir=ir, user=user, expires=expires)


def _sign(key: bytes, payload: str) -> bytes:
    return hmac.new(key, f"{VERSION}.{payload}".encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the upload token key must be at least {MIN_KEY_BYTES} bytes")
