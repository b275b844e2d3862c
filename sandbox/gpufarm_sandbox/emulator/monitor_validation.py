"""What a monitor may be: Datadog's checks on a create, update or validate body, with its error wording, and the
metric monitor query (`avg(last_1h):avg:gpufarm.gpu.utilization{*} by {ir} < 5`) parsed for the evaluator.

Create, update and both validate endpoints run the one function here (`validated`), so validate refuses exactly
what create refuses, with the same 400. A metric monitor's rolling window is checked against one of the two
grammars Datadog's reference has documented (WindowGrammar; docs/datadog.md, "Monitor windows"): the fixed list by
default, the current reference's ranges when a test asks for them (`POST /_sandbox/monitors/windows`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufarm_sandbox.emulator.query import MetricQuery, QueryError, parse_query
from gpufarm_sandbox.emulator.web import ApiError

MONITOR_TYPES = frozenset(
    {
        "composite", "event alert", "log alert", "metric alert", "process alert", "query alert", "rum alert",
        "service check", "synthetics alert", "trace-analytics alert", "slo alert", "event-v2 alert", "audit alert",
        "ci-pipelines alert", "ci-tests alert", "error-tracking alert", "database-monitoring alert",
        "network-performance alert", "cost alert", "data-quality alert", "network-path alert", "data-jobs alert",
        "llm-observability alert",
    }
)  # fmt: skip


EVALUATED_TYPES = frozenset({"query alert", "metric alert"})


# Types whose query does not end in `<operator> <number>`.
_NO_OPERATOR_TYPES = frozenset({"composite", "service check", "synthetics alert"})


_ON_MISSING = frozenset({"default", "show_no_data", "show_and_notify_no_data", "resolve"})


RENOTIFY_STATUSES = frozenset({"alert", "warn", "no data"})


MAX_OPTION = 10**9  # bound for integer options (seconds, minutes, hours): keeps time arithmetic in float range


_TRAILING_OP = re.compile(r"(<=|>=|==|!=|<|>)\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*$")


_METRIC_MONITOR = re.compile(
    r"^\s*(?P<agg>[a-z_]+)\((?P<kind>last|current)_(?P<n>\d+)(?P<unit>mo|m|h|d|w|y)\)\s*:\s*(?P<query>.+?)\s*"
    r"(?P<op><=|>=|==|!=|<|>)\s*(?P<threshold>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*$",
    re.DOTALL,
)


_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800, "mo": 30 * 86400, "y": 365 * 86400}


class WindowGrammar(StrEnum):
    """Which documented grammar of a metric monitor's rolling window (`last_...`) the sandbox plays."""

    # The list every version of the reference documents: last_#m (5, 10, 15, or 30), last_#h (1, 2, or 4), last_1d.
    FIXED = "fixed"
    # The current reference's: last_#m (1 to 10080), last_#h (1 to 168), last_1d or last_1w; custom windows
    # "depending on the monitor type", which the sandbox takes for every metric monitor.
    RANGES = "ranges"


FIXED_WINDOWS = frozenset({"5m", "10m", "15m", "30m", "1h", "2h", "4h", "1d"})
_RANGE_LIMITS = {"m": 10080, "h": 168}
_RANGE_WHOLE = frozenset({"1d", "1w"})
# Cumulative windows (`current_...`): one hour, day, week, month or year, paired with options.scheduling_options.
_CUMULATIVE = frozenset({"1h", "1d", "1w", "1mo", "1y"})
_EVALUATION_WINDOW_PAIRING = (
    "Monitors with an evaluation_window scheduling_option must have a current query period and vice versa."
)


_TIME_AGGS = frozenset({"avg", "sum", "min", "max"})


def _invalid_query(detail: str) -> ApiError:
    return ApiError(400, f"The value provided for parameter 'query' is invalid: {detail}")


@dataclass(frozen=True)
class MonitorQuery:
    """A parsed metric monitor query: `<time_agg>(<window>):<metric query> <op> <threshold>`."""

    time_agg: str
    window_s: int
    window_text: str
    metric: MetricQuery
    op: str
    threshold: float
    # A `current_...` window: cumulative from the start of the hour, day, ... (options.scheduling_options).
    cumulative: bool = False


def parse_monitor_query(text: str, windows: WindowGrammar = WindowGrammar.FIXED) -> MonitorQuery:
    """Parse a metric monitor query; raises ApiError(400) with Datadog's wording for a bad one."""
    if not _TRAILING_OP.search(text):
        raise _invalid_query("invalid operator specified: ")
    m = _METRIC_MONITOR.match(text)
    if not m:
        raise _invalid_query("expected <time_aggr>(last_#m):<space_aggr>:<metric>{<scope>} <operator> <threshold>")
    agg = m.group("agg")
    if agg not in _TIME_AGGS:
        raise _invalid_query(f"time aggregator {agg!r} is not supported by the sandbox; use avg, sum, min or max")
    n, unit, kind = m.group("n"), m.group("unit"), m.group("kind")
    if not _documented_window(kind, n, unit, windows):
        raise _invalid_query(f"invalid time window {kind}_{n}{unit}")
    threshold = finite(m.group("threshold"))
    if threshold is None:
        raise _invalid_query(f"threshold {m.group('threshold')[:20]} is not a finite number")
    try:
        metric = parse_query(m.group("query"))
    except QueryError as exc:
        raise _invalid_query(str(exc)) from None
    return MonitorQuery(
        time_agg=agg,
        window_s=int(n) * _UNIT_SECONDS[unit],
        window_text=f"{n}{unit}",
        metric=metric,
        op=m.group("op"),
        threshold=threshold,
        cumulative=kind == "current",
    )


def _documented_window(kind: str, digits: str, unit: str, windows: WindowGrammar) -> bool:
    """Whether `<kind>_<digits><unit>` is a window the grammar documents (digits as written: `last_060m` is not)."""
    window = f"{digits}{unit}"
    if kind == "current":
        return window in _CUMULATIVE
    if windows is WindowGrammar.FIXED:
        return window in FIXED_WINDOWS
    if window in _RANGE_WHOLE:
        return True
    limit = _RANGE_LIMITS.get(unit)
    return limit is not None and not digits.startswith("0") and 1 <= int(digits) <= limit


def validated(
    body: dict[str, Any], monitor_id: int | None, windows: WindowGrammar = WindowGrammar.FIXED
) -> tuple[dict[str, Any], MonitorQuery | None]:
    """Check a create/update/validate body as Datadog does; returns the stored fields and the parsed query."""
    mtype, query = _checked_type_and_query(body)
    tags, priority, roles = _checked_labels(body)
    options = body.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ApiError(400, "The value provided for parameter 'options' is invalid: expected an object")
    stored_type = "query alert" if mtype == "metric alert" else mtype
    parsed: MonitorQuery | None = None
    if mtype in EVALUATED_TYPES:
        parsed = parse_monitor_query(query, windows)
    elif mtype not in _NO_OPERATOR_TYPES and not _TRAILING_OP.search(query):
        raise _invalid_query("invalid operator specified: ")
    opts = _validated_options(options, parsed, query)
    multi = bool(parsed.metric.group_by) if parsed else ".by(" in query or " by {" in query
    return (
        {
            "type": stored_type,
            "name": body.get("name") or _default_name(query, parsed),
            "message": body.get("message") or "",
            "tags": list(tags),
            "query": query,
            "options": opts,
            "multi": multi,
            "priority": priority,
            "restricted_roles": roles,
        },
        parsed,
    )


def _checked_type_and_query(body: dict[str, Any]) -> tuple[str, str]:
    mtype = body.get("type")
    if not isinstance(mtype, str) or mtype not in MONITOR_TYPES:
        raise ApiError(400, "The value provided for parameter 'type' is invalid")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "The value provided for parameter 'query' is invalid: query is required")
    for key in ("name", "message"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ApiError(400, f"The value provided for parameter '{key}' is invalid: expected a string")
    return mtype, query


def _checked_labels(body: dict[str, Any]) -> tuple[list[str], int | None, list[str] | None]:
    """Tags, priority and restricted roles."""
    tags = body.get("tags") or []
    if not _strings(tags):
        raise ApiError(400, "The value provided for parameter 'tags' is invalid: expected a list of strings")
    priority = body.get("priority")
    if priority is not None and not (_integer(priority) and 1 <= priority <= 5):
        raise ApiError(400, "The value provided for parameter 'priority' is invalid: expected 1 to 5")
    roles = body.get("restricted_roles")
    if roles is not None and not _strings(roles):
        raise ApiError(400, "The value provided for parameter 'restricted_roles' is invalid")
    return tags, priority, roles


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _default_name(query: str, parsed: MonitorQuery | None) -> str:
    if parsed is None:
        return query
    return f"{parsed.metric.metric} {parsed.op} {fmt(parsed.threshold)} on {parsed.metric.scope}"


_BOOL_OPTIONS = ("notify_no_data", "notify_audit", "include_tags", "require_full_window", "locked")
_INT_OPTIONS = ("renotify_interval", "new_group_delay", "new_host_delay", "evaluation_delay", "no_data_timeframe",
                "timeout_h", "renotify_occurrences")  # fmt: skip


def _validated_options(options: dict[str, Any], parsed: MonitorQuery | None, query: str) -> dict[str, Any]:
    opts: dict[str, Any] = json_copy(options)
    _check_option_types(opts)
    _check_evaluation_window(opts, parsed)
    opts["thresholds"] = _validated_thresholds(opts.get("thresholds"), parsed, query)
    if not opts["thresholds"]:
        del opts["thresholds"]
    opts.setdefault("notify_no_data", False)
    opts.setdefault("notify_audit", False)
    opts.setdefault("include_tags", True)
    opts.setdefault("silenced", {})
    if parsed is None:
        opts.setdefault("groupby_simple_monitor", False)
    else:
        opts.setdefault("new_host_delay", 300)
    return opts


def _check_evaluation_window(opts: dict[str, Any], parsed: MonitorQuery | None) -> None:
    """A cumulative window (`current_1mo`) needs options.scheduling_options.evaluation_window, and only it may."""
    scheduling = opts.get("scheduling_options")
    if scheduling is not None and not isinstance(scheduling, dict):
        raise ApiError(400, "The value provided for parameter 'scheduling_options' is invalid: expected an object")
    window = (scheduling or {}).get("evaluation_window")
    if parsed is not None and bool(window) != parsed.cumulative:
        raise ApiError(400, _EVALUATION_WINDOW_PAIRING)


def _check_option_types(opts: dict[str, Any]) -> None:
    for key in _BOOL_OPTIONS:
        if opts.get(key) is not None and not isinstance(opts[key], bool):
            raise ApiError(400, f"The value provided for parameter '{key}' is invalid: expected a boolean")
    for key in _INT_OPTIONS:
        value = opts.get(key)
        if value is not None and not (_integer(value) and 0 <= value <= MAX_OPTION):
            raise ApiError(
                400, f"The value provided for parameter '{key}' is invalid: expected an integer 0-{MAX_OPTION}"
            )
    if opts.get("on_missing_data") is not None and opts["on_missing_data"] not in _ON_MISSING:
        raise ApiError(400, "The value provided for parameter 'on_missing_data' is invalid")
    statuses = opts.get("renotify_statuses")
    if statuses is not None and (not isinstance(statuses, list) or not set(statuses) <= RENOTIFY_STATUSES):
        raise ApiError(400, "The value provided for parameter 'renotify_statuses' is invalid: alert, warn, no data")
    if opts.get("notify_by") is not None and not _strings(opts["notify_by"]):
        raise ApiError(400, "The value provided for parameter 'notify_by' is invalid: expected a list of strings")


def _validated_thresholds(raw: Any, parsed: MonitorQuery | None, query: str) -> dict[str, float]:
    out = _threshold_numbers(raw)
    match = _TRAILING_OP.search(query)
    if match is None:
        return out
    op, threshold = match.group(1), finite(match.group(2))
    if threshold is None:
        raise _invalid_query(f"threshold {match.group(2)[:20]} is not a finite number")
    if parsed is None and "critical" not in out:
        return out  # non-metric monitors keep the thresholds they were given (none, as recorded)
    critical = out.setdefault("critical", threshold)
    if parsed is not None and critical != threshold:
        raise _invalid_query(
            f"Alert threshold ({fmt(critical)}) does not match that used in the query ({fmt(threshold)})."
        )
    _check_threshold_order(out, op, critical)
    return out


def _threshold_numbers(raw: Any) -> dict[str, float]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ApiError(400, "The value provided for parameter 'thresholds' is invalid: expected an object")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if value is None:
            continue  # a null threshold is dropped, as Datadog answers
        if key in {"critical_query", "critical_recovery_query"}:
            raise ApiError(400, f"Dynamic thresholds ({key}) are not supported by the sandbox")
        number = finite(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if number is None:
            raise ApiError(400, f"The value provided for parameter 'thresholds.{key}' is invalid: expected a number")
        out[key] = number
    return out


def _check_threshold_order(out: dict[str, float], op: str, critical: float) -> None:
    """Warning and recovery thresholds must sit on the healthy side of the threshold they soften."""
    below = op in {"<", "<="}
    relation = "greater" if below else "less"
    ordered = op in {"<", "<=", ">", ">="}

    def beyond(a: float, b: float) -> bool:  # is `a` on the healthy side of `b`?
        return a > b if below else a < b

    warning = out.get("warning")
    if warning is not None and ordered and not beyond(warning, critical):
        raise ApiError(400, f"Warning threshold ({fmt(warning)}) must be {relation} than the alert threshold "
                            f"({fmt(critical)}) for the '{op}' comparator.")  # fmt: skip
    recovery = out.get("critical_recovery")
    if recovery is not None and ordered and not beyond(recovery, critical):
        raise ApiError(400, f"Alert recovery threshold ({fmt(recovery)}) must be {relation} than the alert "
                            f"threshold ({fmt(critical)}).")  # fmt: skip
    warn_recovery = out.get("warning_recovery")
    if warn_recovery is not None and warning is not None and not beyond(warn_recovery, warning):
        raise ApiError(400, f"Warning recovery threshold ({fmt(warn_recovery)}) must be {relation} than the warning "
                            f"threshold ({fmt(warning)}).")  # fmt: skip


def json_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


def finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def fmt(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.6g}"
