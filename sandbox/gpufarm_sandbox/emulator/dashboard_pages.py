"""The local view of the dashboards: `GET /dashboards` and `/dashboards/<id>` render the sandbox's stored dashboards.

Each page is built from the very JSON `gpufarm datadog apply` sent (read back from the dashboards module's store)
and the sandbox's own metrics (gpufarm_sandbox.emulator.dashboard_evaluate runs the widgets' queries through the
sandbox query engine), so a user without a Datadog account sees the farm, and a dashboard change can be previewed
before it is applied to Datadog. Widget types drawn: timeseries and toplist (Plotly charts, SVG), query_value (a
number), query_table (an HTML table), note (text) and group (a titled section); any other type is named as not
drawn. Units come from the metric metadata apply sent.

The charting library is plotly.js, served offline from the `plotly` Python package's own copy at
`/dashboards/_static/plotly.min.js` (no CDN). A gpufarm dashboard answers at its id and at its key
(`/dashboards/project`), and at Datadog's own path `/dashboard/<id>`, which the links of gpufarm's messages open
under GPUFARM_PUBLIC_URL (gpufarm.core.chat.links). Template variables come from the URL's query string
(`?team=nlp&ir=ir-12`, or Datadog's own spellings `?tpl_var_ir=ir-12` and `?tpl_var_ir[0]=ir-12`; `*` for every
value) and the time frame from `span` (15m ... 30d, ending at the sandbox clock's now); anything else in the query
string, or a value that is not a tag value, is a 400 page saying why.
When every chart has drawn, the page sets `data-rendered="true"` and `data-render-ms` on its body.
"""

from __future__ import annotations

import functools
import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.dashboard_evaluate import VALUE_RE, Evaluator, Result, Series
from gpufarm_sandbox.emulator.dashboards import DashboardsModule
from gpufarm_sandbox.emulator.metric_metadata import MetricMetadataModule
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.web import Auth, Route

PLOTLY_PATH = "/dashboards/_static/plotly.min.js"
SPANS = {"15m": 900, "1h": 3600, "4h": 14400, "1d": 86400, "2d": 172800, "1w": 604800, "30d": 2592000}
DEFAULT_SPAN = "1h"
MAX_LEGEND = 12
_MARKER_RE = re.compile(r"\s*\[gpufarm-dashboard:[a-z0-9-]+\]")
_KEY_RE = re.compile(r"\[gpufarm-dashboard:([a-z0-9-]{1,40})\]")
TPL_VAR = "tpl_var_"
_BYTES = ("byte", "kibibyte", "mebibyte", "gibibyte")
_BYTE_SCALE = {"byte": 1, "kibibyte": 1024, "mebibyte": 1024**2, "gibibyte": 1024**3}
# Units that count things: a number of devices reads as the number alone (and a formula over it, GPU-hours, is not
# a count of devices any more).
_COUNTS = frozenset({"device", "process", "error", "row", "event", "sample", "unit", "item", "host", "node", "request"})
# Durations in seconds read in the largest unit the values reach (a wait of hours as hours), as Datadog shows them.
_DURATIONS = (("h", 3600.0), ("min", 60.0))
_SHORT_UNITS = {"percent": "%", "degree celsius": "°C", "watt": "W", "megahertz": "MHz", "second": "s", "joule": "J"}


class PageError(Exception):
    """A page request the module refuses: status and a message shown on the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@functools.cache
def plotly_js() -> bytes:
    """plotly.js as the `plotly` package ships it."""
    return resources.files("plotly").joinpath("package_data/plotly.min.js").read_bytes()


class DashboardPagesModule(BaseModule):
    """HTML pages of the stored dashboards (no API: nothing here is part of Datadog's surface)."""

    name = "dashboard_pages"

    def __init__(
        self,
        context: SandboxContext,
        dashboards: DashboardsModule,
        metrics: MetricsModule,
        metric_metadata: MetricMetadataModule,
    ) -> None:
        super().__init__(context)
        self.dashboards = dashboards
        self.metrics = metrics
        self.metric_metadata = metric_metadata

    def routes(self) -> list[Route]:
        """The index, one page per dashboard, and plotly.js."""
        return [
            Route("/dashboards", ("GET",), self._index, Auth.NONE),
            Route(PLOTLY_PATH, ("GET",), self._plotly, Auth.NONE),
            Route("/dashboards/<dashboard_id>", ("GET",), self._page, Auth.NONE),
            # Datadog's app path: a message's link under GPUFARM_PUBLIC_URL opens the same page.
            Route("/dashboard/<dashboard_id>", ("GET",), self._page, Auth.NONE),
        ]

    def dump(self) -> dict[str, Any]:
        """The pages' addresses."""
        return {"pages": [f"/dashboards/{d['id']}" for d in self.dashboards.live()]}

    # -- handlers -------------------------------------------------------------------------------------

    def _plotly(self, request: Request) -> Response:
        response = Response(plotly_js(), mimetype="application/javascript")
        response.headers["Cache-Control"] = "public, max-age=86400"
        return response

    def _index(self, request: Request) -> Response:
        items = "".join(
            f'<li><a href="/dashboards/{html.escape(d["id"])}">{html.escape(str(d["title"]))}</a></li>'
            for d in sorted(self.dashboards.live(), key=lambda d: str(d["title"]))
        )
        body = f"<h1>Dashboards</h1><ul>{items or '<li>none yet: run gpufarm datadog apply</li>'}</ul>"
        return _html("Dashboards", body)

    def _page(self, request: Request, dashboard_id: str) -> Response:
        live = self.dashboards.live()
        # A gpufarm dashboard also answers at its key (`/dashboards/project`), so a link needs no id.
        found = [d for d in live if d["id"] == dashboard_id] or [d for d in live if _key(d) == dashboard_id]
        if not found:
            return _html("Not found", f"<h1>No dashboard {html.escape(dashboard_id)}</h1>", 404)
        dashboard = found[0]
        try:
            chosen, span = _params(request, dashboard)
        except PageError as exc:
            return _html("Bad request", f"<h1>Bad request</h1><p class='error'>{html.escape(str(exc))}</p>", exc.status)
        end = self.ctx.clock.now()
        evaluator = Evaluator(
            self.metrics.query_series, end - SPANS[span], end, dashboard.get("template_variables") or [], chosen
        )
        page = _Page(evaluator, self._unit)
        widgets = "".join(page.widget(w) for w in dashboard.get("widgets") or [])
        title = str(dashboard["title"])
        description = _MARKER_RE.sub("", str(dashboard.get("description") or ""))
        header = (
            f"<h1>{html.escape(title)}</h1><p class='description'>{html.escape(description)}</p>"
            f"{_controls(dashboard, chosen, span)}"
            f"<p class='frame'>{_iso(end - SPANS[span])} → {_iso(end)} (sandbox clock)</p>"
        )
        figures = json.dumps(page.figures).replace("</", "<\\/")
        scripts = (
            f'<script id="figures" type="application/json">{figures}</script>'
            f'<script src="{PLOTLY_PATH}"></script><script>{_DRAW_JS}</script>'
        )
        return _html(title, header + f"<main>{widgets}</main>" + scripts)

    def _unit(self, metric: str | None) -> str | None:
        if metric is None:
            return None
        meta = self.metric_metadata.metadata(metric)
        unit = meta.get("unit") if meta else None
        return str(unit) if unit else None


def _key(dashboard: Mapping[str, Any]) -> str | None:
    found = _KEY_RE.search(str(dashboard.get("description") or ""))
    return found.group(1) if found else None


def _params(request: Request, dashboard: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    names = [str(v.get("name")) for v in dashboard.get("template_variables") or []]
    chosen: dict[str, str] = {}
    span = DEFAULT_SPAN
    for given in request.args:
        values = request.args.getlist(given)
        # Datadog's own dashboard URLs name template variables `tpl_var_<name>` (`tpl_var_<name>[0]` for the
        # first of several values); every spelling works here, one value per variable.
        key = given.removeprefix(TPL_VAR).removesuffix("[0]") if given.startswith(TPL_VAR) else given
        if len(values) != 1 or key in chosen:
            raise PageError(400, f"{key} is given more than once; give it once")
        value = values[0].strip()
        if key == "span":
            if value not in SPANS:
                raise PageError(400, f"span must be one of {', '.join(SPANS)}")
            span = value
        elif key in names:
            if value != "*" and not VALUE_RE.match(value):
                raise PageError(400, f"{key}={value[:40]!r} is not a tag value (letters, digits, _ . : / -)")
            chosen[key] = value or "*"
        else:
            allowed = ", ".join([*names, "span"])
            raise PageError(400, f"unknown parameter {key[:40]!r}; this dashboard takes {allowed}")
    return chosen, span


def _controls(dashboard: Mapping[str, Any], chosen: Mapping[str, str], span: str) -> str:
    fields = []
    for variable in dashboard.get("template_variables") or []:
        name = str(variable.get("name"))
        current = chosen.get(name, "*")
        values = [str(v) for v in variable.get("available_values") or []]
        if values:
            options = "".join(
                f'<option value="{html.escape(v)}"{" selected" if v == current else ""}>{html.escape(v)}</option>'
                for v in ["*", *values]
            )
            control = f'<select name="{html.escape(name)}">{options}</select>'
        else:
            control = f'<input name="{html.escape(name)}" value="{html.escape(current)}" size="12">'
        fields.append(f"<label>${html.escape(name)} {control}</label>")
    spans = "".join(f'<option value="{s}"{" selected" if s == span else ""}>{s}</option>' for s in SPANS)
    fields.append(f'<label>span <select name="span">{spans}</select></label>')
    return f"<form class='controls' method='get'>{''.join(fields)}<button type='submit'>show</button></form>"


class _Page:
    """Renders widgets into HTML, collecting the Plotly figures the page's script draws."""

    def __init__(self, evaluator: Evaluator, unit: Callable[[str | None], str | None]) -> None:
        self.evaluator = evaluator
        self.unit = unit
        self.figures: dict[str, dict[str, Any]] = {}

    def widget(self, widget: Mapping[str, Any]) -> str:
        definition = widget.get("definition") or {}
        kind = str(definition.get("type"))
        title = html.escape(str(definition.get("title") or ""))
        heading = f"<h3>{title}</h3>" if title else ""
        if kind == "group":
            inner = "".join(self.widget(w) for w in definition.get("widgets") or [])
            return f'<section class="group"><h2>{title}</h2><div class="widgets">{inner}</div></section>'
        if kind == "note":
            return f'<div class="widget note" data-type="note">{_markdown(str(definition.get("content") or ""))}</div>'
        if kind == "iframe":
            return self._iframe(str(definition.get("url") or ""), heading)
        if kind not in ("timeseries", "toplist", "query_value", "query_table"):
            shown = html.escape(kind)
            return (
                f'<div class="widget" data-type="{shown}">{heading}<p>{shown} widgets are not drawn locally</p></div>'
            )
        body = self._query_widget(kind, definition)
        return f'<div class="widget {kind}" data-type="{kind}">{heading}{body}</div>'

    def _query_widget(self, kind: str, definition: Mapping[str, Any]) -> str:
        """The body of a widget drawn from its queries: a chart, a value or a table (or why the query failed)."""
        result = self.evaluator.widget(definition)
        if result.error is not None:
            return f'<p class="widget-error">query failed: {html.escape(result.error)}</p>'
        if kind == "timeseries":
            return self._chart(self._timeseries_figure(result, definition))
        if kind == "toplist":
            return self._chart(self._toplist_figure(result))
        if kind == "query_value":
            return self._value(result, int(definition.get("precision") or 0))
        return self._table(result)

    def _iframe(self, url: str, heading: str) -> str:
        """The embedded page, as Datadog's iframe widget shows it; only an http(s) URL is embedded."""
        if urlsplit(url).scheme not in ("http", "https"):
            return f'<div class="widget" data-type="iframe">{heading}<p class="widget-error">no http(s) URL</p></div>'
        src = html.escape(url, quote=True)
        return (
            f'<div class="widget iframe" data-type="iframe">{heading}'
            f'<iframe src="{src}" title="embedded page" loading="lazy" referrerpolicy="no-referrer" '
            f'style="width:100%;height:420px;border:1px solid #ddd"></iframe></div>'
        )

    def _chart(self, figure: dict[str, Any]) -> str:
        key = f"chart-{len(self.figures) + 1}"
        self.figures[key] = figure
        return f'<div class="chart" id="{key}"></div>'

    def _timeseries_figure(self, result: Result, definition: Mapping[str, Any]) -> dict[str, Any]:
        display = "line"
        requests = definition.get("requests") or []
        if requests:
            display = str(requests[0].get("display_type") or "line")
        unit = next((self.unit(s.metric) for s in result.series if s.metric), None)
        traces = [_trace(s, unit, display) for s in result.series]
        values = [v for s in result.series for _, v in s.points]
        _, label = _scale(unit, values)
        layout = _layout(label)
        # Past a dozen lines a legend hides the chart; hovering names each line.
        layout["showlegend"] = 0 < len(traces) <= MAX_LEGEND
        if not traces:
            layout["annotations"] = [{"text": "no data", "showarrow": False, "xref": "paper", "yref": "paper"}]
        if display == "bars":
            layout["barmode"] = "stack"
        return {"data": traces, "layout": layout}

    def _toplist_figure(self, result: Result) -> dict[str, Any]:
        unit = self.unit(result.columns[0].metric) if result.columns else None
        rows = [(", ".join(g) or "all", v[0]) for g, v in result.rows if v and v[0] is not None]
        scale, label = _scale(unit, [v for _, v in rows if v is not None])
        rows.reverse()  # Plotly draws the first bar at the bottom
        layout = _layout(label, horizontal=True)
        if not rows:
            layout["annotations"] = [{"text": "no data", "showarrow": False, "xref": "paper", "yref": "paper"}]
        trace = {
            "type": "bar",
            "orientation": "h",
            "y": [g for g, _ in rows],
            "x": [(v or 0.0) / scale for _, v in rows],
            "name": result.columns[0].label if result.columns else "",
        }
        return {"data": [trace], "layout": layout}

    def _value(self, result: Result, precision: int) -> str:
        value = result.rows[0][1][0] if result.rows and result.rows[0][1] else None
        unit = self.unit(result.columns[0].metric) if result.columns else None
        return f'<p class="value">{html.escape(_format(value, unit, precision))}</p>'

    def _table(self, result: Result) -> str:
        head = "".join(f"<th>{html.escape(k)}</th>" for k in result.group_keys)
        head += "".join(f"<th>{html.escape(c.label)}</th>" for c in result.columns)
        units = [self.unit(c.metric) for c in result.columns]
        body = []
        for group, values in result.rows:
            cells = "".join(f"<td>{html.escape(_group_value(group, k))}</td>" for k in result.group_keys)
            cells += "".join(
                f'<td class="num">{html.escape(_format(v, u, 1))}</td>' for v, u in zip(values, units, strict=True)
            )
            body.append(f"<tr>{cells}</tr>")
        rows = "".join(body) or f'<tr><td colspan="{len(result.group_keys) + len(result.columns)}">no data</td></tr>'
        table = f'<table class="query-table"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
        return f'<div class="table-wrap">{table}</div>'


def _group_value(group: Sequence[str], key: str) -> str:
    prefix = f"{key}:"
    return ", ".join(t[len(prefix) :] for t in group if t.startswith(prefix))


def _trace(series: Series, unit: str | None, display: str) -> dict[str, Any]:
    """One series as a plotly trace: a line, a stacked area or bars, scaled to its unit."""
    scale, _ = _scale(unit, [v for _, v in series.points])
    trace: dict[str, Any] = {
        "name": series.label,
        "x": [_iso(t) for t, _ in series.points],
        "y": [v / scale for _, v in series.points],
        "type": "bar" if display == "bars" else "scatter",
    }
    if display != "bars":
        trace["mode"] = "lines"
        if display == "area":
            trace["stackgroup"] = "one"
    return trace


def _scale(unit: str | None, values: Sequence[float]) -> tuple[float, str]:
    """A divisor and axis label that keep byte values readable (GiB rather than 80000000000 B)."""
    if unit in _COUNTS:
        return 1.0, ""
    if unit == "second":
        top = max((abs(v) for v in values), default=0.0)
        return next(((size, name) for name, size in _DURATIONS if top >= 2 * size), (1.0, "s"))
    if unit in _BYTES:
        base = _BYTE_SCALE[str(unit)]
        top = max((abs(v) for v in values), default=0.0) * base
        for name, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if top >= size:
                return size / base, name
        return 1.0, "B"
    return 1.0, _SHORT_UNITS.get(str(unit), str(unit)) if unit else ""


def _format(value: float | None, unit: str | None, precision: int) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    scale, label = _scale(unit, [value])
    shown = value / scale
    # Whole numbers (GPU and device counts) read best without decimals; others keep the widget's precision.
    text = f"{int(shown):,}" if shown == int(shown) else f"{shown:,.{max(precision, 1)}f}"
    return f"{text} {label}".strip() if label and label != "%" else f"{text}{label}"


def _layout(unit_label: str, *, horizontal: bool = False) -> dict[str, Any]:
    axis = {"title": {"text": unit_label}} if unit_label else {}
    layout: dict[str, Any] = {
        "height": 260,
        "margin": {"l": 60, "r": 10, "t": 10, "b": 40},
        "showlegend": not horizontal,
        "legend": {"orientation": "h", "font": {"size": 10}},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
    }
    if horizontal:
        layout["xaxis"] = axis
        layout["yaxis"] = {"automargin": True}
    else:
        layout["yaxis"] = axis
    return layout


def _markdown(text: str) -> str:
    """The small Markdown subset gpufarm's notes use: paragraphs, **bold** and `code`."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        escaped = html.escape(paragraph)
        escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
        escaped = re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)
        out.append(f"<p>{escaped}</p>")
    return "".join(out)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _html(title: str, body: str, status: int = 200) -> Response:
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>"
    )
    return Response(page, status=status, mimetype="text/html")


_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;background:#f4f5f7;color:#1d2330}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:8px 0} h3{font-size:13px;margin:0 0 6px;color:#444}
.description,.frame{color:#555;font-size:12px;margin:2px 0}
.controls{margin:8px 0;display:flex;gap:12px;flex-wrap:wrap;font-size:12px}
main,.widgets{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}
.widget{background:#fff;border:1px solid #dde;border-radius:4px;padding:8px;flex:1 1 420px;min-width:320px}
.widget.query_value{flex:0 1 180px;min-width:150px} .value{font-size:30px;margin:8px 0;font-weight:600}
.group{flex:1 1 100%;background:#eceef3;border-radius:4px;padding:6px 8px}
.widget.query_table{flex:1 1 100%} .table-wrap{max-height:360px;overflow:auto}
.query-table{border-collapse:collapse;font-size:12px;width:100%;white-space:nowrap}
.query-table th,.query-table td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left}
.query-table td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{font-size:13px;flex:1 1 100%} .widget-error,.error{color:#b00020}
code{background:#f0f0f4;padding:0 3px;border-radius:3px}
"""

# Draws every figure, then marks the body rendered with the time it took since navigation started.
_DRAW_JS = """
(function () {
  var figures = JSON.parse(document.getElementById('figures').textContent);
  var config = {displaylogo: false, displayModeBar: false, responsive: true};
  var drawn = Object.keys(figures).map(function (id) {
    return Plotly.newPlot(id, figures[id].data, figures[id].layout, config);
  });
  Promise.all(drawn).then(function () {
    document.body.dataset.renderMs = String(Math.round(performance.now()));
    document.body.dataset.charts = String(drawn.length);
    document.body.dataset.rendered = 'true';
  });
})();
"""
