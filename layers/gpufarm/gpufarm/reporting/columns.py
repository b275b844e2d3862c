"""A report's columns, in one place: the table, the CSV, the JSON and the Slack summary name them the same way."""

from __future__ import annotations

from collections.abc import Callable

from gpufarm.core.kernel.lifecycle import ReclaimReason
from gpufarm.reporting import money
from gpufarm.reporting.model import Row

# Reclaim reasons as CSV columns, always all of them (a stable schema for spreadsheets), and "other".
REASONS = (*(r.value for r in ReclaimReason), "other")


def _hours(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _cost(kind: str) -> Callable[[Row], str]:
    """A money cell for the CSV: `1234.56` in the report's currency, empty when unpriced."""

    def cell(row: Row) -> str:
        value = money.amount(row, kind)
        return "" if value is None else f"{value:.2f}"

    return cell


# (header, cell) of the numeric columns every format shows, in order.
COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("leases", lambda r: str(r.leases)),
    ("gpu_hours_held", lambda r: _hours(r.held)),
    ("cost_held", _cost("held")),
    ("gpu_hours_busy", lambda r: _hours(r.busy)),
    ("cost_busy", _cost("busy")),
    ("gpu_hours_idle", lambda r: _hours(r.idle)),
    ("cost_idle", _cost("idle")),
    ("gpu_hours_idle_held", lambda r: _hours(r.idle_held)),
    ("cost_idle_held", _cost("idle_held")),
    ("gpu_hours_unmeasured", lambda r: _hours(r.unmeasured)),
    ("cost_unmeasured", _cost("unmeasured")),
    ("unpriced_leases", lambda r: str(r.unpriced_leases)),
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


# The hours the table and the HTML show, each followed by its cost.
SHOWN_KINDS = ("held", "busy", "idle", "idle_held", "unmeasured")


def shown(row: Row, utilisation_digits: int) -> list[str]:
    """The numbers the table and the HTML show for a row, up to the exemptions, as people read them (1,234.5),
    each kind's hours followed by its cost (`1,234.56`, `unpriced`, or marked incomplete)."""
    util = "-" if row.utilisation is None else f"{row.utilisation:.{utilisation_digits}f}"
    figures: list[str] = []
    for kind in SHOWN_KINDS:
        figures += [f"{getattr(row, kind):,.1f}", money.money_text(row, kind)]
    return [str(row.leases), *figures, util, str(row.idle_warnings), str(row.keeps), str(row.exemptions)]


def reclaims_by_reason(row: Row) -> dict[str, int]:
    """Every reason's count (0 when none), unknown ones under `other`."""
    out = dict.fromkeys(REASONS, 0)
    for reason, n in row.reclaims.items():
        out[reason if reason in out else "other"] += n
    return out
