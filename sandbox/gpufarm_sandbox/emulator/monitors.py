"""Sandbox module: Datadog monitors (v1 CRUD, validate, can_delete) and evaluation of metric monitors.

`query alert` / `metric alert` monitors (`avg(last_1h):avg:gpufarm.gpu.utilization{*} by {ir} < 5`) are evaluated over
the sandbox's stored points whenever the sandbox clock advances, on `POST /_sandbox/monitors/evaluate`, and, when
started, on a background tick. Each group keeps its own state (OK / Warn / Alert / No Data); a transition renders the
monitor's message template and fires every `@webhook-<name>` it mentions with Datadog's `$ALERT_*` variables.
Other monitor types are stored and answered as Datadog answers them, but not evaluated.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.query import MetricQuery, QueryError, parse_query, pick_interval, reduce_points, scope_for
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_body, json_object, json_response, query_int
from gpufarm_sandbox.emulator.webhooks import WebhooksModule

log = logging.getLogger("gpufarm_sandbox.emulator.monitors")

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
OK, WARN, ALERT, NO_DATA = "OK", "Warn", "Alert", "No Data"
_SEVERITY = {ALERT: 3, WARN: 2, NO_DATA: 1, OK: 0}
_GROUP_STATE_FILTERS = {"all": None, "alert": ALERT, "warn": WARN, "no data": NO_DATA}
_ON_MISSING = frozenset({"default", "show_no_data", "show_and_notify_no_data", "resolve"})
_RENOTIFY_STATUSES = {"alert": ALERT, "warn": WARN, "no data": NO_DATA}
_FIRST_ID = 100_000_001
EVENT_LOG_SIZE = 5000
MAX_OPTION = 10**9  # bound for integer options (seconds, minutes, hours): keeps time arithmetic in float range
ORG_ID = 1
CREATOR = {"name": None, "handle": "sandbox@gpufarm.local", "email": "sandbox@gpufarm.local", "id": 1}

_TRAILING_OP = re.compile(r"(<=|>=|==|!=|<|>)\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*$")
_METRIC_MONITOR = re.compile(
    r"^\s*(?P<agg>[a-z_]+)\((?P<kind>last|current)_(?P<n>\d+)(?P<unit>mo|m|h|d|w|y)\)\s*:\s*(?P<query>.+?)\s*"
    r"(?P<op><=|>=|==|!=|<|>)\s*(?P<threshold>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*$",
    re.DOTALL,
)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800, "mo": 30 * 86400, "y": 365 * 86400}
_WINDOW_LIMITS = {"m": 10080, "h": 168, "d": 7, "w": 1}
_TIME_AGGS = frozenset({"avg", "sum", "min", "max"})
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "==": lambda v, t: v == t,
    "!=": lambda v, t: v != t,
}
_WEBHOOK_MENTION = re.compile(r"@webhook-([A-Za-z0-9_\-.]+)")
_TEMPLATE_TAG = re.compile(r"\{\{\s*([#^/]?)\s*([^{}]*?)\s*\}\}")


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


def parse_monitor_query(text: str) -> MonitorQuery:
    """Parse a metric monitor query; raises ApiError(400) with Datadog's wording for a bad one."""
    if not _TRAILING_OP.search(text):
        raise _invalid_query("invalid operator specified: ")
    m = _METRIC_MONITOR.match(text)
    if not m:
        raise _invalid_query("expected <time_aggr>(last_#m):<space_aggr>:<metric>{<scope>} <operator> <threshold>")
    agg = m.group("agg")
    if agg not in _TIME_AGGS:
        raise _invalid_query(f"time aggregator {agg!r} is not supported by the sandbox; use avg, sum, min or max")
    n, unit, kind = int(m.group("n")), m.group("unit"), m.group("kind")
    if n <= 0 or (kind == "last" and (unit not in _WINDOW_LIMITS or n > _WINDOW_LIMITS[unit])):
        raise _invalid_query(f"invalid time window {kind}_{n}{unit}")
    if kind == "current" and (n != 1 or unit not in {"d", "w", "mo", "y"}):
        raise _invalid_query(f"invalid time window {kind}_{n}{unit}")
    threshold = _finite(m.group("threshold"))
    if threshold is None:
        raise _invalid_query(f"threshold {m.group('threshold')[:20]} is not a finite number")
    try:
        metric = parse_query(m.group("query"))
    except QueryError as exc:
        raise _invalid_query(str(exc)) from None
    return MonitorQuery(
        time_agg=agg,
        window_s=n * _UNIT_SECONDS[unit],
        window_text=f"{n}{unit}",
        metric=metric,
        op=m.group("op"),
        threshold=threshold,
    )


# -- message templates -----------------------------------------------------------------------------------------------


def render_template(text: str, flags: Mapping[str, bool], variables: Mapping[str, str]) -> str:
    """Render a monitor message: `{{#cond}}..{{/cond}}`, `{{^cond}}..{{/cond}}`, `{{var}}`, `{{#is_match ...}}`."""
    out: list[str] = []
    stack: list[tuple[str, bool]] = []
    pos = 0
    for m in _TEMPLATE_TAG.finditer(text):
        active = all(on for _, on in stack)
        if active:
            out.append(text[pos : m.start()])
        pos = m.end()
        sigil, body = m.group(1), m.group(2)
        words = [a or b for a, b in re.findall(r'"([^"]*)"|(\S+)', body)]
        name = words[0] if words else ""
        if sigil in {"#", "^"}:
            on = _condition(name, words[1:], flags, variables)
            stack.append((name, on if sigil == "#" else not on))
        elif sigil == "/":
            if stack and stack[-1][0] == name:
                stack.pop()
        elif active:
            out.append(variables.get(body.strip(), ""))
    if all(on for _, on in stack):
        out.append(text[pos:])
    return "".join(out)


def _condition(name: str, args: list[str], flags: Mapping[str, bool], variables: Mapping[str, str]) -> bool:
    if name in {"is_match", "is_exact_match"} and len(args) >= 2:
        value = variables.get(args[0], "")
        if name == "is_match":
            return any(a.lower() in value.lower() for a in args[1:])
        return value in args[1:]
    return bool(flags.get(name, False))


def webhook_mentions(message: str) -> list[str]:
    """`@webhook-<name>` handles in a rendered message, in order, without duplicates."""
    return list(dict.fromkeys(m.rstrip(".-") for m in _WEBHOOK_MENTION.findall(message)))


# -- state -----------------------------------------------------------------------------------------------------------


@dataclass
class _Group:
    status: str
    first_seen: float
    last_triggered_ts: int = 0
    last_notified_ts: int = 0
    last_resolved_ts: int = 0
    last_nodata_ts: int = 0
    cycle_key: str | None = None
    cycle_alerted: bool = False
    value: float | None = None
    last_data: float = 0.0  # sandbox time of the last evaluation that had data for this group


@dataclass
class _Monitor:
    body: dict[str, Any]
    parsed: MonitorQuery | None
    groups: dict[tuple[str, ...], _Group] = field(default_factory=dict)
    # Groups seen in data but still inside new_group_delay: when their first point was.
    pending: dict[tuple[str, ...], float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Notice:
    """A transition to announce once the lock is released."""

    event: dict[str, Any]
    webhooks: tuple[str, ...]
    variables: dict[str, str]


class MonitorsModule(BaseModule):
    """Monitor CRUD, validation, evaluation on the sandbox clock and the evaluation log."""

    name = "monitors"

    def __init__(self, context: SandboxContext, metrics: MetricsModule, webhooks: WebhooksModule) -> None:
        super().__init__(context)
        self.metrics = metrics
        self.webhooks = webhooks
        self._monitors: dict[int, _Monitor] = {}
        self._next_id = _FIRST_ID
        self._events: deque[dict[str, Any]] = deque(maxlen=EVENT_LOG_SIZE)
        self._event_seq = 0
        self._ticker: threading.Thread | None = None
        self._ticker_stop = threading.Event()
        context.clock.subscribe(self._on_clock)

    # -- public API ----------------------------------------------------------------------------------------------

    def evaluate(self, monitor_id: int | None = None) -> list[dict[str, Any]]:
        """Evaluate every evaluable monitor (or one) at the sandbox's now; returns the transition events logged."""
        notices: list[_Notice] = []
        with self.ctx.lock:
            now = self.ctx.clock.now()
            for mid, mon in sorted(self._monitors.items()):
                if mon.parsed is not None and (monitor_id is None or mid == monitor_id):
                    notices.extend(self._evaluate(mon, now))
        # Webhook delivery may be slow or call back into the sandbox: never hold the lock while firing.
        for notice in notices:
            self._fire(notice)
        return [n.event for n in notices]

    def start_ticker(self, interval_s: float = 5.0) -> None:
        """Also evaluate every `interval_s` real seconds in a daemon thread (for `gpufarm local`)."""
        if self._ticker is not None and self._ticker.is_alive():
            return
        self._ticker_stop.clear()
        self._ticker = threading.Thread(target=self._tick, args=(interval_s,), name="monitor-ticker", daemon=True)
        self._ticker.start()

    def stop_ticker(self) -> None:
        """Stop the background evaluation, waiting for the current round to finish."""
        self._ticker_stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=10)
        self._ticker = None

    # -- module plumbing -----------------------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Monitor API endpoints and the evaluation control endpoints."""
        return [
            Route("/api/v1/monitor", ("GET",), self._list),
            Route("/api/v1/monitor", ("POST",), self._create),
            Route("/api/v1/monitor/validate", ("POST",), self._validate),
            Route("/api/v1/monitor/can_delete", ("GET",), self._can_delete),
            Route("/api/v1/monitor/<int(signed=True):monitor_id>", ("GET",), self._get),
            Route("/api/v1/monitor/<int(signed=True):monitor_id>", ("PUT",), self._update),
            Route("/api/v1/monitor/<int(signed=True):monitor_id>", ("DELETE",), self._delete),
            Route("/api/v1/monitor/<int(signed=True):monitor_id>/validate", ("POST",), self._validate_existing),
            Route("/_sandbox/monitors/evaluate", ("POST",), self._evaluate_endpoint, Auth.NONE),
            Route("/_sandbox/monitors/events", ("GET",), self._events_endpoint, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget every monitor and the evaluation log."""
        with self.ctx.lock:
            self._monitors.clear()
            self._next_id = _FIRST_ID
            self._events.clear()
            self._event_seq = 0

    def dump(self) -> dict[str, Any]:
        """Monitors with their group states, and the size of the evaluation log."""
        with self.ctx.lock:
            return {
                "monitors": [self._json(m, "all") for _, m in sorted(self._monitors.items())],
                "events": len(self._events),
            }

    # -- CRUD ----------------------------------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = json_object(request)
        fields, parsed = _validated(body, None)
        with self.ctx.lock:
            mid = self._next_id
            self._next_id += 1
            now = self.ctx.clock.now_dt()
            stamp = now.isoformat()
            record: dict[str, Any] = {
                "id": mid,
                "org_id": ORG_ID,
                **fields,
                "created_at": int(now.timestamp()) * 1000,
                "created": stamp,
                "modified": stamp,
                "deleted": None,
                "restriction_policy": None,
                "draft_status": "published",
                "assets": [],
                "overall_state_modified": None,
                "overall_state": NO_DATA,
                "creator": dict(CREATOR),
            }
            mon = _Monitor(record, parsed)
            self._monitors[mid] = mon
            out = self._json(mon, None)
        return json_response(out)

    def _get(self, request: Request, monitor_id: int) -> Response:
        states = _group_states_arg(request)
        with self.ctx.lock:
            mon = self._find(monitor_id)
            out = self._json(mon, states)
        if _bool_arg(request, "with_downtimes"):
            out["matching_downtimes"] = []
        return json_response(out)

    def _list(self, request: Request) -> Response:
        states = _group_states_arg(request)
        name = (request.args.get("name") or "").strip().lower()
        scope_tags = _csv(request.args.get("tags"))
        monitor_tags = _csv(request.args.get("monitor_tags"))
        id_offset = query_int(request, "id_offset", 0) or 0
        page = query_int(request, "page", None)
        page_size = query_int(request, "page_size", 100, minimum=1, maximum=1000) or 100
        _bool_arg(request, "with_downtimes")
        with self.ctx.lock:
            found = [
                self._json(m, states)
                for mid, m in sorted(self._monitors.items())
                if mid > id_offset
                and (not name or name in str(m.body.get("name", "")).lower())
                and all(t in _scope_tags(m) for t in scope_tags)
                and all(t in m.body.get("tags", []) for t in monitor_tags)
            ]
        if page is not None:
            found = found[page * page_size : (page + 1) * page_size]
        for item in found:
            item["matching_downtimes"] = []
        return json_response(found)

    def _update(self, request: Request, monitor_id: int) -> Response:
        body = json_object(request)
        with self.ctx.lock:
            mon = self._find(monitor_id)
            new_type = body.get("type")
            if new_type is not None and _same_kind(new_type) != _same_kind(mon.body["type"]):
                raise ApiError(400, "The value provided for parameter 'type' is invalid: the type cannot be changed")
            merged = {
                k: mon.body[k] for k in ("type", "query", "name", "message", "tags", "priority", "restricted_roles")
            }
            merged["options"] = mon.body["options"]
            # Fields sent replace the stored ones; options are replaced as a whole (defaults re-applied), as recorded.
            merged.update({k: v for k, v in body.items() if k != "options" or v is not None})
            fields, parsed = _validated(merged, monitor_id)
            if fields["query"] != mon.body["query"]:
                mon.groups.clear()
                mon.pending.clear()
            mon.body.update(fields)
            mon.parsed = parsed
            mon.body["modified"] = self.ctx.clock.now_dt().isoformat()
            self._overall(mon, self.ctx.clock.now())
            out = self._json(mon, None)
        return json_response(out)

    def _delete(self, request: Request, monitor_id: int) -> Response:
        with self.ctx.lock:
            self._find(monitor_id)
            del self._monitors[monitor_id]
        return json_response({"deleted_monitor_id": monitor_id})

    def _validate(self, request: Request) -> Response:
        _validated(json_object(request), None)
        return json_response({})

    def _validate_existing(self, request: Request, monitor_id: int) -> Response:
        with self.ctx.lock:
            self._find(monitor_id)
        _validated(json_object(request), monitor_id)
        return json_response({})

    def _can_delete(self, request: Request) -> Response:
        raw = request.args.getlist("monitor_ids")
        try:
            ids = [int(p) for r in raw for p in r.split(",") if p.strip()]
        except ValueError:
            raise ApiError(400, "Invalid parameter monitor_ids: expected integers") from None
        if not ids:
            raise ApiError(400, "Missing required parameter: monitor_ids")
        with self.ctx.lock:
            ok = [i for i in ids if i in self._monitors]
            errors = {str(i): ["Monitor not found"] for i in ids if i not in self._monitors}
        # Nothing in the sandbox references monitors (no SLOs, composites), so every existing one can go.
        return json_response({"data": {"ok": ok}, "errors": errors or None})

    def _find(self, monitor_id: int) -> _Monitor:
        mon = self._monitors.get(monitor_id)
        if mon is None:
            raise ApiError(404, "Monitor not found")
        return mon

    def _json(self, mon: _Monitor, states: frozenset[str] | str | None) -> dict[str, Any]:
        out = {**mon.body, "options": _copy(mon.body["options"]), "tags": list(mon.body["tags"])}
        if states is not None:
            wanted = None if states == "all" or (isinstance(states, frozenset) and "all" in states) else states
            groups = {}
            for key, g in sorted(mon.groups.items()):
                if wanted is not None and g.status not in {_GROUP_STATE_FILTERS[s] for s in wanted}:
                    continue
                name = ",".join(key) or "*"
                groups[name] = {
                    "name": name,
                    "status": g.status,
                    "last_triggered_ts": g.last_triggered_ts,
                    "last_notified_ts": g.last_notified_ts,
                    "last_resolved_ts": g.last_resolved_ts,
                    "last_nodata_ts": g.last_nodata_ts,
                }
            out["state"] = {"groups": groups}
        return out

    # -- control endpoints ---------------------------------------------------------------------------------------

    def _evaluate_endpoint(self, request: Request) -> Response:
        body = json_body(request, required=False) or {}
        if not isinstance(body, dict):
            raise ApiError(400, 'body must be {} or {"monitor_id": <id>}')
        monitor_id = body.get("monitor_id")
        if monitor_id is not None and (isinstance(monitor_id, bool) or not isinstance(monitor_id, int)):
            raise ApiError(400, "monitor_id must be an integer")
        if monitor_id is not None:
            with self.ctx.lock:
                self._find(monitor_id)
        events = self.evaluate(monitor_id)
        return json_response({"evaluated_at": self.ctx.clock.now(), "events": events})

    def events(self) -> list[dict[str, Any]]:
        """The recent notification events, oldest first (copies: the caller may keep them)."""
        with self.ctx.lock:
            return [dict(e) for e in self._events]

    def _events_endpoint(self, request: Request) -> Response:
        monitor_id = query_int(request, "monitor_id", None)
        with self.ctx.lock:
            events = [e for e in self._events if monitor_id is None or e["monitor_id"] == monitor_id]
        return json_response({"events": events})

    # -- evaluation ----------------------------------------------------------------------------------------------

    def _on_clock(self, now: float) -> None:
        try:
            self.evaluate()
        except Exception:  # a listener must not break the clock for everyone else
            log.exception("monitor evaluation failed after a clock advance")

    def _tick(self, interval_s: float) -> None:
        while not self._ticker_stop.wait(interval_s):
            try:
                self.evaluate()
            except Exception:
                log.exception("background monitor evaluation failed")

    def _evaluate(self, mon: _Monitor, now: float) -> list[_Notice]:
        parsed = mon.parsed
        assert parsed is not None
        opts = mon.body["options"]
        end = now - float(opts.get("evaluation_delay") or 0)
        start = end - parsed.window_s
        step = pick_interval(parsed.window_s, parsed.metric.rollup_seconds)
        try:
            results = self.metrics.query_series(parsed.metric.text, start, end, step)
        except QueryError:
            log.warning("monitor %s: query can no longer be evaluated", mon.body["id"])
            return []
        notices: list[_Notice] = []
        seen: set[tuple[str, ...]] = set()
        for series in results:
            key = series.group_tags
            seen.add(key)
            group = mon.groups.get(key)
            if group is None:
                first = min(mon.pending.get(key, math.inf), series.points[0][0])
                mon.pending[key] = first
                if now - first < _new_group_delay(opts, key):
                    continue  # still a new group: Datadog skips it for new_group_delay seconds
            # A window counts as full when data starts within one reporting gap of its start (at most a minute).
            if opts.get("require_full_window") and series.points[0][0] > start + max(
                step, min(60, parsed.window_s / 4)
            ):
                continue
            value = reduce_points(series.points, parsed.time_agg, step)
            if value is None:
                continue
            if group is None:
                group = mon.groups[key] = _Group(status="", first_seen=mon.pending.pop(key, now))
            status = _classify(value, group.status, parsed, opts.get("thresholds") or {})
            group.value = value
            group.last_data = now
            notices.extend(self._transition(mon, key, group, status, now))
        for key, group in mon.groups.items():
            if key not in seen:
                notices.extend(self._missing(mon, key, group, now))
        self._overall(mon, now)
        return notices

    def _missing(self, mon: _Monitor, key: tuple[str, ...], group: _Group, now: float) -> list[_Notice]:
        opts = mon.body["options"]
        policy = opts.get("on_missing_data") or "default"
        group.value = None
        if policy == "resolve":
            return self._transition(mon, key, group, OK, now)
        timeout_h = opts.get("timeout_h")
        if timeout_h and group.status not in {"", OK} and now - group.last_data >= timeout_h * 3600:
            # Datadog auto-resolves a triggered group that has not reported for timeout_h hours.
            return self._transition(mon, key, group, OK, now)
        if policy in {"show_no_data", "show_and_notify_no_data"} or opts.get("notify_no_data"):
            return self._transition(mon, key, group, NO_DATA, now)
        return []

    def _transition(self, mon: _Monitor, key: tuple[str, ...], group: _Group, status: str, now: float) -> list[_Notice]:
        prev = group.status
        transition = _transition_name(prev, status, group)
        ts = int(now)
        if transition is None:
            if prev == status and self._renotify_due(mon, group, now):
                transition = "Re-No Data" if status == NO_DATA else "Renotify"
            else:
                group.status = status
                return []
        if status in {ALERT, WARN, NO_DATA} and prev in {"", OK}:
            group.cycle_key = uuid.uuid4().hex
            group.cycle_alerted = False
        cycle_key = group.cycle_key or uuid.uuid4().hex
        if status == ALERT:
            group.cycle_alerted = True
            if transition != "Renotify":
                group.last_triggered_ts = ts
        elif status == NO_DATA:
            group.last_nodata_ts = ts
        elif status == OK:
            group.last_resolved_ts = ts
            group.cycle_key = None
        group.status = status
        notify = self._should_notify(mon, prev, status)
        if notify:
            group.last_notified_ts = ts
        return [
            self._notice(
                mon,
                key=key,
                group=group,
                prev=prev,
                status=status,
                transition=transition,
                cycle_key=cycle_key,
                notify=notify,
                now=now,
            )
        ]

    def _renotify_due(self, mon: _Monitor, group: _Group, now: float) -> bool:
        opts = mon.body["options"]
        interval = opts.get("renotify_interval")
        if not interval or group.status == OK:
            return False
        statuses = opts.get("renotify_statuses") or ["alert", "no data"]
        if group.status not in {_RENOTIFY_STATUSES[s] for s in statuses if s in _RENOTIFY_STATUSES}:
            return False
        if group.status == NO_DATA and not self._should_notify(mon, NO_DATA, NO_DATA):
            return False
        return group.last_notified_ts > 0 and now - group.last_notified_ts >= interval * 60

    @staticmethod
    def _should_notify(mon: _Monitor, prev: str, status: str) -> bool:
        opts = mon.body["options"]
        notify_no_data = bool(opts.get("notify_no_data")) or opts.get("on_missing_data") == "show_and_notify_no_data"
        if status == NO_DATA or (prev == NO_DATA and status == OK):
            return notify_no_data  # entering and leaving No Data is only news when no-data notifications are on
        return True

    def _overall(self, mon: _Monitor, now: float) -> None:
        states = [g.status for g in mon.groups.values() if g.status]
        overall = max(states, key=_SEVERITY.__getitem__) if states else NO_DATA
        if overall != mon.body["overall_state"]:
            mon.body["overall_state"] = overall
            mon.body["overall_state_modified"] = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")

    def _notice(
        self,
        mon: _Monitor,
        *,
        key: tuple[str, ...],
        group: _Group,
        prev: str,
        status: str,
        transition: str,
        cycle_key: str,
        notify: bool,
        now: float,
    ) -> _Notice:
        parsed = mon.parsed
        assert parsed is not None
        body = mon.body
        thresholds = body["options"].get("thresholds") or {}
        scope = ",".join(key)
        variables = _template_variables(key, group.value, thresholds, parsed)
        flags = {
            "is_alert": status == ALERT,
            "is_warning": status == WARN,
            "is_no_data": status == NO_DATA,
            "is_recovery": transition == "Recovered",
            "is_alert_recovery": transition == "Recovered" and prev == ALERT,
            "is_warning_recovery": transition == "Recovered" and prev == WARN,
            "is_no_data_recovery": transition == "Recovered" and prev == NO_DATA,
            "is_alert_to_warning": prev == ALERT and status == WARN,
            "is_renotify": transition in {"Renotify", "Re-No Data"},
        }
        message = render_template(str(body.get("message", "")), flags, variables)
        name = render_template(str(body.get("name", "")), flags, variables)
        title = f"[{transition}{f' on {{{scope}}}' if scope else ''}] {name}"
        self._event_seq += 1
        event_id = f"{int(now * 1000)}{self._event_seq:04d}"
        hooks = tuple(webhook_mentions(message)) if notify else ()
        tags = list(body.get("tags", []))
        if body["options"].get("include_tags", True):
            tags.extend(t for t in key if t not in tags)
        event = {
            "id": event_id,
            "at": now,
            "monitor_id": body["id"],
            "monitor_name": name,
            "group": scope or "*",
            "transition": transition,
            "from": prev or None,
            "to": status,
            "value": group.value,
            "threshold": thresholds.get("critical"),
            "title": title,
            "message": message,
            "notified": notify,
            "webhooks": list(hooks),
        }
        self._events.append(event)
        date_ms = str(int(now * 1000))
        out_vars = {
            "ALERT_ID": str(body["id"]),
            "ALERT_TITLE": title,
            "ALERT_TRANSITION": transition,
            "ALERT_SCOPE": scope,
            "ALERT_STATUS": _status_line(parsed, scope, status),
            "ALERT_QUERY": str(body["query"]),
            "ALERT_METRIC": parsed.metric.metric,
            "ALERT_TYPE": {ALERT: "error", WARN: "warning", OK: "success"}.get(status, "info"),
            "ALERT_PRIORITY": f"P{body['priority']}" if body.get("priority") else "",
            "ALERT_CYCLE_KEY": cycle_key,
            "AGGREG_KEY": hashlib.sha256(f"{body['id']}:{scope}".encode()).hexdigest()[:32],
            "EVENT_MSG": message,
            "EVENT_TITLE": title,
            "EVENT_TYPE": "query_alert_monitor",
            "DATE": date_ms,
            "LAST_UPDATED": date_ms,
            "ID": event_id,
            "LINK": f"{self.ctx.base_url}/monitors/{body['id']}",
            "TAGS": ",".join(tags),
            "HOSTNAME": next((t[5:] for t in key if t.startswith("host:")), ""),
            "ORG_ID": str(ORG_ID),
            "ORG_NAME": "gpufarm sandbox",
        }
        for tag in tags:
            k, sep, v = tag.partition(":")
            if sep:
                out_vars.setdefault(f"TAGS[{k}]", v)
        return _Notice(event, hooks, out_vars)

    def _fire(self, notice: _Notice) -> None:
        fire = getattr(self.webhooks, "fire", None)
        for name in notice.webhooks:
            if not callable(fire):
                log.warning("webhook %s not fired: the webhooks module has no fire()", name)
                continue
            try:
                fire(name, notice.variables, origin="monitor")
            except Exception:  # one bad webhook must not stop the other notifications
                log.exception("firing webhook %s for monitor %s failed", name, notice.event["monitor_id"])


def _new_group_delay(opts: Mapping[str, Any], key: tuple[str, ...]) -> float:
    """Seconds a new group is skipped: new_group_delay, and for groups naming a host the (deprecated, default
    300 s) new_host_delay as well, the longer of the two."""
    delay = float(opts.get("new_group_delay") or 0)
    if any(tag.startswith("host:") for tag in key):
        delay = max(delay, float(opts.get("new_host_delay") or 0))
    return delay


def _same_kind(mtype: str) -> str:
    return "query alert" if mtype == "metric alert" else mtype


def _transition_name(prev: str, status: str, group: _Group) -> str | None:
    if prev == status:
        return None
    if status == ALERT:
        return "Re-Triggered" if prev == WARN and group.cycle_alerted else "Triggered"
    if status == WARN:
        return "Re-Warn" if prev == ALERT else "Warn"
    if status == NO_DATA:
        return "No Data"
    return "Recovered" if prev else None  # a group first seen healthy is not news


def _classify(value: float, prev: str, parsed: MonitorQuery, thresholds: Mapping[str, Any]) -> str:
    cmp = _COMPARE[parsed.op]
    critical = thresholds.get("critical", parsed.threshold)
    crit_recovery = thresholds.get("critical_recovery")
    warning = thresholds.get("warning")
    warn_recovery = thresholds.get("warning_recovery")
    # With a recovery threshold, a group stays in its state until the value clears the recovery threshold too.
    if cmp(value, critical) or (prev == ALERT and crit_recovery is not None and cmp(value, crit_recovery)):
        return ALERT
    if warning is not None and (
        cmp(value, warning) or (prev == WARN and warn_recovery is not None and cmp(value, warn_recovery))
    ):
        return WARN
    return OK


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.6g}"


def _template_variables(
    key: tuple[str, ...], value: float | None, thresholds: Mapping[str, Any], parsed: MonitorQuery
) -> dict[str, str]:
    variables = {
        "value": _fmt(value),
        "threshold": _fmt(thresholds.get("critical", parsed.threshold)),
        "warn_threshold": _fmt(thresholds.get("warning")),
        "comparator": parsed.op,
    }
    for tag in key:
        k, _, v = tag.partition(":")
        variables[f"{k}.name"] = v
    return variables


def _status_line(parsed: MonitorQuery, scope: str, status: str) -> str:
    upward = parsed.op in {">", ">="}
    how = {
        "avg": "on average",
        "sum": "in total",
        "max": "at least once" if upward else "at all times",
        "min": "at all times" if upward else "at least once",
    }[parsed.time_agg]
    where = scope_for(parsed.metric.scope, scope.split(",") if scope else [])
    verb = "was" if status in {ALERT, WARN} else "was not"
    return f"{parsed.metric.metric} over {where} {verb} {parsed.op} {_fmt(parsed.threshold)} {how} during the last {parsed.window_text}."  # noqa: E501


# -- validation ------------------------------------------------------------------------------------------------------


def _validated(body: dict[str, Any], monitor_id: int | None) -> tuple[dict[str, Any], MonitorQuery | None]:
    """Check a create/update/validate body as Datadog does; returns the stored fields and the parsed query."""
    mtype = body.get("type")
    if not isinstance(mtype, str) or mtype not in MONITOR_TYPES:
        raise ApiError(400, "The value provided for parameter 'type' is invalid")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "The value provided for parameter 'query' is invalid: query is required")
    for key in ("name", "message"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ApiError(400, f"The value provided for parameter '{key}' is invalid: expected a string")
    tags = body.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ApiError(400, "The value provided for parameter 'tags' is invalid: expected a list of strings")
    priority = body.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= 5):
        raise ApiError(400, "The value provided for parameter 'priority' is invalid: expected 1 to 5")
    roles = body.get("restricted_roles")
    if roles is not None and (not isinstance(roles, list) or not all(isinstance(r, str) for r in roles)):
        raise ApiError(400, "The value provided for parameter 'restricted_roles' is invalid")
    options = body.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ApiError(400, "The value provided for parameter 'options' is invalid: expected an object")
    stored_type = "query alert" if mtype == "metric alert" else mtype
    parsed: MonitorQuery | None = None
    if mtype in EVALUATED_TYPES:
        parsed = parse_monitor_query(query)
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


def _default_name(query: str, parsed: MonitorQuery | None) -> str:
    if parsed is None:
        return query
    return f"{parsed.metric.metric} {parsed.op} {_fmt(parsed.threshold)} on {parsed.metric.scope}"


def _validated_options(options: dict[str, Any], parsed: MonitorQuery | None, query: str) -> dict[str, Any]:
    opts: dict[str, Any] = _copy(options)
    for key in ("notify_no_data", "notify_audit", "include_tags", "require_full_window", "locked"):
        if opts.get(key) is not None and not isinstance(opts[key], bool):
            raise ApiError(400, f"The value provided for parameter '{key}' is invalid: expected a boolean")
    for key in ("renotify_interval", "new_group_delay", "new_host_delay", "evaluation_delay", "no_data_timeframe",
                "timeout_h", "renotify_occurrences"):  # fmt: skip
        value = opts.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OPTION
        ):
            raise ApiError(
                400, f"The value provided for parameter '{key}' is invalid: expected an integer 0-{MAX_OPTION}"
            )
    if opts.get("on_missing_data") is not None and opts["on_missing_data"] not in _ON_MISSING:
        raise ApiError(400, "The value provided for parameter 'on_missing_data' is invalid")
    statuses = opts.get("renotify_statuses")
    if statuses is not None and (not isinstance(statuses, list) or not set(statuses) <= set(_RENOTIFY_STATUSES)):
        raise ApiError(400, "The value provided for parameter 'renotify_statuses' is invalid: alert, warn, no data")
    for key in ("notify_by",):
        if opts.get(key) is not None and (
            not isinstance(opts[key], list) or not all(isinstance(v, str) for v in opts[key])
        ):
            raise ApiError(400, f"The value provided for parameter '{key}' is invalid: expected a list of strings")
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


def _validated_thresholds(raw: Any, parsed: MonitorQuery | None, query: str) -> dict[str, float]:
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
        number = _finite(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if number is None:
            raise ApiError(400, f"The value provided for parameter 'thresholds.{key}' is invalid: expected a number")
        out[key] = number
    match = _TRAILING_OP.search(query)
    if match is None:
        return out
    op, threshold = match.group(1), _finite(match.group(2))
    if threshold is None:
        raise _invalid_query(f"threshold {match.group(2)[:20]} is not a finite number")
    if parsed is None and "critical" not in out:
        return out  # non-metric monitors keep the thresholds they were given (none, as recorded)
    critical = out.setdefault("critical", threshold)
    if parsed is not None and critical != threshold:
        raise _invalid_query(
            f"Alert threshold ({_fmt(critical)}) does not match that used in the query ({_fmt(threshold)})."
        )
    below = op in {"<", "<="}
    relation = "greater" if below else "less"

    def beyond(a: float, b: float) -> bool:  # is `a` on the healthy side of `b`?
        return a > b if below else a < b

    warning = out.get("warning")
    if warning is not None and op in {"<", "<=", ">", ">="} and not beyond(warning, critical):
        raise ApiError(400, f"Warning threshold ({_fmt(warning)}) must be {relation} than the alert threshold "
                            f"({_fmt(critical)}) for the '{op}' comparator.")  # fmt: skip
    recovery = out.get("critical_recovery")
    if recovery is not None and op in {"<", "<=", ">", ">="} and not beyond(recovery, critical):
        raise ApiError(400, f"Alert recovery threshold ({_fmt(recovery)}) must be {relation} than the alert "
                            f"threshold ({_fmt(critical)}).")  # fmt: skip
    warn_recovery = out.get("warning_recovery")
    if warn_recovery is not None and warning is not None and not beyond(warn_recovery, warning):
        raise ApiError(400, f"Warning recovery threshold ({_fmt(warn_recovery)}) must be {relation} than the warning "
                            f"threshold ({_fmt(warning)}).")  # fmt: skip
    return out


# -- small helpers ---------------------------------------------------------------------------------------------------


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def _csv(raw: str | None) -> list[str]:
    return [p.strip().lower() for p in (raw or "").split(",") if p.strip()]


def _scope_tags(mon: _Monitor) -> set[str]:
    if mon.parsed is None:
        return set()
    return {t.strip().lower() for t in mon.parsed.metric.scope.split(",")}


def _bool_arg(request: Request, name: str) -> bool:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return False
    if raw.lower() not in {"true", "false"}:
        raise ApiError(400, f"Invalid parameter {name}: expected true or false")
    return raw.lower() == "true"


def _group_states_arg(request: Request) -> frozenset[str] | None:
    raw = request.args.get("group_states")
    if raw is None:
        return None
    states = frozenset(p.strip().lower() for p in raw.split(",") if p.strip())
    if not states or not states <= set(_GROUP_STATE_FILTERS):
        raise ApiError(400, "Invalid group_state filters.")
    return states
