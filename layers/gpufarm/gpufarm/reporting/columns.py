"""A report's columns, in one place: the table, the CSV, the JSON and the Slack summary name them the same way."""

from __future__ import annotations

from collections.abc import Callable

from gpufarm.core.kernel.lifecycle import ReclaimReason
from gpufarm.reporting.model import Row

# Reclaim reasons as CSV columns, always all of them (a stable schema for spreadsheets), and "other".
REASONS = (*(r.value for r in ReclaimReason), "other")


def _hours(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


# (header, cell) of the numeric columns every format shows, in order.
COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("leases", lambda r: str(r.leases)),
    ("gpu_hours_held", lambda r: _hours(r.held)),
    ("gpu_hours_busy", lambda r: _hours(r.busy)),
    ("gpu_hours_idle", lambda r: _hours(r.idle)),
    ("gpu_hours_unmeasured", lambda r: _hours(r.unmeasured)),
    ("gpu_hours_reserved", lambda r: _hours(r.reserved)),
    ("unmeasured_leases", lambda r: str(r.unmeasured_leases)),
    ("utilisation_percent", lambda r: _percent(r.utilisation)),
    ("idle_warnings", lambda r: str(r.idle_warnings)),
    ("keeps", lambda r: str(r.keeps)),
    ("exemptions", lambda r: str(r.exemptions)),
    ("squatter_episodes", lambda r: str(r.squatter_episodes)),
    ("squatters_stopped", lambda r: str(r.squatter_stops)),
    ("wait_avg_hours", lambda r: _hours(r.wait_avg)),
    ("wait_max_hours", lambda r: _hours(r.wait_max)),
)


def shown(row: Row, utilisation_digits: int) -> list[str]:
    """The numbers the table and the HTML show for a row, up to the exemptions, as people read them (1,234.5)."""
    util = "-" if row.utilisation is None else f"{row.utilisation:.{utilisation_digits}f}"
    hours = [f"{h:,.1f}" for h in (row.held, row.busy, row.idle, row.unmeasured)]
    return [str(row.leases), *hours, util, str(row.idle_warnings), str(row.keeps), str(row.exemptions)]


def reclaims_by_reason(row: Row) -> dict[str, int]:
    """Every reason's count (0 when none), unknown ones under `other`."""
    out = dict.fromkeys(REASONS, 0)
    for reason, n in row.reclaims.items():
        out[reason if reason in out else "other"] += n
    return out
