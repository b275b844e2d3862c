"""The farm configuration's errors, in a module of their own so that a command catching them loads no farm model:
an invalid file, and an unknown team (the same words from the models and from the report's view of the farm)."""

from __future__ import annotations

from collections.abc import Collection

from gpufarm.core.kernel.errors import GpufarmError, ValidationFailed


class FarmConfigError(GpufarmError):
    """The farm configuration is missing or invalid; the message says where."""


def unknown_team(name: str, known: Collection[str]) -> ValidationFailed:
    """The error a lookup of a team the farm does not define raises, naming the known teams."""
    listed = ", ".join(sorted(known)) or "none configured"
    return ValidationFailed("team", f"unknown team '{short(name)}'; teams: {listed}")


def short(text: str) -> str:
    """At most 40 printable characters of a name someone typed, for an error message."""
    value = str(text)[:40]
    return "".join(ch if ch.isprintable() else "?" for ch in value)
