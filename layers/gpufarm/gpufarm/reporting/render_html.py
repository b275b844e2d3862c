"""A report as one self-contained HTML page: the table and its charts, readable offline.

The charts are drawn by plotly.js, inlined from the `plotly` package's own copy (the `report` extra of the
gpufarm distribution; no CDN, so the file opens on a laptop without a network, as the local dashboards do): usage
over time per team (busy GPUs per team stacked, and the GPUs held, from the ledger gauges), GPU-hours held vs busy
vs idle vs unmeasured per group, and the top idle leases. Every text the page shows passes through
gpufarm.reporting.cells.html_text and every chart label through cells.chart_label (escaped and bounded: a
hand-edited incident field is data, never markup); the figures travel as JSON in a `<script type="application/json">`
block with `<`, `>` and `&` written as `\u003c`, `\u003e` and `\u0026`, so no text inside it can close the block
or open a comment. The page's only scripts and styles are the constants below and plotly.js. When every chart has
drawn, the page sets `data-rendered="true"` on its body (what the browser test and the screenshots wait for).
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from gpufarm.config import ConfigurationError
from gpufarm.core.kernel.display import MAX_SHOWN
from gpufarm.core.kernel.field_values import isoformat
from gpufarm.reporting.cells import NOTE_CHARS, chart_label, html_text
from gpufarm.reporting.columns import shown
from gpufarm.reporting.model import LeaseLine, Report, Row
from gpufarm.reporting.usage import HELD_METRIC

MAX_LEGEND = 12
# Groups the held-vs-busy chart draws (the largest by held GPU-hours); the table lists every one.
MAX_CHART_GROUPS = 25
CHART_TITLES = (
    "Usage over time per team",
    "GPU-hours held vs busy vs idle vs unmeasured",
    "Top idle leases",
)
_COLOURS = {"busy": "#2e7d32", "idle": "#f9a825", "unmeasured": "#9e9e9e"}


@functools.cache
def plotly_js() -> str:
    """plotly.js as the `plotly` package ships it; ConfigurationError naming the extra when it is missing."""
    try:
        return resources.files("plotly").joinpath("package_data/plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        raise ConfigurationError(
            "--format html needs plotly (pip install 'gpufarm[report]'); table, csv and json do not"
        ) from None


def _iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "height": 320,
        "margin": {"l": 70, "r": 10, "t": 10, "b": 60},
        "legend": {"orientation": "h", "font": {"size": 10}},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
    }
    return layout | extra


def _no_data(layout: dict[str, Any], text: str) -> dict[str, Any]:
    layout["annotations"] = [{"text": text, "showarrow": False, "xref": "paper", "yref": "paper"}]
    return layout


def usage_figure(report: Report) -> dict[str, Any]:
    """Busy GPUs per team stacked over the period, and the GPUs held by all of them as one dotted line."""
    traces: list[dict[str, Any]] = []
    held: dict[int, float] = {}
    for series in sorted(report.usage, key=lambda s: s.team):
        if series.metric == HELD_METRIC:
            for t, v in series.points:
                held[t] = held.get(t, 0.0) + v
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "stackgroup": "busy",
                "name": f"{chart_label(series.team)} busy",
                "x": [_iso(t) for t, _ in series.points],
                "y": [v for _, v in series.points],
                "line": {"width": 0.5},
            }
        )
    if held:
        times = sorted(held)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "held (all teams)",
                "x": [_iso(t) for t in times],
                "y": [held[t] for t in times],
                "line": {"dash": "dot", "width": 2, "color": "#1d2330"},
            }
        )
    layout = _layout(yaxis={"title": {"text": "GPUs"}, "rangemode": "tozero"})
    # Past a dozen lines a legend hides the chart; hovering names each one.
    layout["showlegend"] = 0 < len(traces) <= MAX_LEGEND
    if not traces:
        _no_data(layout, "no ledger gauges in this period")
    return {"data": traces, "layout": layout}


def hours_figure(report: Report) -> dict[str, Any]:
    """Stacked bars per group: busy, idle and unmeasured GPU-hours (together the held hours)."""
    rows = report.rows[:MAX_CHART_GROUPS]
    keys = [chart_label(r.key) for r in rows]
    traces = [
        {
            "type": "bar",
            "name": part,
            "x": keys,
            "y": [round(getattr(r, part), 3) for r in rows],
            "marker": {"color": _COLOURS[part]},
        }
        for part in ("busy", "idle", "unmeasured")
    ]
    layout = _layout(barmode="stack", yaxis={"title": {"text": "GPU-hours"}})
    if not any(r.held for r in rows):
        _no_data(layout, "no GPU-hours held in this period")
    return {"data": traces, "layout": layout}


def idle_figure(report: Report) -> dict[str, Any]:
    """Horizontal bars: the leases with the most idle GPU-hours, the largest on top."""
    lines = list(reversed(report.top_idle))
    trace = {
        "type": "bar",
        "orientation": "h",
        "name": "idle GPU-hours",
        "y": [f"IR-{x.ir} {chart_label(x.team)}/{chart_label(x.project)}" for x in lines],
        "x": [round(x.idle, 3) for x in lines],
        "marker": {"color": _COLOURS["idle"]},
    }
    layout = _layout(
        xaxis={"title": {"text": "idle GPU-hours"}},
        yaxis={"automargin": True, "dtick": 1},
        showlegend=False,
        height=max(320, 80 + 22 * len(lines)),
    )
    if not lines:
        _no_data(layout, "no idle GPU-hours in this period")
    return {"data": [trace], "layout": layout}


def script_json(value: Any) -> str:
    """JSON to inline in a `<script>` block: no `<`, `>` or `&` appears raw, so no text can end the block."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _cell(text: str, numeric: bool = False, limit: int = MAX_SHOWN) -> str:
    shown = html_text(text, limit)
    return f'<td class="num">{shown}</td>' if numeric else f"<td>{shown}</td>"


def _row_html(row: Row, total: bool = False) -> str:
    wait = "-" if row.wait_avg is None else f"{row.wait_avg:.1f} / {row.wait_max or 0:.1f}"
    numbers = [*shown(row, 1), wait]
    cells = _cell(row.key) + "".join(_cell(n, True) for n in numbers)
    cells += _cell(row.reclaims_text(), limit=NOTE_CHARS) + _cell(row.quota_text())
    cells += _cell(row.budgets_text(), limit=NOTE_CHARS)
    return f'<tr class="total">{cells}</tr>' if total else f"<tr>{cells}</tr>"


_HOURS = ("held", "busy", "idle", "idle-held", "unmeasured")


def _headers(currency: str) -> tuple[str, ...]:
    figures = [name for kind in _HOURS for name in (f"{kind} GPU-h", f"{kind} {currency or 'cost'}")]
    return ("group", "leases", *figures, *_TAIL)


_TAIL = (
    "util %",
    "idle warnings",
    "keeps",
    "exemptions",
    "wait avg / max h",
    "reclaims",
    "quota held now",
    "budgets",
)


def _table(report: Report) -> str:
    head = "".join(f"<th>{html_text(h)}</th>" for h in _headers(report.currency))
    body = "".join(_row_html(r) for r in report.rows) + _row_html(report.total, total=True)
    return f'<table class="report"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _lease_list(title: str, lines: list[LeaseLine], part: str) -> str:
    if not lines:
        return ""
    items = "".join(
        f"<li>IR-{x.ir} {html_text(x.team)}/{html_text(x.project)} ({html_text(x.environment)}): "
        f"{getattr(x, part):,.1f} of {x.held:,.1f} GPU-hours</li>"
        for x in lines
    )
    return f"<section><h2>{html_text(title)}</h2><ul>{items}</ul></section>"


def _pools(report: Report) -> str:
    """Per pool and model: capacity, held, and the unallocated rest with its cost."""
    if not report.pools:
        return ""
    head = "".join(
        f"<th>{html_text(h)}</th>"
        for h in ("pool", "model", "GPUs", "capacity GPU-h", "held GPU-h", "unallocated GPU-h", report.currency)
    )

    def figure(value: float | None) -> str:
        return "not read" if value is None else f"{value:,.1f}"

    body = "".join(
        "<tr>"
        + _cell(p.environment)
        + _cell(p.model)
        + "".join(_cell(figure(v), True) for v in (p.gpus, p.capacity, p.held, p.unallocated))
        + _cell(
            "unpriced" if not p.priced else "-" if p.unallocated_cost is None else f"{p.unallocated_cost:,.2f}", True
        )
        + "</tr>"
        for p in report.pools
    )
    table = f'<table class="report"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    return f"<section><h2>Unallocated capacity</h2><div class='table-wrap'>{table}</div></section>"


def render_html(report: Report) -> str:
    """The whole page (a few MB: plotly.js is inside it)."""
    figures = dict(
        zip(("usage", "hours", "idle"), (usage_figure(report), hours_figure(report), idle_figure(report)), strict=True)
    )
    charts = "".join(
        f'<div class="widget"><h3>{html_text(title)}</h3><div class="chart" id="chart-{html_text(key)}"></div></div>'
        for key, title in zip(figures, CHART_TITLES, strict=True)
    )
    notes = "".join(f"<li>{html_text(n, NOTE_CHARS)}</li>" for n in report.notes)
    period = report.query.period
    title = html_text(f"gpufarm report: {report.query.describe()}", NOTE_CHARS)
    body = (
        f"<h1>{title}</h1>"
        f"<p class='frame'>{isoformat(period.start)} → {isoformat(period.end)}; generated {isoformat(report.generated)}"
        " from the incidents' accrued GPU-hours and history (unmeasured hours are never counted as idle)</p>"
        f"<main>{charts}</main><section><h2>Per {html_text(report.query.by.value)}</h2>"
        f"<div class='table-wrap'>{_table(report)}</div></section>"
        f"<section><h2>Notes</h2><ul>{notes}</ul></section>"
        + _lease_list("Unmeasured GPU-hours", report.unmeasured, "unmeasured")
        + _lease_list("Top idle leases", report.top_idle, "idle")
        + _pools(report)
    )
    data = script_json(figures)
    scripts = (
        f'<script id="figures" type="application/json">{data}</script>'
        f"<script>{plotly_js()}</script><script>{_DRAW_JS}</script>"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>{title}</title><style>{_CSS}</style></head><body>{body}{scripts}</body></html>"
    )


_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#f4f5f7;color:#1d2330}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:14px 0 6px} h3{font-size:13px;margin:0 0 6px;color:#444}
.frame{color:#555;font-size:12px;margin:2px 0 10px}
main{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}
.widget{background:#fff;border:1px solid #dde;border-radius:4px;padding:8px;flex:1 1 560px;min-width:360px}
.table-wrap{overflow:auto;background:#fff;border:1px solid #dde;border-radius:4px}
table.report{border-collapse:collapse;font-size:12px;width:100%;white-space:nowrap}
table.report th,table.report td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left}
table.report td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600;border-top:2px solid #ccd}
section ul{font-size:13px;margin:4px 0}
"""

# Draws every figure, then marks the body rendered with the time it took since navigation started.
_DRAW_JS = """
(function () {
  var figures = JSON.parse(document.getElementById('figures').textContent);
  var config = {displaylogo: false, displayModeBar: false, responsive: true};
  var drawn = Object.keys(figures).map(function (key) {
    return Plotly.newPlot('chart-' + key, figures[key].data, figures[key].layout, config);
  });
  Promise.all(drawn).then(function () {
    document.body.dataset.renderMs = String(Math.round(performance.now()));
    document.body.dataset.charts = String(drawn.length);
    document.body.dataset.rendered = 'true';
  });
})();
"""
