"""What a series submission may carry: the v1 and v2 `series` bodies checked as Datadog checks them, each series
turned into a metric name, kind, tags, host, unit and its finite points."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from werkzeug.wrappers import Request

from gpufarm_sandbox.emulator.hosts import normalize_tags
from gpufarm_sandbox.emulator.web import ApiError

V1_MAX_BYTES = 3_200_000  # v1 series payload limit (v1.yaml)


MAX_METRIC_NAME = 200


MAX_EPOCH_MS = 2**53  # larger numbers are not timestamps (and would not survive float conversion)


_V1_TYPES = {"": 0, "gauge": 3, "count": 1, "rate": 2}


COUNT = 1


@dataclass(slots=True)
class ParsedSeries:
    """One validated submitted series, before it meets the store."""

    metric: str
    kind: int
    tags: list[str]
    host: str | None
    unit: str | None
    points: list[tuple[float, float]]


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_size(request: Request, limit: int) -> None:
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, "Payload too large")


def _metric_name(raw: Any, i: int, errors: list[str]) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        raise ApiError(400, f"Invalid payload: series[{i}].metric is required")
    # Datadog turns odd characters into underscores; a name that does not start with a letter is refused.
    name = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_.") else "_" for ch in raw.strip())
    if not name[0].isalpha() or len(name) > MAX_METRIC_NAME:
        errors.append(f"series[{i}]: invalid metric name {raw[:60]!r}: must start with a letter, at most 200 chars")
        return None
    return name


def finite(value: Any) -> float | None:
    """A finite float, or None for anything that is not one (NaN, infinities, integers beyond float range)."""
    try:
        v = float(value)
    except (ValueError, OverflowError, TypeError):
        return None
    return v if math.isfinite(v) else None


def _point_value(value: Any, i: int) -> float | None:
    if value is None:
        return None
    if not is_number(value):
        raise ApiError(400, f"Invalid payload: series[{i}] has a non-numeric point value")
    return finite(value)  # NaN and infinities are dropped, as no graph can show them


def _timestamp(value: Any, i: int) -> float:
    ts = finite(value) if is_number(value) else None
    if ts is None or abs(ts) > MAX_EPOCH_MS:
        raise ApiError(400, f"Invalid payload: series[{i}].points need epoch-second timestamps")
    return ts


def parse_v2(i: int, raw: Any, errors: list[str]) -> ParsedSeries | None:
    """One series of a v2 body; None (with the reason in errors) for a metric name Datadog refuses."""
    if not isinstance(raw, dict):
        raise ApiError(400, f"Invalid payload: series[{i}] must be an object")
    metric = _metric_name(raw.get("metric"), i, errors)
    kind = raw.get("type", 0)
    if not is_int(kind) or kind not in (0, 1, 2, 3):
        raise ApiError(400, f"Invalid payload: series[{i}].type must be 0, 1, 2 or 3")
    points = _v2_points(raw.get("points"), i)
    tags = normalize_tags(raw.get("tags", []) or [], f"series[{i}].tags")
    host = _v2_resources(raw.get("resources", []) or [], i, tags)
    unit = raw.get("unit")
    if unit is not None and not isinstance(unit, str):
        raise ApiError(400, f"Invalid payload: series[{i}].unit must be a string")
    interval = raw.get("interval")
    if interval is not None and not is_int(interval):
        raise ApiError(400, f"Invalid payload: series[{i}].interval must be an integer")
    if metric is None:
        return None
    return ParsedSeries(metric, kind, tags, host, unit.strip().lower() if unit else None, points)


def _v2_points(points_raw: Any, i: int) -> list[tuple[float, float]]:
    if not isinstance(points_raw, list):
        raise ApiError(400, f"Invalid payload: series[{i}].points is required")
    points: list[tuple[float, float]] = []
    for p in points_raw:
        if not isinstance(p, dict):
            raise ApiError(400, f"Invalid payload: series[{i}].points need an integer timestamp and a value")
        ts = _timestamp(p.get("timestamp"), i)
        v = _point_value(p.get("value"), i)
        if v is not None:
            points.append((ts, v))
    return points


def _v2_resources(resources: Any, i: int, tags: list[str]) -> str | None:
    """The host among a series' resources; the other resources become `<type>:<name>` tags (added to tags)."""
    if not isinstance(resources, list):
        raise ApiError(400, f"Invalid payload: series[{i}].resources must be a list")
    host: str | None = None
    for r in resources:
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not isinstance(r.get("type"), str):
            raise ApiError(400, f"Invalid payload: series[{i}].resources need a name and a type")
        if r["type"] == "host" and r["name"].strip():
            host = r["name"].strip()
        elif r["name"].strip():
            tags.extend(normalize_tags([f"{r['type']}:{r['name']}"]))
    return host


def parse_v1(i: int, raw: Any, errors: list[str]) -> ParsedSeries | None:
    """One series of a v1 body; None (with the reason in errors) for a metric name Datadog refuses."""
    if not isinstance(raw, dict):
        raise ApiError(400, f"Invalid payload: series[{i}] must be an object")
    metric = _metric_name(raw.get("metric"), i, errors)
    kind_raw = raw.get("type", "") or ""
    if not isinstance(kind_raw, str) or kind_raw.lower() not in _V1_TYPES:
        raise ApiError(400, f"Invalid payload: series[{i}].type must be gauge, count or rate")
    points = _v1_points(raw.get("points"), i)
    tags = normalize_tags(raw.get("tags", []) or [], f"series[{i}].tags")
    host = raw.get("host")
    if host is not None and not isinstance(host, str):
        raise ApiError(400, f"Invalid payload: series[{i}].host must be a string")
    if metric is None:
        return None
    return ParsedSeries(metric, _V1_TYPES[kind_raw.lower()], tags, host.strip() or None if host else None, None, points)


def _v1_points(points_raw: Any, i: int) -> list[tuple[float, float]]:
    if not isinstance(points_raw, list):
        raise ApiError(400, f"Invalid payload: series[{i}].points is required")
    points: list[tuple[float, float]] = []
    for p in points_raw:
        if not isinstance(p, Sequence) or isinstance(p, str) or len(p) != 2:
            raise ApiError(400, f"Invalid payload: series[{i}].points must be [timestamp, value] pairs")
        ts = _timestamp(p[0], i)
        v = _point_value(p[1], i)
        if v is not None:
            points.append((ts, v))
    return points
