"""`/gpu reserve <count> <model> env=... project=... from 2026-12-10 09:00 for 3d`: the window's words, parsed.

Pure and cheap, as the rest of the command text (gpufarm.core.chat.command_text): the start is a UTC date with an
optional HH:MM, the length whole days (`3d`) or hours (`36h`). The pool's policy judges the window later
(gpufarm.core.calendar.admission); here only its form is checked, so a typo is answered inside Slack's 3 seconds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from gpufarm.core.kernel.errors import ValidationFailed

USAGE = "use /gpu reserve 8 H100 env=onprem-hpc project=llm-ko from 2026-12-10 09:00 for 3d"
# The request fields the window fills (beside REQUEST_KEYS'): an ISO start and a length.
FROM_KEY = "reserved_from"
FOR_KEY = "reserved_for"
MAX_HOURS = 365 * 24
LAST_YEAR = 2999
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME = re.compile(r"^\d{2}:\d{2}$")
_LENGTH = re.compile(r"^(\d{1,4})([dh])$")


def split_window(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """The words other than `from <date> [HH:MM] for <length>`, and the window as `reserved_from`/`reserved_for`."""
    lowered = [w.lower() for w in words]
    if "from" not in lowered or "for" not in lowered:
        raise ValidationFailed("reserved_from", f"say when and for how long; {USAGE}")
    at = lowered.index("from")
    start = words[at + 1 : at + 3]
    if not start or not _DATE.match(start[0]):
        raise ValidationFailed("reserved_from", f"the start is a date, YYYY-MM-DD, then an optional HH:MM; {USAGE}")
    used = 2 if len(start) == 2 and _TIME.match(start[1]) else 1
    clock = start[1] if used == 2 else "00:00"
    rest = words[:at] + words[at + 1 + used :]
    lowered = [w.lower() for w in rest]
    if "for" not in lowered or lowered.index("for") + 1 >= len(rest):
        raise ValidationFailed("reserved_for", f"say for how long, e.g. for 3d or for 36h; {USAGE}")
    at = lowered.index("for")
    length = rest[at + 1].lower()
    parse_length(length)
    stamp = f"{start[0]}T{clock}"
    parse_start(stamp)
    return rest[:at] + rest[at + 2 :], {FROM_KEY: stamp, FOR_KEY: length}


def parse_start(text: str) -> datetime:
    """`2026-12-10T09:00`, `2026-12-10 09:00` or `2026-12-10` as a UTC time; ValidationFailed when it is no
    calendar date (the request form's field takes what the command does)."""
    words = text.strip().replace("T", " ", 1).split()
    stamp = " ".join([*words, "00:00"] if len(words) == 1 else words)
    try:
        start = datetime.strptime(stamp, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
    except ValueError:
        raise ValidationFailed("reserved_from", f"'{text[:20]}' is not a date and time (UTC); {USAGE}") from None
    if start.year > LAST_YEAR:
        # Far beyond any pool's horizon, and a window from there could run past the calendar's last day.
        raise ValidationFailed("reserved_from", f"{start:%Y-%m-%d} is too far ahead; {USAGE}")
    return start


def parse_length(text: str) -> timedelta:
    """`3d` or `36h` as a length, at least an hour and at most a year."""
    found = _LENGTH.match(text.strip().lower())
    hours = (int(found.group(1)) * (24 if found.group(2) == "d" else 1)) if found else 0
    if not found or not 1 <= hours <= MAX_HOURS:
        raise ValidationFailed("reserved_for", f"the length is whole days or hours, e.g. 3d or 36h; {USAGE}")
    return timedelta(hours=hours)
