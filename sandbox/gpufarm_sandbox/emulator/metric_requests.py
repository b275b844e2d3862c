"""What a v2 timeseries or scalar query request may carry: its time range, named metric queries, formulas and
limits, checked as Datadog checks them."""

from __future__ import annotations

from typing import Any

from gpufarm_sandbox.emulator.metric_intake import MAX_EPOCH_MS, is_int
from gpufarm_sandbox.emulator.query import SCALAR_REDUCERS, MetricQuery, QueryError, parse_query
from gpufarm_sandbox.emulator.query_formulas import Formula, parse_formula
from gpufarm_sandbox.emulator.web import ApiError

RETENTION_S = 15 * 30 * 86400  # Datadog keeps metrics 15 months; queries ending before that are refused


class FormulaRequest:
    """A validated v2 timeseries/scalar request: times in seconds, named queries, formulas and limits."""

    def __init__(self) -> None:
        self.start = 0.0
        self.end = 0.0
        self.interval: float | None = None
        self.queries: list[tuple[str, MetricQuery, str]] = []
        self.formulas: list[Formula] = []
        self.limits: dict[str, tuple[int, str]] = {}

    @classmethod
    def parse(cls, attrs: dict[str, Any], kind: str, now: float) -> FormulaRequest:
        """Validate `data.attributes` of a timeseries or scalar request; ApiError(400) on anything wrong."""
        req = cls()
        req.start, req.end = _time_range(attrs, now)
        if kind == "timeseries" and attrs.get("interval") is not None:
            interval = attrs["interval"]
            if not is_int(interval) or not 0 < interval <= MAX_EPOCH_MS:
                raise ApiError(400, "API input validation failed: interval must be a positive integer (milliseconds)")
            req.interval = interval / 1000
        queries = attrs.get("queries")
        if not isinstance(queries, list) or not queries:
            raise ApiError(400, "API input validation failed: queries must be a non-empty list")
        for i, item in enumerate(queries):
            req.queries.append(_parse_named_query(i, item, kind))
        names = [n for n, _, _ in req.queries]
        if len(set(names)) != len(names):
            raise ApiError(400, "API input validation failed: query names must be unique")
        formulas = attrs.get("formulas")
        if formulas is not None:
            if not isinstance(formulas, list):
                raise ApiError(400, "API input validation failed: formulas must be a list")
            for i, item in enumerate(formulas):
                req._add_formula(i, item)
        return req

    def _add_formula(self, i: int, item: Any) -> None:
        if not isinstance(item, dict) or not isinstance(item.get("formula"), str):
            raise ApiError(400, f"API input validation failed: formulas[{i}].formula is required")
        try:
            formula = parse_formula(item["formula"])
        except QueryError as exc:
            raise ApiError(400, str(exc)) from None
        known = {n for n, _, _ in self.queries}
        unknown = [n for n in formula.names if n not in known]
        if unknown:
            raise ApiError(400, f"Invalid formula {formula.text!r}: unknown query name {unknown[0]!r}")
        self.formulas.append(formula)
        limit = item.get("limit")
        if limit is not None:
            if not isinstance(limit, dict):
                raise ApiError(400, f"API input validation failed: formulas[{i}].limit must be an object")
            count = limit.get("count", 10)
            order = limit.get("order", "desc")
            if not is_int(count) or count <= 0 or order not in {"asc", "desc"}:
                raise ApiError(400, f"API input validation failed: formulas[{i}].limit needs count > 0, order asc|desc")
            self.limits[formula.text] = (count, order)


def _time_range(attrs: dict[str, Any], now: float) -> tuple[float, float]:
    """`from` and `to` (epoch milliseconds, `to` exclusive) as the first and last second asked for."""
    start_ms, end_ms = attrs.get("from"), attrs.get("to")
    if not is_int(start_ms) or not is_int(end_ms):
        raise ApiError(400, "API input validation failed: from and to are required integers (milliseconds)")
    if abs(start_ms) > MAX_EPOCH_MS or abs(end_ms) > MAX_EPOCH_MS:
        raise ApiError(400, "API input validation failed: from and to must be epoch milliseconds")
    if end_ms <= start_ms:
        raise ApiError(400, "Invalid time range: 'from' must be before 'to'")
    if end_ms / 1000 < now - RETENTION_S:
        raise ApiError(400, "Queries ending outside the retention date are invalid")
    return start_ms / 1000, (end_ms - 1) / 1000


def _parse_named_query(i: int, item: Any, kind: str) -> tuple[str, MetricQuery, str]:
    if not isinstance(item, dict):
        raise ApiError(400, f"API input validation failed: queries[{i}] must be an object")
    source = item.get("data_source")
    if source != "metrics":
        raise ApiError(400, f"queries[{i}]: data_source {source!r} is not supported by the sandbox; use 'metrics'")
    text = item.get("query")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, f"API input validation failed: queries[{i}].query is required")
    name = item.get("name", f"query{i + 1}")
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"API input validation failed: queries[{i}].name must be a string")
    aggregator: Any = "avg"
    if kind == "scalar":
        aggregator = item.get("aggregator")
        if aggregator == "percentile":
            raise ApiError(400, "The percentile aggregator needs a distribution metric; the sandbox stores none")
        if aggregator not in SCALAR_REDUCERS:
            raise ApiError(
                400, f"API input validation failed: queries[{i}].aggregator must be one of {sorted(SCALAR_REDUCERS)}"
            )
    try:
        return name, parse_query(text), str(aggregator)
    except QueryError as exc:
        raise ApiError(400, str(exc)) from None


def single_metric(formula: Formula, req: FormulaRequest) -> str | None:
    """The metric whose unit a formula keeps: only a bare query name keeps its unit."""
    if formula.tree[0] == "name":
        for name, q, _ in req.queries:
            if name == formula.tree[1]:
                return q.metric
    return None
