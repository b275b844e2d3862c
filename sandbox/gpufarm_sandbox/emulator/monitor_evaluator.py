"""Evaluation of metric monitors on the sandbox clock, and the notifications it fires.

`query alert` / `metric alert` monitors are evaluated over the sandbox's stored points whenever the sandbox clock
advances, on `POST /_sandbox/monitors/evaluate`, and, when started, on a background tick (the Monitor API, `monitors`,
drives it). Each group keeps its own state (OK / Warn / Alert / No Data); a transition renders the monitor's message
template and fires every `@webhook-<name>` it mentions with Datadog's `$ALERT_*` variables, and is kept in the
evaluation log.
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.monitor_messages import render_template, status_line, template_variables, webhook_mentions
from gpufarm_sandbox.emulator.monitor_state import (
    ALERT,
    NO_DATA,
    OK,
    ORG_ID,
    WARN,
    GroupState,
    StoredMonitor,
    update_overall,
)
from gpufarm_sandbox.emulator.monitor_validation import MonitorQuery
from gpufarm_sandbox.emulator.query import QueryError, pick_interval, reduce_points
from gpufarm_sandbox.emulator.webhooks import WebhooksModule

log = logging.getLogger("gpufarm_sandbox.emulator.monitors")

EVENT_LOG_SIZE = 5000
# renotify_statuses option values and the group states they name.
_RENOTIFY_STATUSES = {"alert": ALERT, "warn": WARN, "no data": NO_DATA}
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "==": lambda v, t: v == t,
    "!=": lambda v, t: v != t,
}


@dataclass(frozen=True)
class _Notice:
    """A transition to announce once the lock is released."""

    event: dict[str, Any]
    webhooks: tuple[str, ...]
    variables: dict[str, str]


class MonitorEvaluator:
    """Evaluates stored monitors over the metrics module's points and fires their webhooks; keeps the log."""

    def __init__(self, context: SandboxContext, metrics: MetricsModule, webhooks: WebhooksModule) -> None:
        self.ctx = context
        self.metrics = metrics
        self.webhooks = webhooks
        self._events: deque[dict[str, Any]] = deque(maxlen=EVENT_LOG_SIZE)
        self._event_seq = 0

    def evaluate(self, monitors: Mapping[int, StoredMonitor], monitor_id: int | None = None) -> list[dict[str, Any]]:
        """Evaluate every evaluable monitor (or one) at the sandbox's now; returns the transition events logged."""
        notices: list[_Notice] = []
        with self.ctx.lock:
            now = self.ctx.clock.now()
            for mid, mon in sorted(monitors.items()):
                if mon.parsed is not None and (monitor_id is None or mid == monitor_id):
                    notices.extend(self._evaluate(mon, now))
        # Webhook delivery may be slow or call back into the sandbox: never hold the lock while firing.
        for notice in notices:
            self._fire(notice)
        return [n.event for n in notices]

    def reset(self) -> None:
        """Forget the evaluation log."""
        with self.ctx.lock:
            self._events.clear()
            self._event_seq = 0

    def logged(self) -> int:
        """How many events the evaluation log holds."""
        with self.ctx.lock:
            return len(self._events)

    def events(self, monitor_id: int | None = None) -> list[dict[str, Any]]:
        """The recent notification events (of one monitor, or all), oldest first (copies: the caller may keep them)."""
        with self.ctx.lock:
            return [dict(e) for e in self._events if monitor_id is None or e["monitor_id"] == monitor_id]

    def _evaluate(self, mon: StoredMonitor, now: float) -> list[_Notice]:
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
                group = mon.groups[key] = GroupState(status="", first_seen=mon.pending.pop(key, now))
            status = _classify(value, group.status, parsed, opts.get("thresholds") or {})
            group.value = value
            group.last_data = now
            notices.extend(self._transition(mon, key, group, status, now))
        for key, group in mon.groups.items():
            if key not in seen:
                notices.extend(self._missing(mon, key, group, now))
        update_overall(mon, now)
        return notices

    def _missing(self, mon: StoredMonitor, key: tuple[str, ...], group: GroupState, now: float) -> list[_Notice]:
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

    def _transition(
        self, mon: StoredMonitor, key: tuple[str, ...], group: GroupState, status: str, now: float
    ) -> list[_Notice]:
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

    def _renotify_due(self, mon: StoredMonitor, group: GroupState, now: float) -> bool:
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
    def _should_notify(mon: StoredMonitor, prev: str, status: str) -> bool:
        opts = mon.body["options"]
        notify_no_data = bool(opts.get("notify_no_data")) or opts.get("on_missing_data") == "show_and_notify_no_data"
        if status == NO_DATA or (prev == NO_DATA and status == OK):
            return notify_no_data  # entering and leaving No Data is only news when no-data notifications are on
        return True

    def _notice(
        self,
        mon: StoredMonitor,
        *,
        key: tuple[str, ...],
        group: GroupState,
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
        variables = template_variables(key, group.value, thresholds, parsed)
        flags = _flags(prev, status, transition)
        message = render_template(str(body.get("message", "")), flags, variables)
        name = render_template(str(body.get("name", "")), flags, variables)
        title = f"[{transition}{f' on {{{scope}}}' if scope else ''}] {name}"
        self._event_seq += 1
        event_id = f"{int(now * 1000)}{self._event_seq:04d}"
        hooks = tuple(webhook_mentions(message)) if notify else ()
        tags = _event_tags(body, key)
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
        out_vars = self._alert_variables(mon, event, key, tags, cycle_key)
        return _Notice(event, hooks, out_vars)

    def _alert_variables(
        self, mon: StoredMonitor, event: dict[str, Any], key: tuple[str, ...], tags: list[str], cycle_key: str
    ) -> dict[str, str]:
        """Datadog's `$ALERT_*`, `$EVENT_*` and `$TAGS` variables of a notification, for the webhooks it fires."""
        parsed = mon.parsed
        assert parsed is not None
        body = mon.body
        scope, status, title = ",".join(key), event["to"], event["title"]
        date_ms = str(int(event["at"] * 1000))
        out_vars = {
            "ALERT_ID": str(body["id"]),
            "ALERT_TITLE": title,
            "ALERT_TRANSITION": event["transition"],
            "ALERT_SCOPE": scope,
            "ALERT_STATUS": status_line(parsed, scope, status),
            "ALERT_QUERY": str(body["query"]),
            "ALERT_METRIC": parsed.metric.metric,
            "ALERT_TYPE": {ALERT: "error", WARN: "warning", OK: "success"}.get(status, "info"),
            "ALERT_PRIORITY": f"P{body['priority']}" if body.get("priority") else "",
            "ALERT_CYCLE_KEY": cycle_key,
            "AGGREG_KEY": hashlib.sha256(f"{body['id']}:{scope}".encode()).hexdigest()[:32],
            "EVENT_MSG": event["message"],
            "EVENT_TITLE": title,
            "EVENT_TYPE": "query_alert_monitor",
            "DATE": date_ms,
            "LAST_UPDATED": date_ms,
            "ID": event["id"],
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
        return out_vars

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


def _flags(prev: str, status: str, transition: str) -> dict[str, bool]:
    """The `{{#is_...}}` conditions of a message template for one transition."""
    recovered = transition == "Recovered"
    return {
        "is_alert": status == ALERT,
        "is_warning": status == WARN,
        "is_no_data": status == NO_DATA,
        "is_recovery": recovered,
        "is_alert_recovery": recovered and prev == ALERT,
        "is_warning_recovery": recovered and prev == WARN,
        "is_no_data_recovery": recovered and prev == NO_DATA,
        "is_alert_to_warning": prev == ALERT and status == WARN,
        "is_renotify": transition in {"Renotify", "Re-No Data"},
    }


def _event_tags(body: dict[str, Any], key: tuple[str, ...]) -> list[str]:
    """The monitor's tags, and (include_tags) the group's."""
    tags = list(body.get("tags", []))
    if body["options"].get("include_tags", True):
        tags.extend(t for t in key if t not in tags)
    return tags


def _new_group_delay(opts: Mapping[str, Any], key: tuple[str, ...]) -> float:
    """Seconds a new group is skipped: new_group_delay, and for groups naming a host the (deprecated, default
    300 s) new_host_delay as well, the longer of the two."""
    delay = float(opts.get("new_group_delay") or 0)
    if any(tag.startswith("host:") for tag in key):
        delay = max(delay, float(opts.get("new_host_delay") or 0))
    return delay


def _transition_name(prev: str, status: str, group: GroupState) -> str | None:
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
