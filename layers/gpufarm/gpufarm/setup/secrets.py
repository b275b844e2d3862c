"""What `gpufarm secrets` writes: the deployment's secret keys from one JSON document, and the link key's rotation.

Each key is its own Secrets Manager secret, `<prefix>/<key>` (gpufarm.adapters.secret_store), so that IAM can give
each function only the keys it reads (docs/security.md). An operator still keeps one document: `put` checks it
whole before anything is written and writes each key it holds.

The link key (`profile_link_secret`) signs the profile pages' links; `profile_link_secret_previous` is the key the
pages also accept. Outside a rotation the previous key holds the link key itself, so it always exists and the pages
function finds all its keys in one call (a missing one costs a call per key): a `put` that sets the
link key without the previous one sets both (a key replaced by hand: links signed with the old one stop opening).
A rotation keeps the old key as the previous one while the sync re-signs the dashboards' links and the runs' links
age out; finishing it makes the previous key the link key again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpufarm.config import SECRET_KEYS
from gpufarm.core.kernel.errors import Conflict, ValidationFailed

LINK = "profile_link_secret"
PREVIOUS = "profile_link_secret_previous"
# The document `put` reads, and one value (Secrets Manager holds up to 64 KiB a secret; no key needs more than 4 KiB).
MAX_DOCUMENT_BYTES = 65_536
MAX_VALUE_CHARS = 4_096
# Keys gpufarm makes up itself (HMAC keys, the webhook's shared secret): at least this long.
OWN_KEYS = ("webhook_secret", "profile_link_secret", "profile_link_secret_previous", "upload_token_secret")
MIN_OWN_KEY_CHARS = 16


def parse_document(text: str) -> dict[str, str]:
    """The keys and values of a secrets document (a JSON object of gpufarm's keys); ValidationFailed naming the
    first thing wrong (a key, never a value)."""
    if len(text.encode("utf-8", "replace")) > MAX_DOCUMENT_BYTES:
        raise ValidationFailed("document", f"the document is over {MAX_DOCUMENT_BYTES} bytes")
    try:
        document = json.loads(text)
    except ValueError:
        raise ValidationFailed("document", "the document is not JSON") from None
    if not isinstance(document, dict) or not document:
        raise ValidationFailed("document", "the document must be a JSON object of gpufarm's secret keys")
    values: dict[str, str] = {}
    for key, value in document.items():
        if key not in SECRET_KEYS:
            known = ", ".join(SECRET_KEYS)
            raise ValidationFailed("document", f"{str(key)[:60]!r} is not a gpufarm secret key (keys: {known})")
        values[key] = _checked(key, value)
    return values


def _checked(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationFailed(key, f"{key} must be a non-empty string")
    if len(value) > MAX_VALUE_CHARS:
        raise ValidationFailed(key, f"{key} is longer than {MAX_VALUE_CHARS} characters")
    if value != value.strip() or any(ord(c) < 32 for c in value):
        raise ValidationFailed(key, f"{key} has surrounding spaces or control characters (a copy-paste slip?)")
    if key in OWN_KEYS and len(value) < MIN_OWN_KEY_CHARS:
        raise ValidationFailed(key, f"{key} must be at least {MIN_OWN_KEY_CHARS} characters (a random string)")
    return value


def put_writes(values: Mapping[str, str]) -> list[tuple[str, str]]:
    """What `put` writes, in order: each key given, and the previous link key with the link key when the document
    sets the link key alone (no rotation under way: the pages accept that key only)."""
    writes = dict(values)
    if LINK in writes and PREVIOUS not in writes:
        writes[PREVIOUS] = writes[LINK]
    # The previous key first: while a write is under way, both the old and the new link key keep opening links.
    ordered = sorted(writes, key=lambda k: (k != PREVIOUS, list(SECRET_KEYS).index(k)))
    return [(key, writes[key]) for key in ordered]


def rotation_writes(current: str | None, previous: str | None, new_key: str) -> list[tuple[str, str]]:
    """Start a rotation: the link key becomes the previous key, `new_key` the link key (in that order, so every
    link signed so far keeps opening throughout). ValidationFailed without a link key; Conflict while a rotation is
    under way (starting another would drop the key the oldest links were signed with)."""
    if not current:
        raise ValidationFailed(LINK, f"there is no link key to rotate: `gpufarm secrets put` sets {LINK}")
    if previous and previous != current:
        raise Conflict(
            "a rotation of the link key is under way: finish it first (`gpufarm secrets rotate-link-key --finish`)"
        )
    _checked(LINK, new_key)
    return [(PREVIOUS, current), (LINK, new_key)]


def finish_writes(current: str | None, previous: str | None) -> list[tuple[str, str]]:
    """Finish a rotation: the previous key becomes the link key again, so only the link key opens links. Nothing to
    write when none is under way; ValidationFailed without a link key."""
    if not current:
        raise ValidationFailed(LINK, f"there is no link key: `gpufarm secrets put` sets {LINK}")
    return [] if previous == current else [(PREVIOUS, current)]


def rotating(current: str | None, previous: str | None) -> bool:
    """True while a rotation is under way: the pages accept a key besides the link key."""
    return bool(current and previous and previous != current)
