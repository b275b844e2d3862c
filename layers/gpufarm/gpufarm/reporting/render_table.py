"""A report as a plain-text table for the terminal (`--format table`, the default)."""

from __future__ import annotations

from gpufarm.reporting import reasons
from gpufarm.reporting.cells import NOTE_CHARS, table_cell
from gpufarm.reporting.columns import shown
from gpufarm.reporting.model import LeaseLine, PoolLine, Report, Row

_HOURS = ("held", "busy", "idle", "idle-held", "unmeas.")


def _head(currency: str) -> tuple[str, ...]:
    figures = [name for kind in _HOURS for name in (f"{kind} h", table_cell(currency or "cost"))]
    return ("group", "leases", *figures, "util %", "warn", "keep", "exempt", "wait h")


def _cells(row: Row) -> tuple[str, ...]:
    wait = "-" if row.wait_avg is None else f"{row.wait_avg:.1f}"
    return tuple(table_cell(c) for c in (row.key, *shown(row, 0), wait))


def _line(lease: LeaseLine, value: float) -> str:
    team, project, env = (table_cell(x) for x in (lease.team, lease.project, lease.environment))
    return f"  IR-{lease.ir} {team}/{project} ({env}): {value:,.1f} of {lease.held:,.1f} h"


def render_table(report: Report) -> str:
    """Rows, the total, then reclaims, quota and budgets per group, the notes and the leases worth naming."""
    out = [f"gpufarm report: {table_cell(report.query.describe())}", "", *_table(report), ""]
    extras = [_extras(row) for row in report.rows]
    out += ["per group:", *extras, ""] if extras else []
    out += [f"reasons: {table_cell(reasons.reasons_text(report.reasons), NOTE_CHARS)}"] if report.reasons else []
    out += [f"note: {table_cell(n, NOTE_CHARS)}" for n in report.notes]
    if report.pools:
        out += ["", f"pools (unallocated: capacity no lease held; {table_cell(report.currency)}):"]
        out += [_pool(p) for p in report.pools]
    if report.unmeasured:
        out += ["", "unmeasured GPU-hours (no agent answer, or since the last accrual):"]
        out += [_line(x, x.unmeasured) for x in report.unmeasured]
    if report.top_idle:
        out += ["", "top idle leases (idle GPU-hours, no process):"]
        out += [_line(x, x.idle) for x in report.top_idle]
    return "\n".join(out) + "\n"


def _table(report: Report) -> list[str]:
    """The head, the rows and the total, columns aligned (the group left, the figures right)."""
    head = _head(report.currency)
    rows = [head, *(_cells(r) for r in report.rows), _cells(report.total)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]

    def fmt(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    rule = "  ".join("-" * w for w in widths)
    return [fmt(rows[0]), rule, *(fmt(r) for r in rows[1:-1]), rule, fmt(rows[-1])]


def _extras(row: Row) -> str:
    """A group's reclaims, and its quota held now and budgets when it has them."""
    parts = [f"reclaims: {table_cell(row.reclaims_text(), NOTE_CHARS)}"]
    parts += [f"quota held now: {table_cell(row.quota_text())}"] if row.quota_text() else []
    parts += [f"budget: {table_cell(row.budgets_text(), NOTE_CHARS)}"] if row.budgets else []
    return f"  {table_cell(row.key)}: " + "; ".join(parts)


def _pool(pool: PoolLine) -> str:
    """`  onprem-hpc H100: 32.0 GPUs, 23,040.0 h capacity, 20,000.0 held, 3,040.0 unallocated (7,600.00)`."""
    where = f"  {table_cell(pool.environment)} {table_cell(pool.model)}: "
    if pool.capacity is None or pool.unallocated is None or pool.gpus is None:
        return f"{where}{pool.held:,.1f} h held, capacity not read"
    cost = "unpriced" if pool.unallocated_cost is None else f"{pool.unallocated_cost:,.2f}"
    return (
        f"{where}{pool.gpus:,.1f} GPUs, {pool.capacity:,.1f} h capacity, {pool.held:,.1f} held, "
        f"{pool.unallocated:,.1f} unallocated ({cost})"
    )
