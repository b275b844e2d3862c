"""A lease's squatting episodes, as its incident keeps them, and what an alert or a recovery does to them; pure.

An episode is one device of the lease squatted without a break: it starts with the squatter monitor's alert for the
group {host, gpu_uuid, gpu_ir} and ends with that group's recovery (gpufarm.setup.squatter_monitor). The open ones
live in the lease's `gpufarm_squatters` field, one `<host>/<uuid>=<since>` entry each, with `;stop=<time>` once
gpufarm published the stop (gpufarm.core.config.squatters, stop-after). So:

- an alert for a device with no open episode opens one: the operators and the holder are told, once;
- an alert for a device whose episode is open (a retried webhook, a re-notification) tells nobody again; under
  stop-after, once the episode is older than the grace and no stop is published, it decides the stop;
- a recovery ends the episode (and lifts its stop); the next alert is a new episode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpufarm.core.config.squatters import SquatterPolicy
from gpufarm.core.kernel.model import isoformat, parse_time

SEP = "/"
STOP_MARK = ";stop="
# A lease keeps at most this many open episodes (a host of 8 GPUs x 7 MIG slices is 56 devices).
MAX_EPISODES = 64


@dataclass(frozen=True)
class Episode:
    """One squatted device of a lease: since when, and when its stop was published (None: not stopped)."""

    part: str  # `<host>/<uuid>`
    since: datetime
    stop_at: datetime | None = None

    @property
    def host(self) -> str:
        """The host of the squatted device."""
        return self.part.partition(SEP)[0]

    @property
    def device(self) -> str:
        """The squatted device's uuid."""
        return self.part.partition(SEP)[2]


class Step(StrEnum):
    """What a squatter alert does to a lease's episode on one device."""

    NOTHING = "nothing"  # the episode is open and told; no stop due (or none under this policy)
    OPEN = "open"  # a new episode: tell the operators and the holder, record it
    STOP = "stop"  # the episode outlasted the grace under stop-after: publish the stop, record and tell it


def part_of(host: str, device: str) -> str:
    """The episode key of a device: `<host>/<uuid>` (Datadog lowercases tags; so does the key)."""
    return f"{host.lower()}{SEP}{device.lower()}"


def decode(items: Iterable[str]) -> dict[str, Episode]:
    """The open episodes a field holds; malformed entries are skipped (a hand-edited field never crashes a step)."""
    out: dict[str, Episode] = {}
    for item in items:
        part, _, rest = item.partition("=")
        since_text, _, stop_text = rest.partition(STOP_MARK)
        since = parse_time(since_text)
        if SEP not in part or since is None:
            continue
        out[part] = Episode(part, since, parse_time(stop_text) if stop_text else None)
        if len(out) >= MAX_EPISODES:
            break
    return out


def encode(episodes: Mapping[str, Episode]) -> list[str]:
    """The field's entries, oldest episode first, at most MAX_EPISODES."""
    ordered = sorted(episodes.values(), key=lambda e: (e.since, e.part))[:MAX_EPISODES]
    return [
        f"{e.part}={isoformat(e.since)}" + (f"{STOP_MARK}{isoformat(e.stop_at)}" if e.stop_at is not None else "")
        for e in ordered
    ]


def stop_due(episode: Episode, policy: SquatterPolicy) -> datetime | None:
    """When the episode's squatter is to be stopped under the policy; None when it never is (report)."""
    if not policy.stops:
        return None
    return episode.since + timedelta(minutes=policy.grace_minutes)


def decide_alert(
    episodes: Mapping[str, Episode], part: str, now: datetime, policy: SquatterPolicy, *, exempt: bool
) -> tuple[Step, Episode]:
    """What an alert for `part` does: open an episode, stop its squatter, or nothing; with the episode as it is then.

    `exempt`: an operator exempted the host from stops (`gpufarm_exempt:squatters`): report only.
    """
    episode = episodes.get(part)
    if episode is None:
        # Past MAX_EPISODES open on one lease, a further device is not kept (nor told): the field stays bounded.
        return (Step.NOTHING if len(episodes) >= MAX_EPISODES else Step.OPEN), Episode(part, now)
    due = stop_due(episode, policy)
    if exempt or episode.stop_at is not None or due is None or now < due:
        return Step.NOTHING, episode
    return Step.STOP, Episode(episode.part, episode.since, now)


def minutes_between(start: datetime, end: datetime) -> int:
    """Whole minutes from start to end (never negative)."""
    return max(0, int((end - start).total_seconds() // 60))
