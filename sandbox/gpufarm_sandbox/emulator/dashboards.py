"""Sandbox module: Datadog Dashboards v1 (create, get, update, delete, list, bulk delete and restore).

A body is accepted only if datadog-api-client's own `Dashboard` model takes it with type checks on and nothing
`_unparsed` (docs/datadog.md, "Validating JSON with the client's own models"), so whatever the sandbox
stores, every client can read back. Widgets are kept verbatim; each gets an `id` as Datadog assigns one.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import re
import string
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.client_models import offline_client
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import ApiError, Route, empty_response, json_object, json_response, query_int

API = "/api/v1/dashboard"
AUTHOR_HANDLE = "sandbox@gpufarm.local"
LAYOUT_TYPES = ("ordered", "free")
LIST_MAX = 100
_SERVER_KEYS = ("id", "url", "created_at", "modified_at", "author_handle", "author_name", "deleted_at")
_ID_CHARS = string.ascii_lowercase + string.digits


class DashboardsModule(BaseModule):
    """Dashboards API of the sandbox."""

    name = "dashboards"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self._dashboards: dict[str, dict[str, Any]] = {}
        # Ids only need to be unique and Datadog-shaped, not unpredictable.
        self._rng = random.Random()
        self._widget_ids = 1

    # -- module protocol ----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """CRUD, list, bulk delete and restore."""
        return [
            Route(API, ("POST",), self._create),
            Route(API, ("GET",), self._list),
            Route(API, ("DELETE",), self._bulk_delete),
            Route(API, ("PATCH",), self._restore),
            Route(f"{API}/<dashboard_id>", ("GET",), self._get),
            Route(f"{API}/<dashboard_id>", ("PUT",), self._update),
            Route(f"{API}/<dashboard_id>", ("DELETE",), self._delete),
        ]

    def reset(self) -> None:
        """Forget every dashboard."""
        self._dashboards.clear()
        self._widget_ids = 1

    def dump(self) -> dict[str, Any]:
        """Id, title, widget count and deletion time of every dashboard."""
        return {
            "dashboards": [
                {
                    "id": d["id"],
                    "title": d["title"],
                    "widgets": len(d["widgets"]),
                    "deleted_at": d.get("deleted_at"),
                }
                for d in self._dashboards.values()
            ]
        }

    def live(self) -> list[dict[str, Any]]:
        """Copies of every dashboard not deleted, as GET answers them (the local dashboard pages read these)."""
        with self.ctx.lock:
            return [_view(copy.deepcopy(d)) for d in self._dashboards.values() if not d.get("deleted_at")]

    # -- handlers -------------------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = _validated(json_object(request))
        with self.ctx.lock:
            now = _now_iso(self.ctx.clock.now_dt())
            dashboard_id = self._new_id()
            dashboard = self._stored(body, dashboard_id, created_at=now, modified_at=now)
            self._dashboards[dashboard_id] = dashboard
            return json_response(_view(dashboard))

    def _get(self, request: Request, dashboard_id: str) -> Response:
        with self.ctx.lock:
            return json_response(_view(self._live(dashboard_id)))

    def _update(self, request: Request, dashboard_id: str) -> Response:
        body = _validated(json_object(request))
        with self.ctx.lock:
            current = self._live(dashboard_id)
            now = _now_iso(self.ctx.clock.now_dt())
            dashboard = self._stored(body, dashboard_id, created_at=current["created_at"], modified_at=now)
            self._dashboards[dashboard_id] = dashboard
            return json_response(_view(dashboard))

    def _delete(self, request: Request, dashboard_id: str) -> Response:
        with self.ctx.lock:
            dashboard = self._live(dashboard_id)
            # Deleted dashboards are kept for `filter[deleted]` and restore, as Datadog does.
            dashboard["deleted_at"] = _now_iso(self.ctx.clock.now_dt())
        return json_response({"deleted_dashboard_id": dashboard_id})

    def _list(self, request: Request) -> Response:
        shared = _query_bool(request, "filter[shared]")
        deleted = _query_bool(request, "filter[deleted]")
        if shared and deleted:
            raise ApiError(400, "filter[shared] and filter[deleted] cannot be combined")
        count = query_int(request, "count", LIST_MAX, minimum=0, maximum=LIST_MAX)
        start = query_int(request, "start", 0) or 0
        with self.ctx.lock:
            # The sandbox has no shared dashboards, so filter[shared]=true lists nothing.
            chosen = [] if shared else [d for d in self._dashboards.values() if bool(d.get("deleted_at")) == deleted]
            page = chosen[start : start + (LIST_MAX if count is None else count)]
            return json_response({"dashboards": [_summary(d) for d in page]})

    def _bulk_delete(self, request: Request) -> Response:
        ids = _bulk_ids(json_object(request))
        with self.ctx.lock:
            for dashboard_id in ids:
                self._live(dashboard_id)
            now = _now_iso(self.ctx.clock.now_dt())
            for dashboard_id in ids:
                self._dashboards[dashboard_id]["deleted_at"] = now
        return empty_response(204)

    def _restore(self, request: Request) -> Response:
        ids = _bulk_ids(json_object(request))
        with self.ctx.lock:
            for dashboard_id in ids:
                dashboard = self._dashboards.get(dashboard_id)
                if dashboard is None or not dashboard.get("deleted_at"):
                    raise ApiError(404, f"Dashboard with ID {dashboard_id} not found")
            for dashboard_id in ids:
                self._dashboards[dashboard_id]["deleted_at"] = None
        return empty_response(204)

    # -- internals ------------------------------------------------------------------------------------

    def _live(self, dashboard_id: str) -> dict[str, Any]:
        dashboard = self._dashboards.get(dashboard_id)
        if dashboard is None or dashboard.get("deleted_at"):
            raise ApiError(404, f"Dashboard with ID {dashboard_id} not found")
        return dashboard

    def _new_id(self) -> str:
        while True:
            raw = "".join(self._rng.choice(_ID_CHARS) for _ in range(9))
            candidate = f"{raw[:3]}-{raw[3:6]}-{raw[6:]}"
            if candidate not in self._dashboards:
                return candidate

    def _stored(
        self, body: Mapping[str, Any], dashboard_id: str, *, created_at: str, modified_at: str
    ) -> dict[str, Any]:
        dashboard = {k: copy.deepcopy(v) for k, v in body.items() if k not in _SERVER_KEYS}
        dashboard["widgets"] = [self._with_id(w) for w in dashboard["widgets"]]
        dashboard.update(
            id=dashboard_id,
            url=f"/dashboard/{dashboard_id}/{_slug(str(body['title']))}",
            created_at=created_at,
            modified_at=modified_at,
            author_handle=AUTHOR_HANDLE,
            author_name=None,
            deleted_at=None,
        )
        for key, default in (("description", None), ("template_variables", None), ("notify_list", None)):
            dashboard.setdefault(key, default)
        dashboard.setdefault("is_read_only", False)
        dashboard.setdefault("restricted_roles", [])
        return dashboard

    def _with_id(self, widget: dict[str, Any]) -> dict[str, Any]:
        if "id" not in widget:
            widget["id"] = self._next_widget_id()
        definition = widget.get("definition")
        if isinstance(definition, dict) and isinstance(definition.get("widgets"), list):
            # Group widgets hold widgets of their own, and those get ids too.
            definition["widgets"] = [self._with_id(w) for w in definition["widgets"] if isinstance(w, dict)]
        return widget

    def _next_widget_id(self) -> int:
        self._widget_ids += 1
        return 1_000_000_000_000_000 + self._widget_ids


# -- helpers --------------------------------------------------------------------------------------------


def _validated(body: dict[str, Any]) -> dict[str, Any]:
    """The body if datadog-api-client's Dashboard model accepts it; else Datadog's 400."""
    for key in ("title", "layout_type", "widgets"):
        if key not in body or body[key] is None:
            raise ApiError(400, f"Invalid request: missing required parameter '{key}'")
    if not isinstance(body["title"], str):
        raise ApiError(400, "Invalid parameter 'title': must be a string")
    if body["layout_type"] not in LAYOUT_TYPES:
        raise ApiError(400, f"Invalid parameter 'layout_type': must be one of {', '.join(LAYOUT_TYPES)}")
    _check_widgets(body["widgets"], body["layout_type"])
    tags = body.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(_team_tag(t) for t in tags)):
        # Recorded: dashboards take only `team:` tags.
        raise ApiError(400, "Invalid tag format. Valid tag keys are: team.")
    problem = _model_problem(body)
    if problem:
        raise ApiError(400, problem)
    return body


def _check_widgets(widgets: Any, layout_type: str) -> None:
    if not isinstance(widgets, list) or not all(isinstance(w, dict) for w in widgets):
        raise ApiError(400, "Invalid parameter 'widgets': must be a list of widget objects")
    if layout_type == "free" and any("layout" not in w for w in widgets):
        raise ApiError(400, "Invalid parameter 'widgets': every widget of a free layout needs a 'layout'")


def _model_problem(body: Mapping[str, Any]) -> str | None:
    """Why the client's Dashboard model rejects the body, or None when it parses cleanly."""
    # The model does not want server-assigned keys on input; ids and dates are checked as the server sets them.
    candidate = {k: v for k, v in body.items() if k not in _SERVER_KEYS}
    return _text_problem(json.dumps(candidate, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _text_problem(text: str) -> str | None:
    """_model_problem of one JSON text, cached: deserializing a large dashboard takes the client a second or more,
    and `gpufarm datadog apply` sends the same ones again on every fresh sandbox."""
    from datadog_api_client.exceptions import OpenApiException
    from datadog_api_client.v1.model.dashboard import Dashboard

    try:
        model = offline_client().deserialize(text, (Dashboard,), True)
    except (OpenApiException, TypeError, ValueError) as exc:
        return f"Invalid dashboard: {_short(str(exc))}"
    path = _deepest_unparsed(model)
    if path is not None:
        return f"Invalid dashboard: '{path or 'dashboard'}' is not valid"
    return None


def _deepest_unparsed(model: Any) -> str | None:
    from datadog_api_client.model_utils import OpenApiModel

    found: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, OpenApiModel):
            if getattr(node, "_unparsed", False):
                found.append(path)
            for key, value in node._data_store.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{path}[{index}]")

    walk(model, "")
    return max(found, key=len) if found else None


def _short(message: str) -> str:
    # Client messages name Python internals (`received_data`); keep the part a caller can act on.
    return message.replace("['received_data']", "body").split(" at body")[0][:300]


def _view(dashboard: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dashboard.items() if k != "deleted_at"}


def _summary(dashboard: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": dashboard["id"],
        "title": dashboard["title"],
        "description": dashboard.get("description"),
        "layout_type": dashboard["layout_type"],
        "url": dashboard["url"],
        "is_read_only": dashboard.get("is_read_only", False),
        "created_at": dashboard["created_at"],
        "modified_at": dashboard["modified_at"],
        "author_handle": dashboard["author_handle"],
        "deleted_at": dashboard.get("deleted_at"),
    }


def _bulk_ids(body: Mapping[str, Any]) -> list[str]:
    data = body.get("data")
    if not isinstance(data, list) or not data:
        raise ApiError(400, "Invalid request: 'data' must be a non-empty list")
    ids: list[str] = []
    for item in data:
        if not isinstance(item, dict) or item.get("type") != "dashboard" or not isinstance(item.get("id"), str):
            raise ApiError(400, "Invalid request: each item is {id, type: dashboard}")
        ids.append(item["id"])
    return ids


def _query_bool(request: Request, name: str) -> bool:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return False
    if raw.lower() not in ("true", "false"):
        raise ApiError(400, f"Invalid parameter {name}: must be true or false")
    return raw.lower() == "true"


def _slug(title: str) -> str:
    # As recorded: lower-case, drop everything but letters, digits, spaces and dashes, spaces become dashes.
    kept = re.sub(r"[^a-z0-9 -]", "", title.lower())
    return re.sub(r"\s+", "-", kept.strip())


def _now_iso(now: datetime) -> str:
    return now.isoformat(timespec="microseconds")


def _team_tag(tag: Any) -> bool:
    return isinstance(tag, str) and tag.startswith("team:") and len(tag) > len("team:")
