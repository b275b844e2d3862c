"""Evaluating a stored dashboard's widgets on the sandbox's own metrics, for the local dashboard pages.

Pure apart from the one function it is handed to run a metric query (the metrics module's `query_series`): template
variables are substituted from the page's URL, each request's queries run through the sandbox query engine
(gpufarm_sandbox.emulator.query) and its formulas are applied as the v2 timeseries and scalar endpoints apply them.
The results are plain data (series of points, rows of numbers) that gpufarm_sandbox.emulator.dashboard_pages draws.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufarm_sandbox.emulator.query import (
    GroupSeries,
    MetricQuery,
    QueryError,
    parse_query,
    pick_interval,
    reduce_points,
)
from gpufarm_sandbox.emulator.query_formulas import formula_scalars, formula_series, parse_formula

RunQuery = Callable[[str, float, float, float | None], list[GroupSeries]]

# A template variable's value from the URL: a tag value, or `*` (every value).
VALUE_RE = re.compile(r"^[A-Za-z0-9_.:/\-]{1,100}$")
_VARIABLE_RE = re.compile(r"\$([A-Za-z0-9_]+)")
MAX_ROWS = 200
# Chart buckets are a minute at least: the node agent sends a point a minute (its default flush), and finer buckets
# would draw the moments between different agents' points as dips of a sum.
MIN_STEP_S = 60


@dataclass(frozen=True)
class Series:
    """One drawn line: its label, the metric whose unit it keeps (None for a computed formula) and its points."""

    label: str
    metric: str | None
    points: list[tuple[float, float]]


@dataclass(frozen=True)
class Column:
    """One formula's column of a scalar request."""

    label: str
    metric: str | None


@dataclass
class Result:
    """What one widget shows: series (timeseries), or group keys, columns and rows (scalar widgets)."""

    series: list[Series] = field(default_factory=list)
    group_keys: list[str] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    rows: list[tuple[tuple[str, ...], list[float | None]]] = field(default_factory=list)
    error: str | None = None


def substitute(query: str, variables: Sequence[Mapping[str, Any]], chosen: Mapping[str, str]) -> str:
    """The query with each `$name` replaced by `prefix:value` (or dropped for `*`) inside its scope."""
    prefixes = {str(v.get("name")): str(v.get("prefix") or v.get("name")) for v in variables}

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in prefixes:
            raise QueryError(f"unknown template variable ${name}")
        value = chosen.get(name, "*")
        return "*" if value == "*" else f"{prefixes[name]}:{value}"

    def scope(match: re.Match[str]) -> str:
        terms = [_VARIABLE_RE.sub(value_of, t).strip() for t in _split_terms(match.group(1))]
        kept = [t for t in terms if t and t != "*"]
        return "{" + (",".join(kept) if kept else "*") + "}"

    # Only the first brace pair of a query is its scope; `by {...}` holds tag keys, never variables.
    return re.sub(r"\{([^{}]*)\}", scope, query, count=1)


def _split_terms(text: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _label(alias: str, group: Sequence[str]) -> str:
    return f"{alias} {', '.join(group)}" if group else alias


class Evaluator:
    """Runs widgets' requests between start and end (epoch seconds) with the template variables chosen."""

    def __init__(
        self,
        run: RunQuery,
        start: float,
        end: float,
        variables: Sequence[Mapping[str, Any]],
        chosen: Mapping[str, str],
    ) -> None:
        self.run = run
        self.start = start
        self.end = end
        self.variables = variables
        self.chosen = chosen

    def widget(self, definition: Mapping[str, Any]) -> Result:
        """The result of one data widget; a query the engine cannot run becomes the result's error."""
        try:
            if definition.get("type") == "timeseries":
                return self._timeseries(definition.get("requests") or [])
            return self._scalar(definition.get("requests") or [])
        except (QueryError, KeyError, TypeError) as exc:
            return Result(error=str(exc) or type(exc).__name__)

    def _queries(self, request: Mapping[str, Any]) -> list[tuple[str, str, str]]:
        out: list[tuple[str, str, str]] = []
        for item in request.get("queries") or []:
            text = substitute(str(item["query"]), self.variables, self.chosen)
            out.append((str(item.get("name") or f"query{len(out) + 1}"), text, str(item.get("aggregator") or "avg")))
        return out

    def _timeseries(self, requests: Sequence[Mapping[str, Any]]) -> Result:
        result = Result()
        span = self.end - self.start
        for request in requests:
            queries = self._queries(request)
            parsed = {name: parse_query(text) for name, text, _ in queries}
            step = max(pick_interval(span, max(MIN_STEP_S, q.rollup_seconds or 0)) for q in parsed.values())
            results = {name: self.run(text, self.start, self.end, step) for name, text, _ in queries}
            for f in request.get("formulas") or [{"formula": n} for n in results]:
                formula = parse_formula(str(f["formula"]))
                alias = str(f.get("alias") or f["formula"])
                metric = parsed[str(formula.tree[1])].metric if formula.tree[0] == "name" else None
                for g in formula_series(formula, results):
                    result.series.append(Series(_label(alias, g.group_tags), metric, g.points))
        return result

    def _scalar(self, requests: Sequence[Mapping[str, Any]]) -> Result:
        result = Result()
        for request in requests[:1]:  # gpufarm's scalar widgets have one request each
            queries = self._queries(request)
            parsed = {name: parse_query(text) for name, text, _ in queries}
            scalars = self._scalars(queries, parsed, result)
            formulas = request.get("formulas") or [{"formula": n} for n in scalars]
            tables: list[dict[tuple[str, ...], float | None]] = []
            limit, descending = MAX_ROWS, True
            for f in formulas:
                formula = parse_formula(str(f["formula"]))
                metric = parsed[str(formula.tree[1])].metric if formula.tree[0] == "name" else None
                result.columns.append(Column(str(f.get("alias") or f["formula"]), metric))
                tables.append(formula_scalars(formula, scalars))
                if isinstance(f.get("limit"), Mapping) and len(tables) == 1:
                    limit = min(MAX_ROWS, int(f["limit"].get("count", 10)))
                    descending = f["limit"].get("order", "desc") == "desc"
            result.rows = _rows(tables, limit, descending)
        return result

    def _scalars(
        self, queries: list[tuple[str, str, str]], parsed: Mapping[str, MetricQuery], result: Result
    ) -> dict[str, dict[tuple[str, ...], float | None]]:
        """Each query reduced to one value per group; the queries' group-by keys are added to the result's."""
        span = self.end - self.start
        scalars: dict[str, dict[tuple[str, ...], float | None]] = {}
        for name, text, aggregator in queries:
            step = pick_interval(span, parsed[name].rollup_seconds)
            groups = self.run(text, self.start, self.end, step)
            scalars[name] = {g.group_tags: reduce_points(g.points, aggregator, step) for g in groups}
            result.group_keys += [k for k in parsed[name].group_by if k not in result.group_keys]
        return scalars


def _rows(
    tables: list[dict[tuple[str, ...], float | None]], limit: int, descending: bool
) -> list[tuple[tuple[str, ...], list[float | None]]]:
    """One row per group, sorted on the first column, at most limit of them."""
    keys = sorted({g for table in tables for g in table})
    first = tables[0] if tables else {}
    keys.sort(key=lambda g: _sort_value(first.get(g), descending), reverse=descending)
    return [(g, [t.get(g) for t in tables]) for g in keys[:limit]]


def _sort_value(value: float | None, descending: bool) -> float:
    if value is None:
        return float("-inf") if descending else float("inf")
    return value
