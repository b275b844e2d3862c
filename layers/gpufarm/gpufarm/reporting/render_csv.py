"""A report as CSV: one line per group and one total, every column named (gpufarm.reporting.columns)."""

from __future__ import annotations

import csv
import io

from gpufarm.reporting.cells import NOTE_CHARS, csv_cell
from gpufarm.reporting.columns import COLUMNS, REASONS, reclaims_by_reason
from gpufarm.reporting.model import Report, Row


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
    return [*(csv_cell(c) for c in cells), csv_cell(row.budgets_text(), NOTE_CHARS)]


def render_csv(report: Report) -> str:
    """The report's rows and its total as CSV text (RFC 4180 quoting, `\\r\\n` line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([csv_cell(name) for name in header(report)])
    for row in [*report.rows, report.total]:
        writer.writerow(_line(report, row))
    return buffer.getvalue()
