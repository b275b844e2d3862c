"""Sandbox module: the event stream (Datadog API v1 events: `POST /api/v1/events`, `GET /api/v1/events[/<id>]`).

gpufarm's sync posts one event per inventory source it skipped. A body is accepted as Datadog accepts it: it must
be what datadog-api-client's `EventCreateRequest` model takes with type checks on (title and text required, text at
most 4,000 characters, aggregation key at most 100, a known alert type and priority), and `date_happened` no older
than 18 hours on the sandbox clock; the answer is Datadog's 202 with the stored event. Posting needs the API key
only, reading the application key too, as in Datadog. The stream keeps the newest MAX_EVENTS events.

Reading: `GET /api/v1/events?start=<epoch>&end=<epoch>` (both required), optionally `tags=a:b,c:d` (every one must
be on the event) and `sources=gpufarm`; newest first, as Datadog answers.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.client_models import offline_client
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import ApiError, Auth, Route, json_object, json_response

MAX_EVENTS = 5000
MAX_TEXT = 4000
MAX_AGGREGATION_KEY = 100
MAX_TITLE = 500
MAX_TAGS = 100
MAX_AGE_S = 18 * 3600
ALERT_TYPES = ("error", "warning", "info", "success", "user_update", "recommendation", "snapshot")
PRIORITIES = ("normal", "low")


class EventsModule(BaseModule):
    """The sandbox's event stream."""

    name = "events"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._ids = itertools.count(1)

    def routes(self) -> list[Route]:
        """Post an event (API key), list and read them (API and application keys)."""
        return [
            Route("/api/v1/events", ("POST",), self._post, Auth.DD_API),
            Route("/api/v1/events", ("GET",), self._list),
            Route("/api/v1/events/<int:event_id>", ("GET",), self._get),
        ]

    def reset(self) -> None:
        """Forget every event."""
        self._events.clear()
        self._ids = itertools.count(1)

    def dump(self) -> dict[str, Any]:
        """The stream, oldest first."""
        return {"events": [dict(e) for e in self._events]}

    def events(self) -> list[dict[str, Any]]:
        """Copies of the stored events, oldest first."""
        with self.ctx.lock:
            return [dict(e) for e in self._events]

    # -- handlers -------------------------------------------------------------------------------------

    def _post(self, request: Request) -> Response:
        body = _validated(json_object(request))
        now = int(self.ctx.clock.now())
        happened = body.get("date_happened", now)
        if not now - MAX_AGE_S <= happened <= now + 3600:
            raise ApiError(400, "Invalid date_happened: events must be no older than 18 hours")
        with self.ctx.lock:
            event_id = next(self._ids)
            event = {
                "id": event_id,
                "id_str": str(event_id),
                "title": body["title"],
                "text": body["text"],
                "date_happened": happened,
                "alert_type": body.get("alert_type", "info"),
                "priority": body.get("priority") or "normal",
                "tags": list(body.get("tags", [])),
                "aggregation_key": body.get("aggregation_key"),
                "source_type_name": body.get("source_type_name"),
                "host": body.get("host"),
                "url": f"/event/event?id={event_id}",
            }
            self._events.append(event)
        return json_response({"status": "ok", "event": _public(event)}, status=202)

    def _list(self, request: Request) -> Response:
        start, end = _epoch(request, "start"), _epoch(request, "end")
        wanted = [t.strip().lower() for t in request.args.get("tags", "").split(",") if t.strip()]
        sources = {s.strip().lower() for s in request.args.get("sources", "").split(",") if s.strip()}
        with self.ctx.lock:
            found = [
                _public(e)
                for e in reversed(self._events)
                if start <= e["date_happened"] <= end
                and all(t in e["tags"] for t in wanted)
                and (not sources or str(e["source_type_name"] or "").lower() in sources)
            ]
        return json_response({"events": found, "status": "ok"})

    def _get(self, request: Request, event_id: int) -> Response:
        with self.ctx.lock:
            event = next((e for e in self._events if e["id"] == event_id), None)
        if event is None:
            raise ApiError(404, "Event not found")
        return json_response({"event": _public(event), "status": "ok"})


def _public(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if v is not None}


def _epoch(request: Request, key: str) -> int:
    raw = request.args.get(key, "")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        raise ApiError(400, f"Invalid or missing parameter '{key}': a POSIX timestamp is required")
    return int(raw)


def _validated(body: dict[str, Any]) -> dict[str, Any]:
    """The body as Datadog's EventCreateRequest takes it; ApiError(400) otherwise."""
    _model_check(body)
    title, text = body.get("title"), body.get("text")
    if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE:
        raise ApiError(400, f"Invalid title: required, at most {MAX_TITLE} characters")
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ApiError(400, f"Invalid text: required, at most {MAX_TEXT} characters")
    _check_kind(body)
    tags = body.get("tags", [])
    if not isinstance(tags, list) or len(tags) > MAX_TAGS or not all(isinstance(t, str) and t for t in tags):
        raise ApiError(400, f"Invalid tags: a list of at most {MAX_TAGS} non-empty strings")
    happened = body.get("date_happened")
    if happened is not None and (isinstance(happened, bool) or not isinstance(happened, int)):
        raise ApiError(400, "Invalid date_happened: an integer POSIX timestamp")
    return body


def _check_kind(body: dict[str, Any]) -> None:
    """aggregation_key, alert_type and priority."""
    key = body.get("aggregation_key")
    if key is not None and (not isinstance(key, str) or len(key) > MAX_AGGREGATION_KEY):
        raise ApiError(400, f"Invalid aggregation_key: at most {MAX_AGGREGATION_KEY} characters")
    if body.get("alert_type", "info") not in ALERT_TYPES:
        raise ApiError(400, f"Invalid alert_type: one of {', '.join(ALERT_TYPES)}")
    if body.get("priority") not in (None, *PRIORITIES):
        raise ApiError(400, f"Invalid priority: one of {', '.join(PRIORITIES)}")


def _model_check(body: dict[str, Any]) -> None:
    from datadog_api_client.exceptions import OpenApiException
    from datadog_api_client.v1.model.event_create_request import EventCreateRequest

    try:
        offline_client().deserialize(json.dumps(body), (EventCreateRequest,), True)
    except (OpenApiException, TypeError, ValueError) as exc:
        raise ApiError(400, f"Invalid event: {str(exc)[:200]}") from None
