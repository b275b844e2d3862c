"""Sandbox module: metric intake (v1/v2 series) and queries (v1 `/api/v1/query`, v2 timeseries and scalar).

Points are kept per series in compact float arrays. A series is a metric plus its full tag set, and that tag set is
fixed when the point arrives: the submitted tags, `host:<name>`, and the host's tags *at that moment* (Datadog stamps
host tags at ingest, so after a host changes hands its old points keep the old `ir:` tag). Queries go through the pure
engine in `gpufarm_sandbox.emulator.query`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.hosts import HostsModule
from gpufarm_sandbox.emulator.metric_intake import (
    COUNT,
    MAX_EPOCH_MS,
    V1_MAX_BYTES,
    ParsedSeries,
    check_size,
    finite,
    parse_v1,
    parse_v2,
)
from gpufarm_sandbox.emulator.metric_requests import FormulaRequest, single_metric
from gpufarm_sandbox.emulator.query import (
    GroupSeries,
    MetricQuery,
    QueryError,
    SeriesData,
    evaluate,
    parse_queries,
    parse_query,
    pick_interval,
    reduce_points,
)
from gpufarm_sandbox.emulator.query_formulas import Formula, formula_scalars, formula_series
from gpufarm_sandbox.emulator.web import MAX_COMPRESSED_BYTES, ApiError, Auth, Route, json_body, json_response

__all__ = ["GroupSeries", "MetricsModule"]

MAX_PAST_S = 3600  # points older than one hour are refused (v1.yaml / v2.yaml `points`)
MAX_FUTURE_S = 600  # ... and so are points more than ten minutes ahead


# Units as Datadog's query APIs describe them ([primary, per] pairs). Only the ids seen in recorded traffic are given.
def _unit(family: str, scale: float, name: str, short: str, plural: str, *, uid: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"family": family, "scale_factor": scale, "name": name, "short_name": short, "plural": plural}
    if uid is not None:
        out["id"] = uid
    return out


_UNITS: dict[str, dict[str, Any]] = {
    u["name"]: u
    for u in (
        _unit("percentage", 1.0, "percent", "%", "percent", uid=17),
        _unit("percentage", 100.0, "fraction", "", "fractions"),
        _unit("time", 1e-9, "nanosecond", "ns", "nanoseconds"),
        _unit("time", 1e-6, "microsecond", "μs", "microseconds", uid=9),
        _unit("time", 0.001, "millisecond", "ms", "milliseconds"),
        _unit("time", 1.0, "second", "s", "seconds"),
        _unit("time", 60.0, "minute", "min", "minutes"),
        _unit("time", 3600.0, "hour", "hr", "hours"),
        _unit("bytes", 1.0, "byte", "B", "bytes"),
        _unit("bytes", 1024.0, "kibibyte", "KiB", "kibibytes"),
        _unit("bytes", 1048576.0, "mebibyte", "MiB", "mebibytes"),
        _unit("bytes", 1073741824.0, "gibibyte", "GiB", "gibibytes"),
        _unit("power", 1.0, "watt", "W", "watts"),
        _unit("power", 0.001, "milliwatt", "mW", "milliwatts"),
        _unit("energy", 1.0, "joule", "J", "joules"),
        _unit("energy", 0.001, "millijoule", "mJ", "millijoules"),
        _unit("temperature", 1.0, "degree celsius", "°C", "degrees celsius"),
        _unit("frequency", 1.0, "hertz", "Hz", "hertz"),
        _unit("frequency", 1e6, "megahertz", "MHz", "megahertz"),
        _unit("system", 1.0, "process", "proc", "processes"),
        _unit("system", 1.0, "device", "dev", "devices"),
        _unit("general", 1.0, "error", "err", "errors"),
    )
}
_UNIT_ALIASES = {"celsius": "degree celsius", "%": "percent", "b": "byte", "bytes": "byte", "mib": "mebibyte"}


class _Series:
    """Points of one series: parallel float arrays kept sorted; an out-of-order write marks it for compaction."""

    __slots__ = ("dirty", "is_count", "tags", "ts", "vals")

    def __init__(self, tags: frozenset[str], is_count: bool) -> None:
        self.tags = tags
        self.is_count = is_count
        self.ts = array("d")
        self.vals = array("d")
        self.dirty = False

    def add(self, t: float, v: float) -> None:
        """Append a point; appending in time order (the usual case) stays O(1)."""
        ts = self.ts
        if ts and t <= ts[-1]:
            if t == ts[-1]:
                self.vals[-1] = v  # a resent point replaces the old value, as a gauge does in Datadog
                return
            self.dirty = True
        ts.append(t)
        self.vals.append(v)

    def compact(self) -> None:
        """Sort by time; for equal timestamps the last write wins."""
        if not self.dirty:
            return
        order = sorted(range(len(self.ts)), key=self.ts.__getitem__)  # stable: equal times keep arrival order
        last: dict[float, float] = {}
        for i in order:
            last[self.ts[i]] = self.vals[i]
        self.ts = array("d", last.keys())
        self.vals = array("d", last.values())
        self.dirty = False

    def view(self) -> SeriesData:
        """The series as the query engine reads it (compacted first)."""
        self.compact()
        return SeriesData(self.tags, self.ts, self.vals, self.is_count)


# A scalar answer's column: its name, value per group, the metric whose unit it keeps, and its formula if any.
_Column = tuple[str, dict[tuple[str, ...], float | None], str | None, Formula | None]


class MetricsModule(BaseModule):
    """Series intake, storage and the three query endpoints."""

    name = "metrics"

    def __init__(self, context: SandboxContext, hosts: HostsModule) -> None:
        super().__init__(context)
        self.hosts = hosts
        self._series: dict[tuple[str, frozenset[str]], _Series] = {}
        self._by_metric: dict[str, list[_Series]] = {}
        self._units: dict[str, str] = {}

    # -- public API ----------------------------------------------------------------------------------------------

    def query_series(self, query: str, start: float, end: float, interval: float | None = None) -> list[GroupSeries]:
        """Run one metric query between start and end (epoch seconds): space-aggregated points per group.

        Raises QueryError for a query the engine cannot parse.
        """
        parsed = parse_query(query)
        step = pick_interval(end - start, interval or parsed.rollup_seconds)
        return self._run(parsed, start, end, step)

    def metric_names(self) -> list[str]:
        """Every metric that has points."""
        with self.ctx.lock:
            return sorted(self._by_metric)

    # -- module plumbing -----------------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Intake (API key only) and query (API + application key) endpoints."""
        return [
            Route("/api/v2/series", ("POST",), self._submit_v2, Auth.DD_API),
            Route("/api/v1/series", ("POST",), self._submit_v1, Auth.DD_API),
            Route("/api/v1/query", ("GET",), self._query_v1),
            Route("/api/v2/query/timeseries", ("POST",), self._query_timeseries),
            Route("/api/v2/query/scalar", ("POST",), self._query_scalar),
        ]

    def reset(self) -> None:
        """Forget every point."""
        with self.ctx.lock:
            self._series.clear()
            self._by_metric.clear()
            self._units.clear()

    def dump(self) -> dict[str, Any]:
        """A summary: series and point counts, and the series count per metric."""
        with self.ctx.lock:
            for series in self._series.values():
                series.compact()  # resent points count once
            return {
                "series": len(self._series),
                "points": sum(len(s.ts) for s in self._series.values()),
                "metrics": {m: len(s) for m, s in sorted(self._by_metric.items())},
                "units": dict(sorted(self._units.items())),
            }

    # -- intake --------------------------------------------------------------------------------------------------

    def _submit_v2(self, request: Request) -> Response:
        check_size(request, MAX_COMPRESSED_BYTES)
        body = json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("series"), list):
            raise ApiError(400, 'Invalid payload: expected {"series": [...]}')
        errors: list[str] = []
        parsed = [p for i, s in enumerate(body["series"]) if (p := parse_v2(i, s, errors)) is not None]
        errors.extend(self._ingest(parsed))
        return json_response({"errors": errors}, 202)

    def _submit_v1(self, request: Request) -> Response:
        check_size(request, V1_MAX_BYTES)
        body = json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("series"), list):
            raise ApiError(400, 'Invalid payload: expected {"series": [...]}')
        errors: list[str] = []
        parsed = [p for i, s in enumerate(body["series"]) if (p := parse_v1(i, s, errors)) is not None]
        self._ingest(parsed)
        # v1 answers only a status; points it drops (too old, too far ahead) are dropped silently, as Datadog does.
        return json_response({"status": "ok"}, 202, {"Content-Type": "text/json"})

    def _ingest(self, parsed: Iterable[ParsedSeries]) -> list[str]:
        errors: list[str] = []
        with self.ctx.lock:
            now = self.ctx.clock.now()
            oldest, newest = now - MAX_PAST_S, now + MAX_FUTURE_S
            for p in parsed:
                kept = [(t, v) for t, v in p.points if oldest <= t <= newest]
                if len(kept) < len(p.points):
                    errors.append(
                        f"{p.metric}: {len(p.points) - len(kept)} point(s) dropped: timestamps must be within "
                        f"{MAX_PAST_S // 60} minutes in the past and {MAX_FUTURE_S // 60} minutes in the future"
                    )
                if p.unit:
                    self._units[p.metric] = p.unit
                tags = set(p.tags)
                if p.host:
                    self.hosts.touch(p.host, now)
                    tags.update(self.hosts.tags_for(p.host))
                    tags.add(f"host:{p.host.lower()}")
                if not kept:
                    continue
                key = (p.metric, frozenset(tags))
                series = self._series.get(key)
                if series is None:
                    series = _Series(key[1], p.kind == COUNT)
                    self._series[key] = series
                    self._by_metric.setdefault(p.metric, []).append(series)
                for t, v in kept:
                    series.add(t, v)
        return errors

    # -- queries -------------------------------------------------------------------------------------------------

    def _run(self, query: MetricQuery, start: float, end: float, interval: int) -> list[GroupSeries]:
        with self.ctx.lock:
            views = [s.view() for s in self._by_metric.get(query.metric, ())]
            return evaluate(query, views, start, end, interval)

    def _unit(self, metric: str) -> list[dict[str, Any] | None] | None:
        name = self._units.get(metric)
        unit = _UNITS.get(_UNIT_ALIASES.get(name, name)) if name else None
        return [dict(unit), None] if unit else None

    def _query_v1(self, request: Request) -> Response:
        start = _int_param(request, "from")
        end = _int_param(request, "to")
        text = request.args.get("query")
        if not text or not text.strip():
            raise ApiError(400, "Missing required parameter: query")
        if end <= start:
            raise ApiError(400, "Invalid time range: 'from' must be before 'to'")
        try:
            queries = parse_queries(text)
        except QueryError as exc:
            raise ApiError(400, str(exc)) from None
        series_out: list[dict[str, Any]] = []
        for index, q in enumerate(queries):
            step = pick_interval(end - start, q.rollup_seconds)
            series_out.extend(self._v1_series(q, index, g, step) for g in self._run(q, start, end, step))
        return json_response(
            {
                "status": "ok",
                "resp_version": 1,
                "series": series_out,
                "to_date": end * 1000,
                "query": text,
                "message": "",
                "res_type": "time_series",
                "times": [],
                "from_date": start * 1000,
                "group_by": sorted({k for q in queries for k in q.group_by}),
                "values": [],
            }
        )

    def _v1_series(self, q: MetricQuery, index: int, g: GroupSeries, step: int) -> dict[str, Any]:
        first, last = g.points[0][0], g.points[-1][0]
        with self.ctx.lock:
            unit = self._unit(q.metric) or [None, None]
        scope = (
            q.scope.strip()
            if not g.group_tags
            else ",".join(g.group_tags)
            if q.scope.strip() == "*"
            else (f"{q.scope.strip()},{','.join(g.group_tags)}")
        )
        return {
            "end": int((last + step - 1) * 1000),
            "attributes": {},
            "metric": q.metric,
            "interval": step,
            "tag_set": list(g.group_tags),
            "start": int(first * 1000),
            "length": len(g.points),
            "query_index": index,
            "aggr": q.space_agg if q.explicit_agg else None,
            "scope": scope,
            "pointlist": [[t * 1000, v] for t, v in g.points],
            "expression": q.expression(g.group_tags),
            "unit": unit,
            "display_name": q.metric,
        }

    def _formula_request(self, request: Request, kind: str) -> FormulaRequest:
        body = json_body(request)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, dict):
            raise ApiError(400, "API input validation failed: data is required")
        if data.get("type") != f"{kind}_request":
            raise ApiError(400, f'API input validation failed: Invalid type. Expected "{kind}_request".')
        attrs = data.get("attributes")
        if not isinstance(attrs, dict):
            raise ApiError(400, "API input validation failed: attributes is required")
        return FormulaRequest.parse(attrs, kind, self.ctx.clock.now())

    def _query_timeseries(self, request: Request) -> Response:
        req = self._formula_request(request, "timeseries")
        span = req.end - req.start
        step = max(pick_interval(span, req.interval or q.rollup_seconds) for _, q, _ in req.queries)
        results = {name: self._run(q, req.start, req.end, step) for name, q, _ in req.queries}
        try:
            if req.formulas:
                outputs = [(i, formula_series(f, results), single_metric(f, req)) for i, f in enumerate(req.formulas)]
            else:
                outputs = [(i, results[name], q.metric) for i, (name, q, _) in enumerate(req.queries)]
        except QueryError as exc:
            raise ApiError(400, str(exc)) from None
        attributes = self._timeseries_table(outputs)
        return json_response({"data": {"id": "0", "type": "timeseries_response", "attributes": attributes}})

    def _timeseries_table(self, outputs: list[tuple[int, list[GroupSeries], str | None]]) -> dict[str, Any]:
        """The answer's series (group, query index, unit) and one row of values per series on the shared times."""
        times = sorted({t for _, groups, _ in outputs for g in groups for t, _ in g.points})
        index = {t: i for i, t in enumerate(times)}
        series: list[dict[str, Any]] = []
        values: list[list[float | None]] = []
        with self.ctx.lock:
            for query_index, groups, metric in outputs:
                unit = self._unit(metric) if metric else None
                for g in groups:
                    row: list[float | None] = [None] * len(times)
                    for t, v in g.points:
                        row[index[t]] = v
                    series.append({"group_tags": list(g.group_tags), "query_index": query_index, "unit": unit})
                    values.append(row)
        return {"series": series, "times": [int(t * 1000) for t in times], "values": values}

    def _query_scalar(self, request: Request) -> Response:
        req = self._formula_request(request, "scalar")
        try:
            columns, group_keys = self._scalar_columns(req)
        except QueryError as exc:
            raise ApiError(400, str(exc)) from None
        rows = _limited_rows(columns, req)
        out_columns: list[dict[str, Any]] = []
        if rows:
            out_columns.extend(
                {"name": key, "type": "group", "values": [_group_values(g, key) for g in rows]} for key in group_keys
            )
        with self.ctx.lock:
            for name, table, metric, _ in columns:
                unit = self._unit(metric) if metric else None
                out_columns.append(
                    {"name": name, "values": [table.get(g) for g in rows], "type": "number", "meta": {"unit": unit}}
                )
        return json_response({"data": {"id": "0", "type": "scalar_response", "attributes": {"columns": out_columns}}})

    def _scalar_columns(self, req: FormulaRequest) -> tuple[list[_Column], list[str]]:
        """One column per formula (or per query without formulas), and the group-by keys of the queries."""
        span = req.end - req.start
        scalars: dict[str, dict[tuple[str, ...], float | None]] = {}
        group_keys: list[str] = []
        for name, q, aggregator in req.queries:
            step = pick_interval(span, q.rollup_seconds)
            groups = self._run(q, req.start, req.end, step)
            scalars[name] = {g.group_tags: reduce_points(g.points, aggregator, step) for g in groups}
            group_keys.extend(k for k in q.group_by if k not in group_keys)
        columns: list[_Column]
        if req.formulas:
            columns = [(f.text, formula_scalars(f, scalars), single_metric(f, req), f) for f in req.formulas]
        else:
            columns = [(name, scalars[name], q.metric, None) for name, q, _ in req.queries]
        return columns, group_keys


def _limited_rows(columns: list[_Column], req: FormulaRequest) -> list[tuple[str, ...]]:
    """The groups answered, in order; a formula's limit keeps its top (or bottom) `count` only."""
    rows = sorted({g for _, table, _, _ in columns for g in table})
    limit = next(((f, lim) for _, _, _, f in columns if f is not None and (lim := req.limits.get(f.text))), None)
    if limit is not None:
        formula, (count, order) = limit
        table = next(t for name, t, _, _ in columns if name == formula.text)
        missing = -math.inf if order == "desc" else math.inf
        rows.sort(key=lambda g: v if (v := table.get(g)) is not None else missing, reverse=order == "desc")
        rows = rows[:count]
    return rows


def _group_values(group: tuple[str, ...], key: str) -> list[str]:
    prefix = f"{key}:"
    return [t[len(prefix) :] for t in group if t.startswith(prefix)]


def _int_param(request: Request, name: str) -> int:
    raw = request.args.get(name)
    if raw is None or not raw.strip():
        raise ApiError(400, f"Missing required parameter: {name}")
    value = finite(raw.strip())
    if value is None or abs(value) > MAX_EPOCH_MS:
        raise ApiError(400, f"The value provided for parameter '{name}' is invalid: not a number of seconds")
    return int(value)
