"""Sandbox module: the Datadog Monitor API (v1 CRUD, validate, can_delete) and the evaluation control endpoints.

Bodies are checked as Datadog checks them (`monitor_validation`); `query alert` / `metric alert` monitors are also
evaluated on the sandbox clock by `monitor_evaluator`, which this module drives (clock advances,
`POST /_sandbox/monitors/evaluate`, and a background tick when started). Other monitor types are stored and answered
as Datadog answers them, but not evaluated.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.metrics import MetricsModule
from gpufarm_sandbox.emulator.monitor_evaluator import MonitorEvaluator
from gpufarm_sandbox.emulator.monitor_state import ALERT, NO_DATA, ORG_ID, WARN, StoredMonitor, update_overall
from gpufarm_sandbox.emulator.monitor_validation import WindowGrammar, json_copy, validated
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_body, json_object, json_response, query_int
from gpufarm_sandbox.emulator.webhooks import WebhooksModule

log = logging.getLogger("gpufarm_sandbox.emulator.monitors")

_GROUP_STATE_FILTERS = {"all": None, "alert": ALERT, "warn": WARN, "no data": NO_DATA}
_FIRST_ID = 100_000_001
CREATOR = {"name": None, "handle": "sandbox@gpufarm.local", "email": "sandbox@gpufarm.local", "id": 1}


class MonitorsModule(BaseModule):
    """Monitor CRUD, validation, evaluation on the sandbox clock and the evaluation log."""

    name = "monitors"

    def __init__(self, context: SandboxContext, metrics: MetricsModule, webhooks: WebhooksModule) -> None:
        super().__init__(context)
        self.evaluator = MonitorEvaluator(context, metrics, webhooks)
        self._monitors: dict[int, StoredMonitor] = {}
        self._next_id = _FIRST_ID
        # Which documented window grammar create, update and validate check (`/_sandbox/monitors/windows`).
        self.windows = WindowGrammar.FIXED
        self._ticker: threading.Thread | None = None
        self._ticker_stop = threading.Event()
        context.clock.subscribe(self._on_clock)

    # -- public API ----------------------------------------------------------------------------------------------

    def evaluate(self, monitor_id: int | None = None) -> list[dict[str, Any]]:
        """Evaluate every evaluable monitor (or one) at the sandbox's now; returns the transition events logged."""
        return self.evaluator.evaluate(self._monitors, monitor_id)

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
            Route("/_sandbox/monitors/windows", ("GET",), self._windows_get, Auth.NONE),
            Route("/_sandbox/monitors/windows", ("POST",), self._windows_post, Auth.NONE),
        ]

    def reset(self) -> None:
        """Forget every monitor and the evaluation log."""
        with self.ctx.lock:
            self._monitors.clear()
            self._next_id = _FIRST_ID
            self.windows = WindowGrammar.FIXED
            self.evaluator.reset()

    def dump(self) -> dict[str, Any]:
        """Monitors with their group states, and the size of the evaluation log."""
        with self.ctx.lock:
            return {
                "monitors": [self._json(m, "all") for _, m in sorted(self._monitors.items())],
                "events": self.evaluator.logged(),
            }

    # -- CRUD ----------------------------------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = json_object(request)
        fields, parsed = validated(body, None, self.windows)
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
            mon = StoredMonitor(record, parsed)
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
            fields, parsed = validated(merged, monitor_id, self.windows)
            if fields["query"] != mon.body["query"]:
                mon.groups.clear()
                mon.pending.clear()
            mon.body.update(fields)
            mon.parsed = parsed
            mon.body["modified"] = self.ctx.clock.now_dt().isoformat()
            update_overall(mon, self.ctx.clock.now())
            out = self._json(mon, None)
        return json_response(out)

    def _delete(self, request: Request, monitor_id: int) -> Response:
        with self.ctx.lock:
            self._find(monitor_id)
            del self._monitors[monitor_id]
        return json_response({"deleted_monitor_id": monitor_id})

    def _validate(self, request: Request) -> Response:
        # The very checks create makes, so what validate accepts create takes and what it refuses create refuses.
        validated(json_object(request), None, self.windows)
        return json_response({})

    def _validate_existing(self, request: Request, monitor_id: int) -> Response:
        with self.ctx.lock:
            self._find(monitor_id)
        validated(json_object(request), monitor_id, self.windows)
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

    def _find(self, monitor_id: int) -> StoredMonitor:
        mon = self._monitors.get(monitor_id)
        if mon is None:
            raise ApiError(404, "Monitor not found")
        return mon

    def _json(self, mon: StoredMonitor, states: frozenset[str] | str | None) -> dict[str, Any]:
        out = {**mon.body, "options": json_copy(mon.body["options"]), "tags": list(mon.body["tags"])}
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

    def _windows_get(self, request: Request) -> Response:
        return json_response({"grammar": self.windows.value})

    def _windows_post(self, request: Request) -> Response:
        """`{"grammar": "fixed" | "ranges"}`: the window grammar Datadog's reference documented then or now."""
        grammar = json_object(request).get("grammar")
        choices = [g.value for g in WindowGrammar]
        if grammar not in choices:
            raise ApiError(400, f"grammar must be one of {', '.join(choices)}")
        self.windows = WindowGrammar(str(grammar))
        return json_response({"grammar": self.windows.value})

    def _events_endpoint(self, request: Request) -> Response:
        monitor_id = query_int(request, "monitor_id", None)
        return json_response({"events": self.evaluator.events(monitor_id)})

    # -- evaluation triggers --------------------------------------------------------------------------------------

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


def _same_kind(mtype: str) -> str:
    return "query alert" if mtype == "metric alert" else mtype


# -- small helpers ---------------------------------------------------------------------------------------------------


def _csv(raw: str | None) -> list[str]:
    return [p.strip().lower() for p in (raw or "").split(",") if p.strip()]


def _scope_tags(mon: StoredMonitor) -> set[str]:
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
