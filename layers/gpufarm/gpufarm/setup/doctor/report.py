"""What `gpufarm doctor` says: one line per check, each confirmed, fell back, broken or skipped, and the exit status
they make."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """How a behaviour gpufarm relies on turned out on the org checked."""

    CONFIRMED = "confirmed"  # Datadog or Slack behaves as gpufarm's main path expects
    FELL_BACK = "fell back"  # it behaves another way that gpufarm detects and works around
    BROKEN = "broken"  # gpufarm cannot work this way: the detail says what to fix
    SKIPPED = "skipped"  # not checked: the detail says what would check it


# Exit statuses (click itself exits 2 on a usage error).
EXIT_CONFIRMED = 0
EXIT_BROKEN = 1
EXIT_FELL_BACK = 3


@dataclass(frozen=True)
class Line:
    """One check's outcome."""

    check: str
    status: Status
    detail: str

    def as_json(self) -> dict[str, str]:
        """The line as `{check, status, detail}`."""
        return {"check": self.check, "status": self.status.value, "detail": self.detail}


def exit_status(lines: Iterable[Line]) -> int:
    """1 when anything is broken, else 3 when anything fell back, else 0 (skipped lines count as neither)."""
    found = {line.status for line in lines}
    if Status.BROKEN in found:
        return EXIT_BROKEN
    if Status.FELL_BACK in found:
        return EXIT_FELL_BACK
    return EXIT_CONFIRMED


def row(line: Line, width: int) -> str:
    """One printed line: the check padded to `width`, the status in a fixed column, then the detail."""
    return f"{line.check:<{width}}  {line.status.value:<9}  {line.detail}"


# The check column's width: the longest names the checks use, so rows printed as they come stay aligned.
CHECK_WIDTH = 24


def table(lines: Sequence[Line]) -> list[str]:
    """Every line aligned (the check column as wide as the widest name, at least CHECK_WIDTH)."""
    width = max([CHECK_WIDTH, *(len(line.check) for line in lines)])
    return [row(line, width) for line in lines]
