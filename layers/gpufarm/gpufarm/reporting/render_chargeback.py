"""The chargeback as CSV (`--format chargeback`): the columns docs/operate.md ("Chargeback") documents, one line
per team x project x environment, then the totals line (`team` = TOTAL).

Hours are written with three decimals, money with two (the cents every figure is rounded to) in the file's
`currency`; an unpriced row's money cells are empty, never 0. Every cell passes through
gpufarm.reporting.cells.csv_cell (team, project and environment come from incidents, which can be edited by hand).
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

from gpufarm.reporting.cells import csv_cell
from gpufarm.reporting.chargeback import COST_KINDS, HOUR_KINDS, Chargeback, ChargeRow

TOTAL = "TOTAL"
COLUMNS = (
    "month",
    "team",
    "project",
    "environment",
    "cost_center",
    "leases",
    *(f"gpu_hours_{k}" for k in HOUR_KINDS),
    *(f"cost_{k}" for k in COST_KINDS),
    "cost_total",
    "currency",
    "priced",
    "unpriced_gpu_hours",
)


def _money(value: Decimal | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _row(report: Chargeback, row: ChargeRow) -> list[str]:
    return [
        report.month,
        row.team,
        row.project,
        row.environment,
        row.cost_center,
        str(row.leases),
        *(f"{row.hours[k]:.3f}" for k in HOUR_KINDS),
        *(_money(row.cost(k)) for k in COST_KINDS),
        _money(row.cost("total")),
        report.currency,
        row.priced,
        f"{row.unpriced_hours:.3f}",
    ]


def _totals(report: Chargeback) -> list[str]:
    unpriced = report.unpriced_rows
    priced = "yes" if not unpriced else f"incomplete: {unpriced} of {len(report.rows)} rows unpriced or partly priced"
    if report.cut:
        priced += "; leases past the report's limit not read"
    return [
        report.month,
        TOTAL,
        "",
        "",
        "",
        str(sum(r.leases for r in report.rows)),
        *(f"{report.total_hours(k):.3f}" for k in HOUR_KINDS),
        *(_money(report.total_cost(k)) for k in COST_KINDS),
        _money(report.total_cost()),
        report.currency,
        priced,
        f"{sum(r.unpriced_hours for r in report.rows):.3f}",
    ]


def render_chargeback(report: Chargeback) -> str:
    """The chargeback as CSV text (RFC 4180 quoting, `\\r\\n` line ends)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for row in report.rows:
        writer.writerow([csv_cell(c) for c in _row(report, row)])
    writer.writerow([csv_cell(c) for c in _totals(report)])
    return buffer.getvalue()
