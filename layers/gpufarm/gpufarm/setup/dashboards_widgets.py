"""Builders of the Datadog v1 dashboard widgets gpufarm's dashboards use (pure: JSON-shaped dicts, no calls).

Every data widget uses formulas and functions requests (`queries` of `data_source: metrics` plus `formulas`), the
form both Datadog and the sandbox's local dashboard pages evaluate the same way. Widget types: timeseries,
query_value, toplist, query_table, note and group; datadog-api-client's models take every one (gpufarm.setup.
dashboards checks it before anything is sent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def group(title: str, widgets: Sequence[Widget]) -> Widget:
    """Widgets shown together under a title."""
    return {
        "definition": {
            "type": "group",
            "title": title,
            "layout_type": "ordered",
            "show_title": True,
            "widgets": list(widgets),
        }
    }


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
