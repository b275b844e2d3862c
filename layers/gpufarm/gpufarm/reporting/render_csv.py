"""A report as CSV: one line per group and one total, every column named (gpufarm.reporting.columns); then, for a
whole-farm report, one line per pool and model (group cell `pool:ENV/MODEL`): the hours its leases held, its
capacity, the unallocated rest and its cost, those three empty when the capacity was not read (never 0)."""

from __future__ import annotations

import csv
import io

from gpufarm.reporting.cells import NOTE_CHARS, csv_cell
from gpufarm.reporting.columns import COLUMNS, REASONS, reclaims_by_reason
from gpufarm.reporting.model import PoolLine, Report, Row

# The pools' columns, after every group column: empty on group lines.
POOL_COLUMNS = ("capacity_gpu_hours", "unallocated_gpu_hours", "unallocated_cost")


def header(report: Report) -> list[str]:
    """The CSV's column names."""
    return [
        "period_start",
        "period_end",
        report.query.by.value,
        "currency",
        *(name for name, _ in COLUMNS),
        *(f"reclaimed_{reason}" for reason in REASONS),
        "quota_entitled_gpus",
        "gpus_held_now",
        "budgets",
        *POOL_COLUMNS,
    ]


def _line(report: Report, row: Row) -> list[str]:
    """One line's cells, every one through csv_cell (a formula prefix is quoted whichever column holds it)."""
    period = report.query.period
    reclaims = reclaims_by_reason(row)
    cells = [
        period.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        period.end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        row.key,
        report.currency,
        *(cell(row) for _, cell in COLUMNS),
        *(str(reclaims[reason]) for reason in REASONS),
        "" if row.entitled is None else str(row.entitled),
        "" if row.held_now is None else str(row.held_now),
    ]
    return [*(csv_cell(c) for c in cells), csv_cell(row.budgets_text(), NOTE_CHARS), *("" for _ in POOL_COLUMNS)]


def _pool_line(report: Report, pool: PoolLine) -> list[str]:
    """A pool's line: the group columns empty but the held hours; capacity, unallocated and its cost at the end."""
    period = report.query.period
    names = header(report)
    cells = dict.fromkeys(names, "")
    cells |= {
        "period_start": period.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "period_end": period.end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        report.query.by.value: f"pool:{pool.environment}/{pool.model}",
        "currency": report.currency,
        "gpu_hours_held": f"{pool.held:.1f}",
    }
    if pool.capacity is not None and pool.unallocated is not None:
        cells["capacity_gpu_hours"] = f"{pool.capacity:.1f}"
        cells["unallocated_gpu_hours"] = f"{pool.unallocated:.1f}"
        cells["unallocated_cost"] = "" if pool.unallocated_cost is None else f"{pool.unallocated_cost:.2f}"
    return [csv_cell(cells[name]) for name in names]


def render_csv(report: Report) -> str:
    """The report's rows and its total as CSV text (RFC 4180 quoting, `\\r\\n` line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([csv_cell(name) for name in header(report)])
    for row in [*report.rows, report.total]:
        writer.writerow(_line(report, row))
    for pool in report.pools:
        writer.writerow(_pool_line(report, pool))
    return buffer.getvalue()
