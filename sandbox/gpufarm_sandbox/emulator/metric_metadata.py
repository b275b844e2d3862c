"""Sandbox module: metric metadata (`GET` and `PUT /api/v1/metrics/{metric_name}`, Datadog's MetricMetadata).

`gpufarm datadog apply` sends every metric's type, unit, per-second unit and description, so graphs show units; the
local dashboard pages read them back from here. A body is accepted only if datadog-api-client's `MetricMetadata`
model takes it with type checks on, its `type` is one Datadog knows and its units are Datadog unit names; only the
editable keys are kept (`integration` is Datadog's to set and is refused, as it is read-only there).

A metric that has never had a point can take metadata here (apply runs before the first agent reports); reading one
that has neither points nor metadata is a 404, as in Datadog. A metric with points and no metadata reads as
Datadog answers it then: every key null but the type, from how its points arrived.
"""

from __future__ import annotations

import json
import re
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.client_models import offline_client
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.web import ApiError, Route, json_object, json_response

API = "/api/v1/metrics/<path:metric_name>"
METRIC_TYPES = ("gauge", "count", "rate", "distribution")
EDITABLE = ("description", "short_name", "statsd_interval", "type", "unit", "per_unit")
MAX_DESCRIPTION = 4000
MAX_SHORT_NAME = 200
_METRIC_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,199}$")
# Datadog's metric unit names (its documented unit list), by family.
_UNIT_FAMILIES = (
    "bit byte kibibyte mebibyte gibibyte tebibyte pebibyte exbibyte",
    "nanosecond microsecond millisecond second minute hour day week",
    "percent_nano percent apdex fraction",
    "connection request packet segment response message payload timeout datagram route session hop",
    "process thread host node fault service instance cpu",
    "file inode sector block",
    "buffer error read write occurrence event time unit operation item task worker resource email",
    "sample stage",
    "monitor location check attempt device update method job container execution throttle invocation",
    "user success",
    "build prediction exception",
    "table index lock transaction query row key command offset record object cursor assertion scan",
    "document shard",
    "flush merge refresh fetch column commit wait ticket question",
    "hit miss eviction get set",
    "dollar cent microdollar euro",
    "page split",
    "hertz kilohertz megahertz gigahertz",
    "entry",
    "nanocore microcore millicore core kilocore megacore gigacore teracore petacore exacore",
    "nanowatt microwatt milliwatt deciwatt watt kilowatt megawatt gigawatt terawatt",
    "millijoule joule kilojoule megajoule gigajoule",
    "milliampere ampere",
    "millivolt volt",
)
UNITS = frozenset(word for family in _UNIT_FAMILIES for word in family.split()) | frozenset(
    {"decidegree celsius", "degree celsius", "degree fahrenheit", "garbage collection"}
)


class MetricMetadataModule(BaseModule):
    """Metric metadata of the sandbox."""

    name = "metric_metadata"

    def __init__(self, context: SandboxContext, metrics: MetricsModule) -> None:
        super().__init__(context)
        self.metrics = metrics
        self._metadata: dict[str, dict[str, Any]] = {}

    def routes(self) -> list[Route]:
        """Get and edit one metric's metadata."""
        return [
            Route(API, ("GET",), self._get),
            Route(API, ("PUT",), self._put),
        ]

    def reset(self) -> None:
        """Forget every metric's metadata."""
        self._metadata.clear()

    def dump(self) -> dict[str, Any]:
        """Every metric's stored metadata."""
        return {"metrics": {name: dict(meta) for name, meta in sorted(self._metadata.items())}}

    def metadata(self, metric: str) -> dict[str, Any] | None:
        """The stored metadata of one metric (None: none was sent)."""
        with self.ctx.lock:
            found = self._metadata.get(metric)
            return dict(found) if found is not None else None

    # -- handlers -------------------------------------------------------------------------------------

    def _get(self, request: Request, metric_name: str) -> Response:
        name = _checked_name(metric_name)
        with self.ctx.lock:
            stored = self._metadata.get(name)
            if stored is not None:
                return json_response(_view(stored))
        if name not in self.metrics.metric_names():
            raise ApiError(404, f"Metric {name} not found")
        return json_response(_view({}))

    def _put(self, request: Request, metric_name: str) -> Response:
        name = _checked_name(metric_name)
        body = _validated(json_object(request))
        with self.ctx.lock:
            merged = {**self._metadata.get(name, {}), **body}
            self._metadata[name] = merged
            return json_response(_view(merged))


def _checked_name(raw: str) -> str:
    if not _METRIC_RE.match(raw):
        raise ApiError(400, f"Invalid metric name {raw[:80]!r}")
    return raw


def _validated(body: dict[str, Any]) -> dict[str, Any]:
    """The editable keys of a MetricMetadata body, checked as Datadog checks them; ApiError(400) otherwise."""
    if "integration" in body:
        raise ApiError(400, "Invalid parameter 'integration': it is read-only")
    unknown = sorted(set(body) - set(EDITABLE))
    if unknown:
        raise ApiError(400, f"Invalid parameter {unknown[0]!r}")
    _model_check(body)
    kind = body.get("type")
    if kind is not None and kind not in METRIC_TYPES:
        raise ApiError(400, f"Invalid metric type {kind!r}: must be one of {', '.join(METRIC_TYPES)}")
    for key in ("unit", "per_unit"):
        unit = body.get(key)
        if unit is not None and unit not in UNITS:
            raise ApiError(400, f"Invalid {key} {str(unit)[:40]!r}: not a Datadog unit")
    _check_lengths(body)
    interval = body.get("statsd_interval")
    if interval is not None and interval <= 0:
        raise ApiError(400, "Invalid statsd_interval: must be positive")
    return {k: body[k] for k in EDITABLE if k in body}


def _check_lengths(body: dict[str, Any]) -> None:
    description = body.get("description")
    if description is not None and len(description) > MAX_DESCRIPTION:
        raise ApiError(400, f"Invalid description: longer than {MAX_DESCRIPTION} characters")
    short = body.get("short_name")
    if short is not None and len(short) > MAX_SHORT_NAME:
        raise ApiError(400, f"Invalid short_name: longer than {MAX_SHORT_NAME} characters")


def _model_check(body: dict[str, Any]) -> None:
    from datadog_api_client.exceptions import OpenApiException
    from datadog_api_client.v1.model.metric_metadata import MetricMetadata

    try:
        offline_client().deserialize(json.dumps(body), (MetricMetadata,), True)
    except (OpenApiException, TypeError, ValueError) as exc:
        raise ApiError(400, f"Invalid metric metadata: {str(exc)[:200]}") from None


def _view(stored: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"integration": None}
    out.update({k: stored.get(k) for k in EDITABLE})
    if out["type"] is None:
        out["type"] = "gauge"
    return out
