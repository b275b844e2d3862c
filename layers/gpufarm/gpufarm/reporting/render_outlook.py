"""`gpufarm report --outlook` in each format: a terminal table, CSV, JSON, and a plain self-contained HTML page.

Two parts: unmet demand per pool and model over the period (waiting GPU-hours, requests waited, refused and
withdrawn by reason code, the GPUs those asked), and free capacity per pool and model for each of the four weeks
ahead (capacity, the most held by leases, the most reserved, the fewest free). The CSV is one table whose `section`
column says which part a line is of (`demand` or `capacity`); each part leaves the other's columns empty. Every
text passes through its format's helper in gpufarm.reporting.cells (pool and model names come from incidents, which
can be edited by hand).
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpufarm.core.kernel.field_values import isoformat
from gpufarm.core.outlook.capacity import PoolOutlook, Slot
from gpufarm.core.outlook.demand import Demand
from gpufarm.reporting.cells import NOTE_CHARS, csv_cell, html_text, json_text, table_cell
from gpufarm.reporting.outlook import OutlookReport

CSV_COLUMNS = (
    "section",
    "environment",
    "gpu_model",
    "waiting_gpu_hours",
    "requests_waited",
    "requests_refused",
    "requests_withdrawn",
    "unmet_gpus",
    "reasons",
    "week",
    "week_start",
    "week_end",
    "capacity_gpus",
    "leased_gpus",
    "reserved_gpus",
    "free_gpus",
)


def _codes(counts: Counter[str]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(counts.items())) or "-"


def _why(d: Demand) -> str:
    """Every code counted for the pool: refusals, withdrawals and why the waits were."""
    return _codes(d.refused + d.withdrawn + d.waited_why)


def _figures(slot: Slot) -> tuple[str, ...]:
    return tuple(map(str, (slot.capacity, slot.leased, slot.reserved, slot.free)))


def render_outlook(report: OutlookReport, fmt: str) -> str:
    """The outlook in one of table, csv, json, html."""
    if fmt == "csv":
        return _csv(report)
    if fmt == "json":
        return json.dumps(outlook_json(report), indent=2) + "\n"
    if fmt == "html":
        return _html(report)
    return _table(report)


def _align(rows: Sequence[tuple[str, ...]], left: int) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [fmt(rows[0]), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows[1:])]


def _table(report: OutlookReport) -> str:
    out = [f"gpufarm outlook: unmet demand {table_cell(report.period.label)}", ""]
    if report.demand:
        head = ("pool", "model", "waiting GPU-h", "waited", "refused", "withdrawn", "GPUs unmet")
        table = [head] + [
            (
                table_cell(d.environment),
                table_cell(d.gpu_model),
                f"{d.waiting_gpu_hours:,.1f}",
                str(d.waited),
                str(sum(d.refused.values())),
                str(sum(d.withdrawn.values())),
                str(d.unmet_gpus),
            )
            for d in report.demand
        ]
        out += _align(table, 2)
        out += ["", "why:"] + [
            f"  {table_cell(d.environment)} {table_cell(d.gpu_model)}: {table_cell(_why(d), NOTE_CHARS)}"
            for d in report.demand
        ]
    else:
        out.append("no unmet demand: no request waited for hosts, was refused or withdrawn")
    out += ["", "free capacity ahead (each week's busiest moment; free = capacity - leases - reserved):", ""]
    for pool in report.pools:
        rows: list[tuple[str, ...]] = [("week", "from", "to", "capacity", "leases", "reserved", "free")]
        rows += [
            (f"{i:02d}", f"{s.start:%Y-%m-%d}", f"{s.end:%Y-%m-%d}", *_figures(s)) for i, s in enumerate(pool.slots)
        ]
        out += [f"{table_cell(pool.environment)} {table_cell(pool.gpu_model)}:", *_align(rows, 3), ""]
    out += [f"note: {table_cell(n, NOTE_CHARS)}" for n in report.notes]
    return "\n".join(out) + "\n"


def _csv(report: OutlookReport) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    blank_capacity = [""] * 7
    for d in report.demand:
        cells = [
            "demand",
            d.environment,
            d.gpu_model,
            f"{d.waiting_gpu_hours:.3f}",
            str(d.waited),
            str(sum(d.refused.values())),
            str(sum(d.withdrawn.values())),
            str(d.unmet_gpus),
        ]
        writer.writerow([*(csv_cell(c) for c in cells), csv_cell(_why(d), NOTE_CHARS), *blank_capacity])
    for pool in report.pools:
        for i, s in enumerate(pool.slots):
            head = ["capacity", pool.environment, pool.gpu_model, *[""] * 6]
            tail = [f"{i:02d}", isoformat(s.start), isoformat(s.end), *_figures(s)]
            writer.writerow([csv_cell(c) for c in [*head, *tail]])
    return buffer.getvalue()


def _pool_json(pool: PoolOutlook) -> dict[str, Any]:
    return {
        "environment": json_text(pool.environment),
        "gpu_model": json_text(pool.gpu_model),
        "capacity_gpus": pool.capacity,
        "weeks": [
            {
                "week": i,
                "start": isoformat(s.start),
                "end": isoformat(s.end),
                "leased_gpus": s.leased,
                "reserved_gpus": s.reserved,
                "free_gpus": s.free,
            }
            for i, s in enumerate(pool.slots)
        ],
    }


def outlook_json(report: OutlookReport) -> dict[str, Any]:
    """The outlook as a JSON-safe mapping."""
    period = report.period
    return {
        "period": {"start": isoformat(period.start), "end": isoformat(period.end), "label": period.label},
        "generated": isoformat(report.generated),
        "unmet_demand": [
            {
                "environment": json_text(d.environment),
                "gpu_model": json_text(d.gpu_model),
                "waiting_gpu_hours": round(d.waiting_gpu_hours, 3),
                "requests_waited": d.waited,
                "waited_because": dict(sorted(d.waited_why.items())),
                "refused": dict(sorted(d.refused.items())),
                "withdrawn": dict(sorted(d.withdrawn.items())),
                "unmet_gpus": d.unmet_gpus,
            }
            for d in report.demand
        ],
        "capacity": [_pool_json(p) for p in report.pools],
        "notes": [json_text(n, NOTE_CHARS) for n in report.notes],
    }


def _html_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cells = "".join(f"<th>{html_text(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _html(report: OutlookReport) -> str:
    demand = _html_table(
        ("pool", "model", "waiting GPU-hours", "waited", "refused", "withdrawn", "GPUs unmet", "why"),
        [
            (
                d.environment,
                d.gpu_model,
                f"{d.waiting_gpu_hours:,.1f}",
                str(d.waited),
                str(sum(d.refused.values())),
                str(sum(d.withdrawn.values())),
                str(d.unmet_gpus),
                _why(d),
            )
            for d in report.demand
        ],
    )
    capacity = _html_table(
        ("pool", "model", "week", "from", "to", "capacity", "leases", "reserved", "free"),
        [
            (p.environment, p.gpu_model, f"{i:02d}", f"{s.start:%Y-%m-%d}", f"{s.end:%Y-%m-%d}", *_figures(s))
            for p in report.pools
            for i, s in enumerate(p.slots)
        ],
    )
    notes = "".join(f"<li>{html_text(n, NOTE_CHARS)}</li>" for n in report.notes)
    title = html_text(f"gpufarm outlook: {report.period.label}")
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px}"
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{style}</style>'
        f"</head><body><h1>{title}</h1><h2>Unmet demand</h2>{demand}<h2>Free capacity, four weeks ahead</h2>"
        f"{capacity}<ul>{notes}</ul></body></html>\n"
    )
