"""What a report covers: its period (`--since 30d` or `--month 2026-11`), its grouping and its filters, validated.

Every value comes from a person typing a command, so each is bounded (docs/design.md, rule 10): a period is at
least one hour and at most MAX_DAYS days, a month is a real calendar month that has started, and a team or project
must be one the farm knows. A bad value raises ValidationFailed naming the option; nothing is read or written.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.kernel.accrued import month_spans
from gpufarm.core.kernel.display import visible
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.field_values import isoformat
from gpufarm.core.kernel.names import validate_name

# A report looks back at most this far: incidents keep their GPU-hours for ever, but a longer look is a new report.
MAX_DAYS = 366
DEFAULT_SINCE = "30d"
_SINCE_RE = re.compile(r"^([0-9]{1,6})([hdwy])$")
_MONTH_RE = re.compile(r"^([0-9]{4})-([0-9]{2})$")
_UNIT_HOURS = {"h": 1, "d": 24, "w": 24 * 7, "y": 24 * 365}
_UNIT_NAMES = {"h": "hours", "d": "days", "w": "weeks", "y": "years"}


class GroupBy(StrEnum):
    """What one row of a report is."""

    TEAM = "team"
    PROJECT = "project"
    IR = "ir"
    ENVIRONMENT = "environment"


@dataclass(frozen=True)
class Period:
    """A half-open interval [start, end) in UTC and how people name it."""

    start: datetime
    end: datetime
    label: str

    @property
    def hours(self) -> float:
        """Its length in hours."""
        return (self.end - self.start).total_seconds() / 3600

    @property
    def months(self) -> tuple[str, ...]:
        """The `YYYY-MM` months it touches (the months incidents split their held GPU-hours by)."""
        return tuple(m for m, _ in month_spans(self.start, self.end))


@dataclass(frozen=True)
class ReportQuery:
    """A validated report request."""

    period: Period
    by: GroupBy = GroupBy.TEAM
    team: str | None = None
    project: str | None = None

    def describe(self) -> str:
        """`2026-11 by team (team nlp)`: what the report's title says it covers."""
        scope = [f"team {self.team}"] if self.team else []
        scope += [f"project {self.project}"] if self.project else []
        suffix = f" ({', '.join(scope)})" if scope else ""
        return f"{self.period.label} by {self.by.value}{suffix}"


def since_period(text: str, now: datetime) -> Period:
    """`30d` (also `12h`, `2w`, `1y`) back from now; ValidationFailed for zero, garbage or past MAX_DAYS."""
    value = text.strip().lower()
    match = _SINCE_RE.match(value)
    if match is None:
        raise ValidationFailed("since", f"--since {text[:20]!r}: use a number and h, d, w or y, e.g. 30d")
    count, unit = int(match.group(1)), match.group(2)
    if count == 0:
        raise ValidationFailed("since", f"--since {value}: the period must be longer than zero")
    hours = count * _UNIT_HOURS[unit]
    if hours > MAX_DAYS * 24:
        raise ValidationFailed(
            "since", f"--since {value}: at most {MAX_DAYS} days back ({count} {_UNIT_NAMES[unit]} is beyond that)"
        )
    end = now.astimezone(UTC)
    return Period(end - timedelta(hours=hours), end, f"last {value} to {isoformat(end)}")


def month_period(text: str, now: datetime) -> Period:
    """A calendar month (UTC), up to now when it is the current one; ValidationFailed for a bad or future month."""
    value = text.strip()
    match = _MONTH_RE.match(value)
    if match is None:
        raise ValidationFailed("month", f"--month {value[:20]!r}: use YYYY-MM, e.g. 2026-11")
    year, month = int(match.group(1)), int(match.group(2))
    if not 1 <= month <= 12:
        raise ValidationFailed("month", f"--month {value}: there is no month {month:02d}")
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    current = now.astimezone(UTC)
    if start > current:
        raise ValidationFailed("month", f"--month {value}: that month has not started yet")
    if current - end > timedelta(days=MAX_DAYS):
        raise ValidationFailed(
            "month", f"--month {value}: it ended more than {MAX_DAYS} days ago (at most {MAX_DAYS} days back)"
        )
    return Period(start, min(end, current), value)


def parse_query(
    farm: FarmView,
    now: datetime,
    *,
    since: str | None = None,
    month: str | None = None,
    by: str = GroupBy.TEAM.value,
    team: str | None = None,
    project: str | None = None,
    known_projects: Collection[str] = (),
) -> ReportQuery:
    """The report a user asked for, every option checked against the bounds and the farm.

    known_projects: the projects the farm's budgets and the leases name (a project is a lease's field, not a
    section of the farm file); a `--project` outside them is refused like an unknown team.
    """
    if since is not None and month is not None:
        raise ValidationFailed("since", "give --since or --month, not both")
    period = month_period(month, now) if month is not None else since_period(since or DEFAULT_SINCE, now)
    try:
        group = GroupBy(by.strip().lower())
    except ValueError:
        choices = ", ".join(g.value for g in GroupBy)
        raise ValidationFailed("by", f"--by {by[:20]!r}: choose one of {choices}") from None
    if team is not None:
        team = validate_name("team", team)
        farm.team(team)
    return ReportQuery(period, group, team, known_project(project, known_projects))


def known_project(project: str | None, known_projects: Collection[str]) -> str | None:
    """`project` checked against the projects the farm's budgets and the leases name (None stays None)."""
    if project is None:
        return None
    project = validate_name("project", project)
    if project not in known_projects:
        # The leases' projects are incident fields, which can be edited by hand: listed as data.
        known = ", ".join(visible(p, 64) for p in sorted(known_projects)[:20]) or "none yet"
        raise ValidationFailed("project", f"unknown project '{project}'; projects: {known}")
    return project


def budget_projects(farm: FarmView) -> set[str]:
    """Projects the farm file names (in its budgets)."""
    return {b.project for b in farm.budgets if b.project}
