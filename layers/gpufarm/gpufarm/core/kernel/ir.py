"""Incident numbers: `IR-123` for people, `ir:ir-123` for Datadog tags (Datadog lowercases tags)."""

from __future__ import annotations

import re

from gpufarm.core.kernel.errors import ValidationFailed

# ASCII digits only: `\d` alone would also take '١٢' (and int() other scripts' digits); bounded at 9 of them.
_IR_RE = re.compile(r"^\s*(?:ir:)?(?:ir-?)?#?([0-9]{1,9})\s*$", re.IGNORECASE | re.ASCII)
TAG_KEY = "ir"


def format_ir(number: int) -> str:
    """Human form: `IR-123`."""
    return f"IR-{_checked(number)}"


def ir_tag_value(number: int) -> str:
    """Tag value: `ir-123`."""
    return f"ir-{_checked(number)}"


def ir_tag(number: int) -> str:
    """Full tag: `ir:ir-123`."""
    return f"{TAG_KEY}:{ir_tag_value(number)}"


def parse_ir(text: str) -> int:
    """Accept `IR-123`, `ir-123`, `ir:ir-123`, `#123` or `123`; raise ValidationFailed otherwise."""
    match = _IR_RE.match(text or "")
    if not match:
        raise ValidationFailed("ir", f"'{_printable(text)}' is not an incident number; use the form IR-123")
    return _checked(int(match.group(1)))


def _checked(number: int) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
        raise ValidationFailed("ir", "an incident number is a positive integer")
    return number


def _printable(text: object) -> str:
    value = str(text)[:40]
    return "".join(ch if ch.isprintable() else "?" for ch in value)
