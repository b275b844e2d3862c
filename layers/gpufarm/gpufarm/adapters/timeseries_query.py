"""Datadog's v2 timeseries query (`POST /api/v2/query/timeseries`) as data: the request body and the answer's
groups, shared by the gateway (gpufarm.adapters.datadog, through the client library) and the light record reader
(gpufarm.adapters.datadog_reads, over plain HTTP), so both ask and read the same.

The answer is bounded before use: at most MAX_SERIES groups and MAX_POINTS_READ points each; a point that is not a
finite number is left out; an answer that is not an object fails the read (UpstreamError).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed
from gpufarm.core.kernel.ports import MetricPoint, TimeseriesResult

MAX_SERIES = 5_000
MAX_POINTS_READ = 5_000


def epoch_ms(moment: datetime) -> int:
    """A moment as epoch milliseconds (a naive one read as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def request_body(query: str, start: datetime, end: datetime, max_points: int) -> dict[str, Any]:
    """The query over the window, its interval chosen (whole minutes) for at most about max_points buckets."""
    if end <= start:
        raise ValidationFailed("end", "the query window must end after it starts")
    span_ms = epoch_ms(end) - epoch_ms(start)
    interval_ms = max(60_000, math.ceil(span_ms / max(1, max_points) / 60_000) * 60_000)
    return {
        "data": {
            "type": "timeseries_request",
            "attributes": {
                "from": epoch_ms(start),
                "to": epoch_ms(end),
                "interval": interval_ms,
                "queries": [{"data_source": "metrics", "name": "a", "query": query}],
            },
        }
    }


def answer_attributes(body: Any) -> Mapping[str, Any]:
    """The attributes of a timeseries answer's JSON; UpstreamError when it is not one."""
    data = body.get("data") if isinstance(body, dict) else None
    attributes = data.get("attributes") if isinstance(data, dict) else None
    if attributes is None and isinstance(data, dict):
        return {}
    if not isinstance(attributes, dict):
        raise UpstreamError("Datadog answered the timeseries query with an unexpected shape")
    return attributes


def timeseries_results(attributes: Mapping[str, Any]) -> list[TimeseriesResult]:
    """Groups of a v2 timeseries answer: `series[i].group_tags` with `values[i]` over the shared `times` (ms)."""
    times_in = attributes.get("times")
    values_in = attributes.get("values")
    series_in = attributes.get("series")
    times = [int(t) // 1000 for t in _list(times_in)[:MAX_POINTS_READ] if _number(t)]
    values = _list(values_in)
    out: list[TimeseriesResult] = []
    for i, series in enumerate(_list(series_in)[:MAX_SERIES]):
        if not isinstance(series, Mapping):
            continue
        row = values[i] if i < len(values) and isinstance(values[i], list) else []
        points = tuple(
            MetricPoint(t, float(v)) for t, v in zip(times, row, strict=False) if _number(v) and math.isfinite(float(v))
        )
        tags = tuple(str(t)[:200] for t in _list(series.get("group_tags"))[:50])
        out.append(TimeseriesResult(tags, points))
    return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
