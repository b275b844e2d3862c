"""The digest's outlook line (gpufarm.core.outlook): the pool with the most unmet demand since the last digest, and
the first week ahead in which a pool's capacity runs out. Shown beside the news, never news itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from gpufarm.core.chat.escape import inert
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.outlook.capacity import first_short, outlook
from gpufarm.core.outlook.demand import unmet_demand

TITLE = "Outlook"


def outlook_lines(
    live: Iterable[Allocation],
    ended: Iterable[LeaseFacts],
    capacity: Mapping[tuple[str, str], tuple[int, int]],
    *,
    since: datetime,
    until: datetime,
    now: datetime,
) -> list[str]:
    """Two lines: the most unmet demand in [since, until) (or none), and where capacity runs out first (or not)."""
    leases = list(live)
    facts = {a.ir: LeaseFacts.of(a) for a in leases} | {a.ir: a for a in ended}
    demand = unmet_demand(facts.values(), since, until, now)
    out: list[str] = []
    if demand:
        top = demand[0]
        refused, withdrawn = sum(top.refused.values()), sum(top.withdrawn.values())
        out.append(
            f"Most unmet demand: `{inert(top.environment)}` {inert(top.gpu_model)}, "
            f"{top.waiting_gpu_hours:,.1f} GPU-hours waited by {top.waited} request(s), "
            f"{refused} refused, {withdrawn} withdrawn"
        )
    else:
        out.append("No unmet demand since the last digest: no request waited for hosts, was refused or withdrawn")
    if capacity:
        short = first_short(outlook(leases, {k: total for k, (_, total) in capacity.items()}, now))
        if short is None:
            out.append("Capacity does not run out in the next four weeks in any pool")
        else:
            pool, slot = short
            out.append(
                f"Capacity runs out first in `{inert(pool.environment)}` {inert(pool.gpu_model)} the week of "
                f"{slot.start:%Y-%m-%d} ({slot.free} free at its busiest moment)"
            )
    return out
