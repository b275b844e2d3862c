"""Builders of the Datadog v1 dashboard widgets gpufarm's dashboards use (pure: JSON-shaped dicts, no calls).

Every data widget uses formulas and functions requests (`queries` of `data_source: metrics` plus `formulas`), the
form both Datadog and the sandbox's local dashboard pages evaluate the same way. Widget types: timeseries,
query_value, toplist, query_table, note and group; datadog-api-client's models take every one (gpufarm.setup.
dashboards checks it before anything is sent).

The dashboards describe their data widgets as `Chart` specs (a title, a scope, a grouping and one `Series` per
metric query); `chart` is the one builder that turns a spec into its widget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Widget = dict[str, Any]


@dataclass(frozen=True)
class Query:
    """One named metric query of a request; `aggregator` reduces it to a number in scalar requests."""

    name: str
    query: str
    aggregator: str = "last"


@dataclass(frozen=True)
class Formula:
    """One formula over a request's queries, shown under `alias`."""

    formula: str
    alias: str


def scope(*terms: str) -> str:
    """A query scope from its terms (tag filters and `$template_variable`s), `*` when there are none."""
    kept = [t for t in terms if t]
    return ",".join(kept) if kept else "*"


def _queries(queries: Sequence[Query], *, scalar: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for q in queries:
        item: dict[str, Any] = {"data_source": "metrics", "name": q.name, "query": q.query}
        if scalar:
            item["aggregator"] = q.aggregator
        out.append(item)
    return out


def _formulas(formulas: Sequence[Formula], limit: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"formula": f.formula, "alias": f.alias} for f in formulas]
    if limit is not None and out:
        out[0]["limit"] = {"count": limit, "order": "desc"}
    return out


@dataclass(frozen=True)
class Series:
    """One metric query of a chart and the formula that shows it.

    `metric` is `<space aggregation>:<metric name>`; the chart's scope (plus `filter`, this query's own scope
    terms) and grouping complete the query. A series without an `alias` has no formula of its own: it shows only
    through the chart's `formulas` (a sum, a ratio, or a column placed after others). `aggregator` reduces it to a
    number in scalar widgets.
    """

    name: str
    metric: str
    alias: str | None = None
    filter: str = ""
    aggregator: str = "last"


ChartKind = Literal["table", "timeseries", "toplist", "query_value"]


@dataclass(frozen=True)
class Chart:
    """A data widget as a spec: its kind, title and series, the scope and grouping every series shares.

    `by` is what follows each query's scope: its grouping and any functions (`.rollup(...)`, `.as_count()`).
    `formulas` come after the series' own, in order; a query value shows its first formula (or its first series).
    """

    kind: ChartKind
    title: str
    series: Sequence[Series]
    where: str = ""
    by: str = ""
    formulas: Sequence[Formula] = ()
    display: str = "line"
    precision: int = 0


def chart(spec: Chart) -> Widget:
    """The widget of one chart spec."""
    queries = [
        Query(s.name, f"{s.metric}{{{scope(spec.where, s.filter)}}}{spec.by}", s.aggregator) for s in spec.series
    ]
    formulas = [Formula(s.name, s.alias) for s in spec.series if s.alias is not None] + list(spec.formulas)
    if spec.kind == "table":
        return table(spec.title, queries, formulas)
    if spec.kind == "timeseries":
        return timeseries(spec.title, queries, formulas, display=spec.display)
    if spec.kind == "toplist":
        [only] = formulas
        return toplist(spec.title, queries[0], only.alias)
    return query_value(
        spec.title, queries, formulas[0].formula if formulas else queries[0].name, precision=spec.precision
    )


def timeseries(title: str, queries: Sequence[Query], formulas: Sequence[Formula], *, display: str = "line") -> Widget:
    """A line (or area / bars) chart of one request's formulas over the dashboard's time frame."""
    return {
        "definition": {
            "type": "timeseries",
            "title": title,
            "show_legend": True,
            "legend_layout": "auto",
            "requests": [
                {
                    "response_format": "timeseries",
                    "queries": _queries(queries, scalar=False),
                    "formulas": _formulas(formulas),
                    "display_type": display,
                }
            ],
        }
    }


def query_value(title: str, queries: Sequence[Query], formula: str = "a", *, precision: int = 0) -> Widget:
    """One number: a formula over queries each reduced by its aggregator."""
    return {
        "definition": {
            "type": "query_value",
            "title": title,
            "precision": precision,
            "autoscale": True,
            "requests": [
                {
                    "response_format": "scalar",
                    "queries": _queries(queries, scalar=True),
                    "formulas": [{"formula": formula}],
                }
            ],
        }
    }


def toplist(title: str, query: Query, alias: str, *, limit: int = 10) -> Widget:
    """The groups of one grouped query, largest first."""
    return {
        "definition": {
            "type": "toplist",
            "title": title,
            "requests": [
                {
                    "response_format": "scalar",
                    "queries": _queries([query], scalar=True),
                    "formulas": _formulas([Formula(query.name, alias)], limit),
                }
            ],
        }
    }


def table(title: str, queries: Sequence[Query], formulas: Sequence[Formula], *, limit: int = 50) -> Widget:
    """A table: one row per group the (equally grouped) queries share, one column per formula."""
    return {
        "definition": {
            "type": "query_table",
            "title": title,
            "has_search_bar": "auto",
            "requests": [
                {
                    "response_format": "scalar",
                    "queries": _queries(queries, scalar=True),
                    "formulas": _formulas(formulas, limit),
                }
            ],
        }
    }


def iframe(url: str) -> Widget:
    """An embedded page (the profile pages function's signed link)."""
    return {"definition": {"type": "iframe", "url": url}}


def note(content: str) -> Widget:
    """Markdown text."""
    return {
        "definition": {
            "type": "note",
            "content": content,
            "background_color": "white",
            "font_size": "14",
            "text_align": "left",
            "show_tick": False,
            "tick_pos": "50%",
            "tick_edge": "left",
            "has_padding": True,
        }
    }


def group(title: str, widgets: Sequence[Widget | Chart]) -> Widget:
    """Widgets (or chart specs, built here) shown together under a title."""
    return {
        "definition": {
            "type": "group",
            "title": title,
            "layout_type": "ordered",
            "show_title": True,
            "widgets": built(widgets),
        }
    }


def built(widgets: Sequence[Widget | Chart]) -> list[Widget]:
    """The widgets, each chart spec among them built by `chart`."""
    return [chart(w) if isinstance(w, Chart) else w for w in widgets]


def template_variable(name: str, prefix: str, values: Sequence[str] = ()) -> dict[str, Any]:
    """A dashboard template variable (`$name` in queries) over a tag key, every value by default."""
    variable: dict[str, Any] = {"name": name, "prefix": prefix, "available_values": list(values), "defaults": ["*"]}
    return variable


def walk(widgets: Sequence[Widget]) -> list[Widget]:
    """Every widget, those inside groups included, in order."""
    out: list[Widget] = []
    for widget in widgets:
        out.append(widget)
        inner = widget.get("definition", {}).get("widgets")
        if isinstance(inner, list):
            out += walk(inner)
    return out
