"""Decoding one incident field's value: text, list, whole number, GPU-hours, time, enum, `host=n` pairs.

Pure functions with no model behind them, shared by the Allocation model (gpufarm.core.kernel.model) and the light
lease record reports read (gpufarm.core.kernel.lease_facts), so both decode a hand-edited or malformed field the
same way: missing or malformed values fall back to safe defaults, never an error.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from gpufarm.core.kernel.bounded import ascii_digits
from gpufarm.core.kernel.fields import FieldValue

# A GPU-hours textbox longer than this is not a number gpufarm wrote.
MAX_HOURS_CHARS = 32


def text(value: FieldValue) -> str | None:
    """A single value (the first of a list), None when empty."""
    if isinstance(value, list):
        return value[0] if value else None
    return value or None


def items(value: FieldValue) -> list[str]:
    """A list value (a single value as a list of one)."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def whole(value: FieldValue) -> int | None:
    """A whole number, None when absent or not one."""
    found = text(value)
    try:
        return int(found) if found is not None else None
    except ValueError:
        return None


def hours(value: FieldValue) -> float:
    """A GPU-hours textbox: a finite, non-negative number, else 0 (a hand-edited field never breaks a read)."""
    found = text(value)
    try:
        number = float(found) if found is not None and len(found) <= MAX_HOURS_CHARS else 0.0
    except ValueError:
        return 0.0
    return number if math.isfinite(number) and number >= 0 else 0.0


def enum(kind: Any, value: str | None, default: Any) -> Any:
    """`kind(value)`, the default when absent or not one of its values."""
    try:
        return kind(value) if value is not None else default
    except ValueError:
        return default


def isoformat(moment: datetime) -> str:
    """ISO 8601 in UTC with a Z, to the second."""
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(found: str | None) -> datetime | None:
    """Parse an ISO 8601 time written by isoformat (or Datadog); None when absent or malformed."""
    if not found:
        return None
    try:
        moment = datetime.fromisoformat(found.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def encode_host_gpus(host_gpus: dict[str, int]) -> list[str]:
    """`{"node-1": 2}` → `["node-1=2"]`, sorted for stable diffs."""
    return [f"{host}={count}" for host, count in sorted(host_gpus.items())]


def decode_host_gpus(entries: list[str]) -> dict[str, int]:
    """Inverse of encode_host_gpus; malformed entries are skipped."""
    out: dict[str, int] = {}
    for entry in entries:
        host, sep, count = entry.rpartition("=")
        number = ascii_digits(count)
        if sep and host and number is not None:
            out[host] = number
    return out
