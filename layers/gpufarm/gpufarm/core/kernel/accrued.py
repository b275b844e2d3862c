"""The arithmetic of accrued GPU-hours: what a lease holds per host, its hours per month, where its next accrual
starts, and how an interval splits across calendar months.

Pure functions of a lease's recorded facts, with nothing of the runtime behind them: the ledger's accruals
(gpufarm.core.accounting.gpu_hours), the budgets (gpufarm.core.accounting.burn) and the reports read them, on an
Allocation or on the light record reports decode (gpufarm.core.kernel.lease_facts). `HeldLease` names what they
read, so either serves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from gpufarm.core.kernel.lifecycle import Phase


class HeldLease(Protocol):
    """The facts of a lease the ledger's arithmetic reads (Allocation and LeaseFacts both have them)."""

    @property
    def ir(self) -> int: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def team(self) -> str | None: ...
    @property
    def project(self) -> str | None: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def hosts(self) -> Sequence[str]: ...
    @property
    def host_gpus(self) -> Mapping[str, int]: ...
    @property
    def allocated_at(self) -> datetime | None: ...
    @property
    def hours_until(self) -> datetime | None: ...
    @property
    def hours_by_month(self) -> Sequence[str]: ...


def held_by_host(alloc: HeldLease) -> dict[str, int]:
    """GPUs (or units) the lease holds on each host: what its incident records (gpufarm.core.governance.charging)."""
    if alloc.host_gpus:
        return dict(alloc.host_gpus)
    return {alloc.hosts[0]: alloc.gpu_count} if alloc.hosts else {}


def by_month(alloc: HeldLease) -> dict[str, float]:
    """`YYYY-MM=hours` entries as a mapping (malformed entries skipped)."""
    out: dict[str, float] = {}
    for entry in alloc.hours_by_month:
        month, sep, text = entry.partition("=")
        if not sep or len(month) != 7 or month[4] != "-" or not (month[:4] + month[5:]).isdigit():
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            out[month] = out.get(month, 0.0) + value
    return out


def accrued_since(alloc: HeldLease) -> datetime | None:
    """Where the next accrual starts: the last one's end, else the allocation."""
    return alloc.hours_until or alloc.allocated_at


def month_spans(start: datetime, end: datetime) -> list[tuple[str, float]]:
    """(`YYYY-MM`, hours) of the interval in each calendar month (UTC)."""
    spans: list[tuple[str, float]] = []
    cursor = start.astimezone(UTC)
    end = end.astimezone(UTC)
    while cursor < end:
        first_next = (cursor.replace(day=1, hour=0, minute=0, second=0, microsecond=0) + timedelta(days=32)).replace(
            day=1
        )
        stop = min(end, first_next)
        spans.append((f"{cursor.year:04d}-{cursor.month:02d}", (stop - cursor).total_seconds() / 3600))
        cursor = stop
    return spans
