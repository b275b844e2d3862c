"""The order a pool serves its waiting requests in, and why each stands where it stands.

One ordering function per pool, chosen by its `scheduling.queue` (gpufarm.core.config.scheduling): allocation
serves the queue in this order (gpufarm.core.leases.allocation: a request waits while one ahead of it waits), and
every position shown (`/gpu list`, `/gpu status`, the waiting notice, App Home, `/gpu why`) is counted in it.

- `fifo`: first come, first served per model (by IR, which is the order requests were made in).
- `fair-share`: the team that used least of its share of the pool over the usage window comes first (used
  GPU-hours / share GPU-hours, gpufarm.core.leases.fair_share), ties by age (IR). A team without a quota in the
  pool has no share and comes after every team that has one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufarm.core.config.scheduling import QueuePolicy
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.kernel.reasons import Reason, ReasonCode

# How many teams ahead a position names (the rest are counted).
MAX_NAMED_AHEAD = 3


@dataclass(frozen=True)
class Standing:
    """A team's fair-share standing in one pool: GPU-hours held over the window against its share of the pool."""

    team: str
    used_hours: float
    share_hours: float

    @property
    def ratio(self) -> float:
        """Used over share: lower is served first; a team without a share comes last."""
        if self.share_hours <= 0:
            return math.inf
        return self.used_hours / self.share_hours

    def text(self) -> str:
        """`nlp used 140 of its 300 GPU-hour share`."""
        if self.share_hours <= 0:
            return f"{self.team} used {self.used_hours:.0f} GPU-hours and has no quota share here"
        return f"{self.team} used {self.used_hours:.0f} of its {self.share_hours:.0f} GPU-hour share"


@dataclass(frozen=True)
class Order:
    """How one pool orders its queue: the policy and, for fair share, each team's standing."""

    policy: QueuePolicy = QueuePolicy.FIFO
    window_days: int = 7
    standings: Mapping[str, Standing] = field(default_factory=dict)

    def standing(self, team: str | None) -> Standing:
        """The team's standing (a team nothing is known of used nothing and has no share)."""
        name = team or ""
        return self.standings.get(name) or Standing(name, 0.0, 0.0)

    def key(self, alloc: Allocation) -> tuple[float, int]:
        """The sort key: lower is served first."""
        if self.policy is QueuePolicy.FAIR_SHARE:
            return (self.standing(alloc.team).ratio, alloc.ir)
        return (0.0, alloc.ir)

    def ranked(self, queue: Iterable[Allocation]) -> list[Allocation]:
        """The queue in the order it is served."""
        return sorted(queue, key=self.key)

    def ahead(self, alloc: Allocation, queue: Iterable[Allocation]) -> list[Allocation]:
        """The requests of `queue` served before `alloc` (itself left out)."""
        mine = self.key(alloc)
        return self.ranked(a for a in queue if a.ir != alloc.ir and self.key(a) < mine)

    def why(self, alloc: Allocation, ranked: Sequence[Allocation]) -> str:
        """Why `alloc` stands where it stands among `ranked` (its pool's queue for its model, in order)."""
        if self.policy is not QueuePolicy.FAIR_SHARE:
            return "first come, first served"
        window = "this week" if self.window_days == 7 else f"over {self.window_days} days"
        mine = self.standing(alloc.team)
        ahead: list[str] = []
        for other in ranked:
            if other.ir == alloc.ir:
                break
            if other.team != alloc.team and other.team not in ahead:
                ahead.append(other.team or "")
        parts = [f"{mine.text()} {window}"]
        for team in ahead[:MAX_NAMED_AHEAD]:
            theirs = self.standing(team)
            parts.append(f"{team} (ahead) used {theirs.used_hours:.0f} of {theirs.share_hours:.0f}")
        if len(ahead) > MAX_NAMED_AHEAD:
            parts.append(f"{len(ahead) - MAX_NAMED_AHEAD} more teams ahead")
        return "; ".join(parts)

    def waiting_reason(self, alloc: Allocation, ranked: Sequence[Allocation], *, behind: bool) -> Reason:
        """The reason a request waits: no room in the pool, or (`behind`) requests its pool serves first; the code
        says fair share where that order put a newer request ahead of it (FIFO would not have)."""
        place = next((i for i, a in enumerate(ranked, 1) if a.ir == alloc.ir), len(ranked))
        reordered = self.policy is QueuePolicy.FAIR_SHARE and any(a.ir > alloc.ir for a in ranked[: place - 1])
        code = ReasonCode.QUEUED_FAIR_SHARE if reordered else ReasonCode.QUEUED_CAPACITY
        model = (alloc.gpu_model or "").upper() or "its model"
        state = "others are served first" if behind else "no room in the pool"
        return Reason(
            code, f"{_ordinal(place)} of {len(ranked)} waiting for {model}; {state}; {self.why(alloc, ranked)}"
        )


FIFO = Order()


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"
