"""A report as one JSON document (`--format json`): rows, total, the leases worth naming and the notes.

Every text read from an incident or the farm file passes through gpufarm.reporting.cells.json_text, as every
other format's cells pass through theirs, so the formats say the same.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from gpufarm.core.kernel.field_values import isoformat
from gpufarm.reporting import money
from gpufarm.reporting.cells import NOTE_CHARS, json_text
from gpufarm.reporting.columns import reclaims_by_reason
from gpufarm.reporting.model import LeaseLine, PoolLine, Report, Row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _money(value: Decimal | None) -> float | None:
    """An amount in cents as a JSON number (null: unpriced)."""
    return None if value is None else float(value)


def cost_json(row: Row) -> dict[str, Any]:
    """A row's money per kind (null with `unpriced` true when no rate priced any of its leases)."""
    out: dict[str, Any] = {kind: _money(money.amount(row, kind)) for kind in money.SHOWN}
    unpriced = row.unpriced_leases > 0 and row.priced_leases == 0
    return out | {"unpriced": unpriced, "incomplete": money.incomplete(row), "unpriced_leases": row.unpriced_leases}


def row_json(row: Row) -> dict[str, Any]:
    """One row as JSON."""
    return {
        "group": json_text(row.key),
        "leases": row.leases,
        "gpu_hours": {
            "held": _round(row.held),
            "busy": _round(row.busy),
            "idle": _round(row.idle),
            "idle_held": _round(row.idle_held),
            "unmeasured": _round(row.unmeasured),
            "reserved": _round(row.reserved),
        },
        "cost": cost_json(row),
        "unmeasured_leases": row.unmeasured_leases,
        "utilisation_percent": _round(row.utilisation),
        "idle_warnings": row.idle_warnings,
        "keeps": row.keeps,
        "exemptions": row.exemptions,
        "squatters": {"episodes": row.squatter_episodes, "stopped": row.squatter_stops},
        "reclaims": {json_text(k): v for k, v in reclaims_by_reason(row).items() if v},
        "wait_hours": {"avg": _round(row.wait_avg), "max": _round(row.wait_max), "allocations": len(row.waits)},
        "quota": None if row.entitled is None else {"entitled_gpus": row.entitled, "held_now_gpus": row.held_now},
        "budgets": [
            {
                "budget": json_text(b.label),
                "period": json_text(b.period),
                "burned": _round(b.burned),
                "gpu_hours": b.gpu_hours,
            }
            for b in row.budgets
        ],
    }


def _lease(line: LeaseLine) -> dict[str, Any]:
    return {
        "ir": f"IR-{line.ir}",
        "team": json_text(line.team),
        "project": json_text(line.project),
        "environment": json_text(line.environment),
        "held": _round(line.held),
        "busy": _round(line.busy),
        "idle": _round(line.idle),
        "unmeasured": _round(line.unmeasured),
        "idle_held": _round(line.idle_held),
        "wasted_cost": _money(line.wasted),
    }


def _pool(pool: PoolLine) -> dict[str, Any]:
    return {
        "environment": json_text(pool.environment),
        "gpu_model": json_text(pool.model),
        "gpus": _round(pool.gpus),
        "gpu_hours": {
            "capacity": _round(pool.capacity),
            "held": _round(pool.held),
            "unallocated": _round(pool.unallocated),
        },
        "unallocated_cost": _money(pool.unallocated_cost),
        "unpriced": not pool.priced,
    }


def report_json(report: Report) -> dict[str, Any]:
    """The whole report as a JSON-safe mapping."""
    period = report.query.period
    return {
        "period": {"start": isoformat(period.start), "end": isoformat(period.end), "label": period.label},
        "by": report.query.by.value,
        "team": None if report.query.team is None else json_text(report.query.team),
        "project": None if report.query.project is None else json_text(report.query.project),
        "generated": isoformat(report.generated),
        "currency": json_text(report.currency),
        "rows": [row_json(r) for r in report.rows],
        "total": row_json(report.total),
        "unmeasured_leases": [_lease(x) for x in report.unmeasured],
        "top_idle_leases": [_lease(x) for x in report.top_idle],
        "notes": [json_text(n, NOTE_CHARS) for n in report.notes],
        "reasons": {json_text(code): n for code, n in sorted(report.reasons.items())},
        "pools": [_pool(p) for p in report.pools],
    }


def render_json(report: Report) -> str:
    """The report as indented JSON text."""
    return json.dumps(report_json(report), indent=2) + "\n"
