"""Where a lease's reasons are kept: the latest code in the `gpufarm_reason` field, every sentence in the history.

A decision that keeps a request waiting, refuses it or ends a lease writes, in the same PATCH as its change, the
field (`fields(reason)`) and a history entry whose last detail is `Reason.line()` (`detail(reason)`): the
sentence, then `[code]`. `/gpu status` and `/gpu why` show the latest (`latest`); the reports count every code a
history holds (`codes`), and a lease whose history lost the line (folded) still counts by its field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import history
from gpufarm.core.kernel.reasons import Reason, ReasonCode

if TYPE_CHECKING:  # the report reads reasons from its light records, without the lifecycle's model
    from gpufarm.core.kernel.model import Allocation

# Room a history entry leaves for the reason after its time, actor, step and other details.
MAX_DETAIL_CHARS = 220
_CODE_RE = re.compile(r"\[([a-z][a-z0-9-]{1,40})\]$")


def fields(reason: Reason, ended: datetime | None = None) -> dict[str, object]:
    """The incident fields that record `reason` as the latest; `ended`: the lease ends with it then (its month is
    recorded for the reports' search)."""
    out: dict[str, object] = {f.REASON: reason.code.value}
    if ended is not None:
        moment = ended.astimezone(UTC)
        out[f.REASON_MONTH] = f"{moment.year:04d}-{moment.month:02d}"
    return out


def detail(reason: Reason, limit: int = MAX_DETAIL_CHARS) -> str:
    """`Reason.line()` within `limit` characters: the sentence shortened, the `[code]` always kept at the end."""
    line = reason.line()
    if len(line) <= limit:
        return line
    tail = f" [{reason.code.value}]"
    return reason.sentence[: max(limit - len(tail) - 1, 0)] + "…" + tail


def code_of(line: str) -> ReasonCode | None:
    """The reason code a history line ends with, or None."""
    match = _CODE_RE.search(line.rstrip())
    if match is None:
        return None
    try:
        return ReasonCode(match.group(1))
    except ValueError:
        return None


def codes(lines: Iterable[str]) -> list[ReasonCode]:
    """Every reason code a history holds, oldest first."""
    return [code for code in map(code_of, lines) if code is not None]


def latest(alloc: Allocation) -> Reason | None:
    """The lease's latest reason: its field's code with the sentence of the newest history line carrying it."""
    try:
        code = ReasonCode(alloc.reason) if alloc.reason else None
    except ValueError:
        code = None
    for line in reversed(alloc.history):
        found = code_of(line)
        if found is None or (code is not None and found is not code):
            continue
        entry = history.parse(line)
        details = entry.details if entry is not None else line
        return Reason(found, details.rsplit(" [", 1)[0])
    return Reason(code, code.value) if code is not None else None


def counted(leases: Iterable[Allocation]) -> dict[ReasonCode, int]:
    """How many times each reason was given across `leases` (their histories; the field where none is written)."""
    out: dict[ReasonCode, int] = {}
    for alloc in leases:
        found = codes(alloc.history)
        if not found and alloc.reason:
            try:
                found = [ReasonCode(alloc.reason)]
            except ValueError:
                found = []
        for code in found:
            out[code] = out.get(code, 0) + 1
    return out
