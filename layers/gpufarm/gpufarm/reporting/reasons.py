"""Reasons counted in a report: how many waits, refusals, withdrawals and ends of each code fell in its period.

Every reason gpufarm gives is written in the lease's history as its entry's last detail, `<sentence> [<code>]`
(gpufarm.core.kernel.reason_trail); a report counts each entry whose time falls in the period, and a lease whose
history holds none in a readable form (folded away) by its field `gpufarm_reason` when it ended in the period.
Ends that never held a GPU-hour (refused, rejected, withdrawn, cancelled) are found by the month of their end
(`gpufarm_reason_month`, `ended_query`), as the others are found by the months they accrued in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from gpufarm.core.kernel import history, reason_trail
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.reporting.query import Period


def ended_query(months: Sequence[str], team: str | None = None) -> IncidentQuery:
    """Resolved leases that ended with a reason in any of these months (of one team, when given)."""
    # The field gpufarm.core.kernel.fields.REASON_MONTH, by its name.
    return IncidentQuery.where({State.RESOLVED}, team=team, gpufarm_reason_month=months)


def counted(leases: Iterable[LeaseFacts], period: Period) -> Counter[str]:
    """How many times each reason code was given inside the period across `leases`."""
    out: Counter[str] = Counter()
    for alloc in leases:
        found = False
        for line in alloc.history:
            code = reason_trail.code_of(line)
            entry = history.parse(line) if code is not None else None
            if code is None or entry is None:
                continue
            found = True
            if period.start <= entry.at < period.end:
                out[code.value] += 1
        if not found and alloc.reason and alloc.state is State.RESOLVED:
            moment = alloc.hours_until or alloc.modified
            if moment is not None and period.start <= moment < period.end:
                out[alloc.reason] += 1
    return out


def reasons_text(counts: Counter[str]) -> str:
    """`queued-capacity 3, reclaimed-idle 1` (codes sorted), or '-'."""
    return ", ".join(f"{code} {n}" for code, n in sorted(counts.items())) or "-"
