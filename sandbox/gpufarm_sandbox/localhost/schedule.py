"""EventBridge schedule expressions (`rate(...)`, `cron(...)`, `at(...)`) evaluated on the sandbox clock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_CRON = re.compile(r"^cron\((.+)\)$")
_AT = re.compile(r"^at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)$")
_UNIT_S = {"minute": 60, "hour": 3600, "day": 86400}
_MONTHS = {
    m: i for i, m in enumerate(("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), 1)
}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"), 1)}
_SEARCH_DAYS = 366 * 5


class ScheduleError(ValueError):
    """An expression the local host cannot evaluate."""


def _field(text: str, low: int, high: int, names: dict[str, int] | None = None) -> frozenset[int] | None:
    """One cron field as the set of allowed values; None for `*` / `?` (anything)."""
    if text in ("*", "?"):
        return None
    values: set[int] = set()
    for item in text.split(","):
        step, part = 1, item
        if "/" in item:
            part, step_text = item.split("/", 1)
            if not step_text.isdigit() or int(step_text) < 1:
                raise ScheduleError(f"bad step in {text!r}")
            step = int(step_text)
        if part in ("*", ""):
            start, end = low, high
        elif "-" in part:
            first, last = part.split("-", 1)
            start, end = _value(first, names), _value(last, names)
        else:
            start = _value(part, names)
            end = high if step > 1 else start
        if not (low <= start <= high and low <= end <= high) or start > end:
            raise ScheduleError(f"{text!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, names: dict[str, int] | None) -> int:
    upper = text.upper()
    if names and upper in names:
        return names[upper]
    if not text.isdigit():
        raise ScheduleError(f"unsupported cron value {text!r} (L, W and # are not evaluated locally)")
    return int(text)


@dataclass(frozen=True)
class Cron:
    """AWS cron: minutes hours day-of-month month day-of-week(1=SUN) year."""

    minutes: frozenset[int] | None
    hours: frozenset[int] | None
    days: frozenset[int] | None
    months: frozenset[int] | None
    weekdays: frozenset[int] | None
    years: frozenset[int] | None

    @classmethod
    def parse(cls, body: str) -> Cron:
        """Parse the six space-separated fields inside `cron(...)`."""
        parts = body.split()
        if len(parts) != 6:
            raise ScheduleError("cron() takes six fields: minutes hours day-of-month month day-of-week year")
        return cls(
            _field(parts[0], 0, 59),
            _field(parts[1], 0, 23),
            _field(parts[2], 1, 31),
            _field(parts[3], 1, 12, _MONTHS),
            _field(parts[4], 1, 7, _DAYS),
            _field(parts[5], 1970, 2199),
        )

    def _day_matches(self, day: datetime) -> bool:
        weekday = (day.isoweekday() % 7) + 1  # isoweekday: Mon=1..Sun=7 -> AWS: Sun=1..Sat=7
        return (
            (self.years is None or day.year in self.years)
            and (self.months is None or day.month in self.months)
            and (self.days is None or day.day in self.days)
            and (self.weekdays is None or weekday in self.weekdays)
        )

    def next_after(self, moment: datetime) -> datetime | None:
        """The first matching minute strictly after `moment` (in moment's timezone), or None within five years."""
        start = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
        hours = sorted(self.hours) if self.hours is not None else list(range(24))
        minutes = sorted(self.minutes) if self.minutes is not None else list(range(60))
        day = start.replace(hour=0, minute=0)
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                for hour in hours:
                    for minute in minutes:
                        candidate = day.replace(hour=hour, minute=minute)
                        if candidate >= start:
                            return candidate
            day = (day + timedelta(days=1)).replace(hour=0, minute=0)
        return None


@dataclass(frozen=True)
class Expression:
    """A parsed schedule expression: exactly one of interval, cron or at is set."""

    text: str
    interval: float | None = None
    cron: Cron | None = None
    at: datetime | None = None
    timezone: str = "UTC"

    @classmethod
    def parse(cls, text: str, timezone: str = "UTC") -> Expression:
        """Parse `rate(N unit)`, `cron(...)` or `at(yyyy-mm-ddThh:mm:ss)`."""
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ScheduleError(f"unknown timezone {timezone!r}") from None
        if match := _RATE.match(text):
            amount, unit = int(match[1]), match[2].rstrip("s")
            if amount < 1 or (amount > 1 and match[2] == unit) or (amount == 1 and match[2] != unit):
                # EventBridge insists on "1 minute" but "5 minutes".
                raise ScheduleError(f"{text!r}: use the singular unit for 1 and the plural otherwise")
            return cls(text, interval=float(amount * _UNIT_S[unit]), timezone=timezone)
        if match := _CRON.match(text):
            return cls(text, cron=Cron.parse(match[1]), timezone=timezone)
        if match := _AT.match(text):
            return cls(text, at=datetime.fromisoformat(match[1]).replace(tzinfo=ZoneInfo(timezone)), timezone=timezone)
        raise ScheduleError(f"unsupported schedule expression {text!r}")

    def next_after(self, epoch: float, *, start: float) -> float | None:
        """The next tick strictly after `epoch`, for a schedule created at `start` (epoch seconds)."""
        if self.interval is not None:
            periods = int((epoch - start) // self.interval) + 1
            return start + max(periods, 1) * self.interval
        if self.at is not None:
            due = self.at.timestamp()
            return due if due > epoch else None
        assert self.cron is not None
        moment = datetime.fromtimestamp(epoch, UTC).astimezone(ZoneInfo(self.timezone))
        found = self.cron.next_after(moment)
        return found.timestamp() if found is not None else None
