"""Bounded decoding of what arrives from outside: JSON with a size and nesting limit, whole numbers strictly.

Every entry point decodes through here (the Slack ingress's form and `payload`, the Datadog webhooks' bodies,
the modal's private metadata, the numbers of `/gpu ...` and of the request form), so a limit holds everywhere
at once rather than at each call site (docs/design.md, "Bounded input").

Why a pre-scan: `json.loads` recurses once per nesting level, so a body of a few thousand `[` raises
RecursionError (or, in a thread with a small stack, worse) before it can say the body is bad. The scan counts
brackets outside string literals with one regular expression, stops at the first level past the limit, and
never recurses; only then does `json.loads` run, on input whose depth it can handle.

Why strict numbers: `str.isdigit()` is true for '²' or '⁵', which `int()` refuses, and `int()` refuses digit
strings over 4,300 characters; both used to surface as exceptions. A number here is 1-9 ASCII digits.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpufarm.core.kernel.errors import ValidationFailed

# Nesting that any payload gpufarm reads needs is under 10 levels (a modal's view state is 4-5).
MAX_JSON_DEPTH = 32
MAX_DIGITS = 9

# A string literal (skipped whole, escapes included), or one bracket. Anything else is skipped by finditer.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPENERS = frozenset("[{")
_DIGITS = re.compile(r"[0-9]{1,%d}" % MAX_DIGITS)  # noqa: UP031 - a regex quantifier, braces would be noise


class BadJson(ValueError):
    """The text is not JSON gpufarm will decode; `reason` completes "the body is ..." and is safe to show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def json_depth_within(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when no bracket outside a string literal nests deeper than `limit` (scanned without recursion)."""
    depth = 0
    for match in _TOKENS.finditer(text):
        lexeme = match.group()
        if lexeme in _OPENERS:
            depth += 1
            if depth > limit:
                return False
        elif lexeme in "]}":
            depth -= 1
    return True


def loads(data: str | bytes, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode JSON no longer than `max_bytes` and nested no deeper than `max_depth`; BadJson otherwise."""
    if len(data) > max_bytes:
        raise BadJson(f"longer than {max_bytes} bytes")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadJson("not UTF-8") from None
    else:
        text = data
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise BadJson(f"longer than {max_bytes} bytes")
    if not json_depth_within(text, max_depth):
        raise BadJson(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        # RecursionError cannot come after the scan at these limits; caught so that no decoding error escapes.
        raise BadJson("not valid JSON") from None


def whole_number(text: str, field: str, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number of 1-9 ASCII digits (an optional sign), within [minimum, maximum]; else ValidationFailed.

    `field` names the input for the error, `what` says it in words ("the GPU count", "days").
    """
    value = text.strip()
    sign = -1 if value.startswith("-") else 1
    digits = value[1:] if value.startswith(("+", "-")) else value
    if not _DIGITS.fullmatch(digits):
        if digits.isascii() and digits.isdigit():
            raise ValidationFailed(field, f"{what} has more than {MAX_DIGITS} digits")
        raise ValidationFailed(field, f"{what} must be a whole number, not '{printable(value)}'")
    number = sign * int(digits)
    if number < minimum:
        raise ValidationFailed(field, f"{what} must be at least {minimum}")
    if maximum is not None and number > maximum:
        raise ValidationFailed(field, f"{what} must be at most {maximum}")
    return number


def ascii_digits(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """The number `text` spells in 1 to `max_digits` ASCII digits (no sign, no spaces); None for anything else.

    For numbers inside values gpufarm reads back (host tags, incident fields, monitor ids), where a malformed one is
    skipped rather than refused: `int()` alone would take '²' past `isdigit()` and fail, or spend time on thousands
    of digits.
    """
    if 1 <= len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def is_whole_number(text: str) -> bool:
    """True when `text` reads as a whole number for whole_number (ASCII digits only)."""
    value = text.strip()
    digits = value[1:] if value.startswith(("+", "-")) else value
    return digits.isascii() and digits.isdigit()


def printable(text: str, limit: int = 40) -> str:
    """At most `limit` characters of `text`, non-printable ones shown as '?' (for error messages)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
