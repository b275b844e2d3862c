"""Text read back from incidents, shown as data: control characters made visible and the length bounded.

Any incident field can be edited by hand in Datadog's UI (team, project, environment, history lines...), so what a
report or the digest reads back is never trusted to be the tag-safe name gpufarm wrote. `visible` is the one
rule every output kind builds on (gpufarm.reporting.cells adds each format's own escaping): every character
`str.isprintable()` refuses (C0 and C1 controls, DEL, ESC, the bidirectional overrides and isolates U+202A-U+202E
and U+2066-U+2069, line and paragraph separators, other format characters) is written as its escape (`\\x1b`,
`\\u202e`), so a terminal, spreadsheet or chat window shows that something odd is there instead of acting on it,
and a value past `limit` characters is cut, ending in `…`.
"""

from __future__ import annotations

# A value a report or digest shows is at most this many characters (a gpufarm name is at most 63).
MAX_SHOWN = 120
ELLIPSIS = "…"


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` with its non-printable characters as escapes, at most `limit` characters (cut ones end in `…`)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    # Only the first `limit` + 1 characters can be shown (an escape is longer than its character): a value of
    # megabytes costs no more than one of a line.
    head = text[: limit + 1]
    out = head if head.isprintable() else "".join(ch if ch.isprintable() else _escape(ch) for ch in head)
    return out if len(out) <= limit else out[: limit - 1] + ELLIPSIS
