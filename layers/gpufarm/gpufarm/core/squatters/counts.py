"""Squatting counted from the leases themselves, for the daily digest and the reports; pure.

Every episode is in its lease's history: `squatted: on <host>/<uuid>` when it began, `squatter-stopped` when its
stop was published, `squatter-cleared: on <host>/<uuid> after <n> min` when it ended, and the open ones in the
lease's `gpufarm_squatters` field. Over a window an episode counts once if it began in it, and its device-hours are
the part of it inside the window (an open episode runs to the window's end). A device no lease holds keeps no
episode (gpufarm.core.squatters.alerts), so the digest's unattributed section, not this, shows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gpufarm.core.kernel import history
from gpufarm.core.kernel.history import Step
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.squatters import episodes

_BEGAN, _STOPPED, _ENDED = Step.SQUATTED.value, Step.SQUATTER_STOPPED.value, Step.SQUATTER_CLEARED.value


@dataclass
class SquatterTally:
    """Episodes begun, stops published and squatted device-hours over a window, with device-hours per host."""

    episodes: int = 0
    stops: int = 0
    device_hours: float = 0.0
    hosts: dict[str, float] = field(default_factory=dict)

    def add(self, other: SquatterTally) -> None:
        """Fold another tally (another lease's, another team's) into this one."""
        self.episodes += other.episodes
        self.stops += other.stops
        self.device_hours += other.device_hours
        for host, hours in other.hosts.items():
            self.hosts[host] = self.hosts.get(host, 0.0) + hours

    def top_hosts(self, count: int) -> list[tuple[str, float]]:
        """The hosts with the most squatted device-hours, most first."""
        return sorted(self.hosts.items(), key=lambda item: (-item[1], item[0]))[:count]


def _part(details: str) -> str | None:
    """The `<host>/<uuid>` a squatter history line names (`on <part>...`)."""
    if not details.startswith("on "):
        return None
    part = details[3:].split(" ", 1)[0].split(";", 1)[0]
    return part if episodes.SEP in part else None


def lease_tally(alloc: Allocation, since: datetime, until: datetime) -> SquatterTally:
    """One lease's squatting over [since, until)."""
    tally = SquatterTally()
    started: dict[str, datetime] = {}
    spans: list[tuple[str, datetime, datetime]] = []
    for line in alloc.history:
        entry = history.parse(line)
        if entry is None or not entry.step.startswith("squat"):
            continue
        part = _part(entry.details)
        if part is None:
            continue
        if entry.step == _BEGAN:
            started[part] = entry.at
            tally.episodes += since <= entry.at < until
        elif entry.step == _STOPPED:
            tally.stops += since <= entry.at < until
        elif entry.step == _ENDED and part in started:
            spans.append((part, started.pop(part), entry.at))
    for part, episode in episodes.decode(alloc.squatters).items():
        spans.append((part, started.get(part, episode.since), until))
    for part, begin, end in spans:
        hours = max(0.0, (min(end, until) - max(begin, since)).total_seconds() / 3600)
        if hours:
            tally.device_hours += hours
            host = part.partition(episodes.SEP)[0]
            tally.hosts[host] = tally.hosts.get(host, 0.0) + hours
    return tally


def squatted(alloc: Allocation) -> bool:
    """True when the lease has an open episode or one in its history (a cheap test before `lease_tally`)."""
    return bool(alloc.squatters) or any(f" {_BEGAN}: " in line for line in alloc.history)


def tally(leases: Iterable[Allocation], since: datetime, until: datetime) -> SquatterTally:
    """Every lease's squatting over [since, until), summed."""
    total = SquatterTally()
    for alloc in leases:
        if squatted(alloc):
            total.add(lease_tally(alloc, since, until))
    return total
