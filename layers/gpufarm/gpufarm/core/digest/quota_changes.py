"""The digest's section on quota changes and lending: each quota change in effect with its end and approver
(gpufarm.core.accounting.overrides), and each borrowing lease under preemption notice with its deadline
(gpufarm.core.leases.preemption); pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from gpufarm.core.accounting.overrides import Override
from gpufarm.core.chat.escape import inert, mention
from gpufarm.core.kernel.lifecycle import HOLDING
from gpufarm.core.kernel.model import Allocation, isoformat

TITLE = "Quota changes and lending"


def lines(changes: Sequence[Override], live: Iterable[Allocation], now: datetime) -> list[str]:
    """A line per quota change in effect (the soonest to end first), then per borrower under notice."""
    out = []
    for change in sorted(changes, key=lambda c: (c.until, c.ir)):
        by = f", approved by {mention(change.approved_by)}" if change.approved_by else ""
        hours = max(0.0, (change.until - now).total_seconds() / 3600)
        out.append(f"• {inert(change.label())} ({hours:.0f} h left{by})")
    noticed = [a for a in live if a.phase in HOLDING and a.preempt_at is not None]
    for a in sorted(noticed, key=lambda a: (a.preempt_at or now, a.ir)):
        deadline = isoformat(a.preempt_at) if a.preempt_at else "unknown"
        out.append(
            f"• {a.ir_label} ({inert(a.team)}, {a.borrowed} borrowed) is taken back at {deadline} "
            f"for {inert(a.preempt_for)}"
        )
    return out
