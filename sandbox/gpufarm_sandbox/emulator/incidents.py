"""Sandbox module: Datadog Incidents v2: incidents, their search, and the configuration and rules they use.

Answers follow the recorded real traffic (tests/fixtures/datadog/v2-incidents.json): create/patch/search show
expanded user objects with `*_uuid` null, get/list show only the uuids. Every incident has an incident type
(`incident_type_uuid`; the org's default when none is given) and carries the user-defined fields of that type
only. The parts live beside this module: the search language (incidents_search), incident types and fields
(incidents_config), notification rules and the webhook calls they make (incidents_notifications).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.incidents_config import (
    BUILTIN_DEFAULTS,
    BUILTIN_FIELDS,
    ENDED_STATES,
    MULTI_KINDS,
    SANDBOX_USER_ID,
    SLUG,
    IncidentConfig,
    iso,
    user_expanded,
    user_ref,
)
from gpufarm_sandbox.emulator.incidents_notifications import CREATED_TRIGGER, MODIFIED_TRIGGER, NotificationRules
from gpufarm_sandbox.emulator.incidents_search import (
    Node,
    QueryError,
    answer_facets,
    matches,
    parse_query,
    query_facets,
    seconds_to_resolve,
)
from gpufarm_sandbox.emulator.web import ApiError, Route, empty_response, json_object, json_response, query_int

INCIDENTS = "/api/v2/incidents"
PAGE_DEFAULT = 10
PAGE_MAX = 100
SORTS = ("created", "-created")

FieldValue = str | list[str] | None


@dataclass
class StoredIncident:
    """One incident as the sandbox stores it; `fields` holds only values that were set."""

    id: str
    public_id: int
    title: str
    incident_type_id: str
    created: datetime
    modified: datetime
    customer_impacted: bool = False
    customer_impact_scope: str | None = None
    customer_impact_start: datetime | None = None
    customer_impact_end: datetime | None = None
    detected: datetime | None = None
    resolved: datetime | None = None
    is_test: bool = False
    notification_handles: list[dict[str, str]] | None = None
    initial_cells: list[dict[str, Any]] = field(default_factory=list)
    commander_id: str | None = None
    responders: list[str] = field(default_factory=list)
    fields: dict[str, FieldValue] = field(default_factory=dict)
    # (state, start epoch, end epoch or None): the field_analytics search answers carry.
    state_spans: list[list[Any]] = field(default_factory=list)

    @property
    def state(self) -> str:
        """Current state (mirrors fields.state)."""
        return str(self.fields.get("state") or "active")

    @property
    def severity(self) -> str:
        """Current severity (mirrors fields.severity)."""
        return str(self.fields.get("severity") or "UNKNOWN")

    @property
    def slug(self) -> str:
        """`IR-<public_id>`."""
        return f"IR-{self.public_id}"


# -- the module -------------------------------------------------------------------------------------------


# How many distinct searches keep their matches between pages.
SEARCH_CACHE = 32
# Facets that are the incident's own attributes rather than a field.
_SPECIAL_FACETS = frozenset({"public_id", "id", "customer_impacted", "is_test", "incident_type", "commander", SLUG})


class IncidentsModule(BaseModule):
    """Incidents API of the sandbox: incidents, search, types, custom fields and notification rules."""

    name = "incidents"

    def __init__(self, sandbox: Any) -> None:
        super().__init__(sandbox)
        self._incidents: dict[str, StoredIncident] = {}
        self._next_public_id = 1
        # Bumped by every change to an incident: a search's matches and facets are computed once per query and
        # version, and its later pages are cut from them, as a real index serves page after page.
        self._version = 0
        self._searches: dict[tuple[str, str], tuple[tuple[Any, ...], list[StoredIncident], dict[str, Any]]] = {}
        self.config = IncidentConfig(sandbox)
        self.rules = NotificationRules(sandbox, self.config)
        self.reset()

    # -- module protocol ----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Incidents and search, plus incident types, user-defined fields and notification rules."""
        return [
            Route(INCIDENTS, ("POST",), self._create),
            Route(INCIDENTS, ("GET",), self._list),
            Route(f"{INCIDENTS}/search", ("GET",), self._search),
            Route(f"{INCIDENTS}/<incident_id>", ("GET",), self._get),
            Route(f"{INCIDENTS}/<incident_id>", ("PATCH",), self._update),
            Route(f"{INCIDENTS}/<incident_id>", ("DELETE",), self._delete),
            *self.config.routes(),
            *self.rules.routes(),
        ]

    def reset(self) -> None:
        """Forget everything; the organization keeps one default incident type, as a real org does."""
        self._incidents.clear()
        self._next_public_id = 1
        self._version += 1
        self._searches.clear()
        self.config.reset()
        self.rules.reset()

    def dump(self) -> dict[str, Any]:
        """Incidents (plain field values), types, fields, rules and the recent notifications."""
        return {
            "incidents": [
                {
                    "id": inc.id,
                    "public_id": inc.public_id,
                    "title": inc.title,
                    "state": inc.state,
                    "is_test": inc.is_test,
                    "incident_type_id": inc.incident_type_id,
                    "fields": self._plain_fields(inc),
                    # There is no public timeline API; the dump is where the initial note can be read.
                    "initial_cells": inc.initial_cells,
                    "created": iso(inc.created),
                    "modified": iso(inc.modified),
                }
                for inc in self._incidents.values()
            ],
            **self.config.dump(),
            **self.rules.dump(),
            "next_public_id": self._next_public_id,
        }

    # -- incidents: handlers -------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = json_object(request)
        data = _data(body, "incidents")
        attrs = _object(data.get("attributes"), "data.attributes", required=True)
        with self.sb.lock:
            incident = self._new_incident(data, attrs)
            view = {"data": self._incident_view(incident, full=True)}
            fired = self._notifications_for(incident, CREATED_TRIGGER, None)
        self.rules.fire(fired)
        return json_response(view, 201)

    def _get(self, request: Request, incident_id: str) -> Response:
        include = _include(request)
        with self.sb.lock:
            incident = self._incident(incident_id)
            out: dict[str, Any] = {"data": self._incident_view(incident, full=False)}
            if "users" in include:
                out["included"] = self._included_users([incident])
        return json_response(out)

    def _update(self, request: Request, incident_id: str) -> Response:
        body = json_object(request)
        data = _data(body, "incidents")
        if "id" in data and data["id"] != incident_id:
            raise ApiError(400, "data.id does not match the incident id in the path")
        attrs = _object(data.get("attributes"), "data.attributes", required=False)
        with self.sb.lock:
            incident = self._incident(incident_id)
            changed = self._apply_update(incident, attrs, _object(data.get("relationships"), "relationships"))
            view = {"data": self._incident_view(incident, full=True)}
            fired = self._notifications_for(incident, MODIFIED_TRIGGER, changed) if changed else []
        self.rules.fire(fired)
        return json_response(view)

    def _delete(self, request: Request, incident_id: str) -> Response:
        with self.sb.lock:
            self._incident(incident_id)
            del self._incidents[incident_id]
            self._version += 1
        return empty_response(204)

    def _list(self, request: Request) -> Response:
        include = _include(request)
        size, offset = _page(request)
        with self.sb.lock:
            ordered = sorted(self._incidents.values(), key=lambda i: i.public_id)
            page = ordered[offset : offset + size]
            out: dict[str, Any] = {
                "data": [self._incident_view(i, full=False) for i in page],
                "meta": {"pagination": _pagination(offset, len(page), len(ordered))},
            }
            if "users" in include:
                out["included"] = self._included_users(page)
        return json_response(out)

    def _search(self, request: Request) -> Response:
        text = request.args.get("query")
        if text is None or not text.strip():
            raise ApiError(400, "Missing required query parameter: query")
        sort = request.args.get("sort") or "-created"
        if sort not in SORTS:
            raise ApiError(400, f"Invalid parameter sort: must be one of {', '.join(SORTS)}")
        include = _include(request)
        size, offset = _page(request)
        try:
            query = parse_query(text)
        except QueryError as exc:
            raise ApiError(400, f"Invalid query: {exc}") from None
        with self.sb.lock:
            unknown = sorted(f for f in query_facets(query) if not self._is_facet(f))
            if unknown:
                raise ApiError(400, f"Invalid query: unknown facet '{unknown[0]}'")
            found, facets = self._matching(text, sort, query)
            page = found[offset : offset + size]
            out = self._search_answer(found, page, offset, facets)
            if "users" in include:
                out["included"] = self._included_users(page)
        return json_response(out)

    # -- incidents: state changes -----------------------------------------------------------------------

    def _new_incident(self, data: Mapping[str, Any], attrs: Mapping[str, Any]) -> StoredIncident:
        title = _title(attrs.get("title"), required=True)
        if "customer_impacted" not in attrs:
            raise ApiError(400, "data.attributes.customer_impacted is required")
        impacted = _bool(attrs["customer_impacted"], "customer_impacted")
        scope = _opt_str(attrs.get("customer_impact_scope"), "customer_impact_scope")
        if impacted and not scope:
            raise ApiError(400, "customer_impact_scope is required when customer_impacted is true")
        type_id = attrs.get("incident_type_uuid")
        if type_id is None:
            type_id = self.config.default_type().id
        elif not isinstance(type_id, str) or type_id not in self.config.types:
            raise ApiError(404, f"incident type {type_id} not found")
        values = self._validate_fields(attrs.get("fields"), type_id, current=None)
        commander = _commander(_object(data.get("relationships"), "relationships"))
        now = self.sb.clock.now_dt()
        incident = StoredIncident(
            id=str(uuid.uuid4()),
            public_id=self._next_public_id,
            title=title,
            incident_type_id=type_id,
            created=now,
            modified=now,
            customer_impacted=impacted,
            customer_impact_scope=scope,
            customer_impact_start=now if impacted else None,
            detected=now,
            is_test=_bool(attrs.get("is_test", False), "is_test"),
            notification_handles=_handles(attrs.get("notification_handles")),
            initial_cells=_cells(attrs.get("initial_cells")),
            commander_id=commander or None,
        )
        if incident.commander_id:
            incident.responders.append(incident.commander_id)
        incident.fields = {**BUILTIN_DEFAULTS, **self._field_defaults(type_id), **values}
        incident.state_spans.append([incident.state, now.timestamp(), None])
        if incident.state in ENDED_STATES:
            incident.resolved = now
        self._next_public_id += 1
        self._incidents[incident.id] = incident
        self._version += 1
        return incident

    def _apply_update(
        self, incident: StoredIncident, attrs: Mapping[str, Any], relationships: Mapping[str, Any]
    ) -> set[str]:
        before = self._snapshot(incident)
        values = self._validate_fields(attrs.get("fields"), incident.incident_type_id, current=incident)
        title = _title(attrs["title"], required=True) if "title" in attrs else incident.title
        impacted = _bool(attrs["customer_impacted"], "customer_impacted") if "customer_impacted" in attrs else None
        times = {
            key: _datetime(attrs[key], key)
            for key in ("customer_impact_start", "customer_impact_end", "detected")
            if key in attrs
        }
        handles = _handles(attrs["notification_handles"]) if "notification_handles" in attrs else None
        scope = _opt_str(attrs.get("customer_impact_scope"), "customer_impact_scope")
        commander = _commander(relationships)
        # Everything is validated above; nothing below can fail, so a bad PATCH changes nothing.
        now = self.sb.clock.now_dt()
        self._version += 1
        old_state = incident.state
        incident.title = title
        incident.fields.update(values)
        if impacted is not None:
            incident.customer_impacted = impacted
        if "customer_impact_scope" in attrs:
            incident.customer_impact_scope = scope
        for key, value in times.items():
            setattr(incident, key, value)
        if handles is not None:
            incident.notification_handles = handles
        if commander is not None:
            incident.commander_id = commander or None
            if commander and commander not in incident.responders:
                incident.responders.append(commander)
        if incident.state != old_state:
            self._state_changed(incident, old_state, now)
        changed = {k for k, v in self._snapshot(incident).items() if before.get(k) != v}
        if changed:
            incident.modified = now
            # The user who modifies an incident becomes one of its responders (recorded PATCH answer).
            if SANDBOX_USER_ID not in incident.responders:
                incident.responders.append(SANDBOX_USER_ID)
        return changed

    @staticmethod
    def _state_changed(incident: StoredIncident, old_state: str, now: datetime) -> None:
        if incident.state_spans and incident.state_spans[-1][2] is None:
            incident.state_spans[-1][2] = now.timestamp()
        incident.state_spans.append([incident.state, now.timestamp(), None])
        if incident.state in ENDED_STATES:
            if old_state not in ENDED_STATES or incident.resolved is None:
                incident.resolved = now
        else:
            incident.resolved = None

    def _snapshot(self, incident: StoredIncident) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._plain_fields(incident))
        out.update(
            title=incident.title,
            customer_impacted=incident.customer_impacted,
            customer_impact_scope=incident.customer_impact_scope,
            customer_impact_start=incident.customer_impact_start,
            customer_impact_end=incident.customer_impact_end,
            detected=incident.detected,
            notification_handles=incident.notification_handles,
            commander=incident.commander_id,
        )
        return out

    # -- incidents: fields ------------------------------------------------------------------------------

    def _field_defaults(self, type_id: str) -> dict[str, FieldValue]:
        out: dict[str, FieldValue] = {}
        for definition in self.config.fields_of(type_id):
            if definition.default_value is not None:
                multi = definition.kind in MULTI_KINDS
                out[definition.name] = [definition.default_value] if multi else definition.default_value
        return out

    def _validate_fields(self, raw: Any, type_id: str, *, current: StoredIncident | None) -> dict[str, FieldValue]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ApiError(400, "data.attributes.fields must be an object")
        out: dict[str, FieldValue] = {}
        for name, obj in raw.items():
            if name == SLUG:
                # Read-only; a read-modify-write client may send it back unchanged.
                expected = current.slug if current else None
                if not isinstance(obj, dict) or obj.get("value") not in (None, expected):
                    raise ApiError(400, "Invalid field 'slug': the slug is set by Datadog and read-only")
                continue
            spec = self.config.field_kind(type_id, name)
            if spec is None:
                type_name = self.config.type_name(type_id)
                raise ApiError(
                    400,
                    f"Invalid field '{name}': incident type '{type_name}' defines no such field "
                    "(run `gpufarm datadog apply`)",
                )
            out[name] = _field_value(name, obj, *spec)
        return out

    def _plain_fields(self, incident: StoredIncident) -> dict[str, FieldValue]:
        out: dict[str, FieldValue] = {name: incident.fields.get(name) for name in BUILTIN_FIELDS}
        for definition in self.config.fields_of(incident.incident_type_id):
            out[definition.name] = incident.fields.get(definition.name)
        out[SLUG] = incident.slug
        return out

    def _encoded_fields(self, incident: StoredIncident) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, (kind, _) in BUILTIN_FIELDS.items():
            out[name] = {"type": kind, "value": incident.fields.get(name)}
        for definition in self.config.fields_of(incident.incident_type_id):
            out[definition.name] = {"type": definition.kind, "value": incident.fields.get(definition.name)}
        out[SLUG] = {"type": "textbox", "value": incident.slug}
        return out

    def _notifications_for(
        self, incident: StoredIncident, trigger: str, changed: set[str] | None
    ) -> list[tuple[str, dict[str, str]]]:
        return self.rules.for_change(
            incident,
            trigger,
            changed,
            values_of=self._facet_reader(incident),
            plain_fields=self._plain_fields(incident),
        )

    # -- incidents: search support --------------------------------------------------------------------

    def _is_facet(self, facet: str) -> bool:
        builtin = ("title", "public_id", "id", "customer_impacted", "is_test", "incident_type", "commander", SLUG)
        return facet in builtin or self.config.is_field_name(facet)

    def _facet_reader(self, incident: StoredIncident) -> Callable[[str | None], list[str]]:
        # Called for every incident and every term of every search: only the facet asked for is computed.
        def values_of(facet: str | None) -> list[str]:
            if facet is None or facet == "title":
                return [incident.title]
            if facet in _SPECIAL_FACETS:
                return self._special_values(incident, facet)
            value = incident.fields.get(facet)
            if value is None:
                return []
            return list(value) if isinstance(value, list) else [value]

        return values_of

    def _special_values(self, incident: StoredIncident, facet: str) -> list[str]:
        if facet == "public_id":
            return [str(incident.public_id)]
        if facet == "id":
            return [incident.id]
        if facet in ("customer_impacted", "is_test"):
            return [str(getattr(incident, facet)).lower()]
        if facet == "incident_type":
            # By id or by name: `incident_type:<uuid>` or `incident_type:"GPU allocation"`.
            return list(dict.fromkeys([incident.incident_type_id, self.config.type_name(incident.incident_type_id)]))
        if facet == "commander":
            return [incident.commander_id] if incident.commander_id else []
        return [incident.slug]

    def _matching(self, text: str, sort: str, query: Node) -> tuple[list[StoredIncident], dict[str, Any]]:
        """The incidents a query matches, in the answer's order, and the answer's facets (cached per version)."""
        # Field definitions and type names shape the facets: they are part of what the cache depends on.
        fingerprint = (
            self._version,
            tuple((t.id, t.name) for t in self.config.types.values()),
            tuple(id(d) for d in self.config.fields.values()),
        )
        cached = self._searches.get((text, sort))
        if cached is not None and cached[0] == fingerprint:
            return cached[1], cached[2]
        found = [i for i in self._incidents.values() if matches(query, self._facet_reader(i))]
        found.sort(key=lambda i: i.public_id, reverse=sort == "-created")
        facets = answer_facets(found, self.config)
        if len(self._searches) >= SEARCH_CACHE:
            self._searches.pop(next(iter(self._searches)))
        self._searches[(text, sort)] = (fingerprint, found, facets)
        return found, facets

    def _search_answer(
        self, found: list[StoredIncident], page: list[StoredIncident], offset: int, facets: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "data": {
                "type": "incidents_search_results",
                "attributes": {
                    "total": len(found),
                    "facets": facets,
                    "incidents": [{"data": self._incident_view(i, full=True, analytics=True)} for i in page],
                },
                "relationships": {
                    "incidents_relationship": {"data": [{"type": "incidents", "id": i.id} for i in page]}
                },
            },
            # Recorded: search answers carry next_offset on every page, the last one included.
            "meta": {"pagination": {"offset": offset, "next_offset": offset + len(page), "size": len(page)}},
        }

    # -- incidents: rendering ---------------------------------------------------------------------------

    def _incident(self, incident_id: str) -> StoredIncident:
        incident = self._incidents.get(incident_id)
        if incident is None:
            raise ApiError(404, f"incident {incident_id} not found")
        return incident

    def _incident_view(self, incident: StoredIncident, *, full: bool, analytics: bool = False) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "public_id": incident.public_id,
            "incident_type_uuid": incident.incident_type_id,
            "title": incident.title,
            "resolved": iso(incident.resolved),
            "customer_impact_scope": incident.customer_impact_scope,
            "customer_impact_start": iso(incident.customer_impact_start),
            "customer_impact_end": iso(incident.customer_impact_end),
            "customer_impacted": incident.customer_impacted,
            "notification_handles": incident.notification_handles,
            "created": iso(incident.created),
            "modified": iso(incident.modified),
            "detected": iso(incident.detected),
            "creation_idempotency_key": None,
            "customer_impact_duration": _impact_duration(incident),
            "time_to_detect": 0,
            "time_to_repair": 0,
            "time_to_internal_response": 0,
            "time_to_resolve": seconds_to_resolve(incident),
            "archived": None,
            "is_test": incident.is_test,
            "declared": iso(incident.created),
            "fields": self._encoded_fields(incident),
            "field_analytics": _field_analytics(incident, self.sb.clock.now()) if analytics else None,
            "severity": incident.severity,
            "state": incident.state,
            "non_datadog_creator": None,
            "visibility": "organization",
            "case_id": None,
        }
        # Create/patch/search answers expand the users; get/list answers carry only their uuids (recorded).
        for key in ("created_by", "last_modified_by", "declared_by"):
            if full:
                attributes[key] = user_expanded(SANDBOX_USER_ID)
            attributes[f"{key}_uuid"] = None if full else SANDBOX_USER_ID
        if full:
            attributes["commander"] = user_expanded(incident.commander_id) if incident.commander_id else None
        return {
            "type": "incidents",
            "id": incident.id,
            "attributes": attributes,
            "relationships": self._relationships(incident),
        }

    def _relationships(self, incident: StoredIncident) -> dict[str, Any]:
        me = {"data": user_ref(SANDBOX_USER_ID)}
        return {
            "created_by_user": me,
            "last_modified_by_user": me,
            "commander_user": {"data": user_ref(incident.commander_id) if incident.commander_id else None},
            "declared_by_user": me,
            "user_defined_fields": {
                "data": [
                    {"type": "user_defined_field", "id": f.id} for f in self.config.fields_of(incident.incident_type_id)
                ]
            },
            "integrations": {"data": []},
            "attachments": {"data": []},
            "responders": {
                "data": [
                    {"type": "incident_responders", "id": str(uuid.uuid5(uuid.UUID(incident.id), user))}
                    for user in incident.responders
                ]
            },
            "impacts": {"data": []},
        }

    @staticmethod
    def _included_users(incidents: Iterable[StoredIncident]) -> list[dict[str, Any]]:
        ids = [SANDBOX_USER_ID]
        for incident in incidents:
            if incident.commander_id and incident.commander_id not in ids:
                ids.append(incident.commander_id)
        return [user_expanded(uid)["data"] for uid in ids]


# -- helpers ----------------------------------------------------------------------------------------------


def _data(body: Mapping[str, Any], expected: str) -> dict[str, Any]:
    data = body.get("data")
    if not isinstance(data, dict):
        raise ApiError(400, "data is required and must be an object")
    if data.get("type") != expected:
        raise ApiError(400, f'got type "{data.get("type")}" expected one of "{expected}"')
    return data


def _object(value: Any, name: str, *, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, f"{name} is required and must be an object")
    return value


def _title(value: Any, *, required: bool) -> str:
    if value is None and required:
        raise ApiError(400, "data.attributes.title is required")
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, "data.attributes.title must be a non-empty string")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(400, f"data.attributes.{name} must be a boolean")
    return value


def _opt_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"data.attributes.{name} must be a string")
    return value


def _datetime(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    raise ApiError(400, f"data.attributes.{name} must be an ISO 8601 timestamp with a time zone, or null")


def _handles(value: Any) -> list[dict[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError(400, "data.attributes.notification_handles must be a list")
    out = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("handle"), str) or not item["handle"]:
            raise ApiError(400, "each notification handle needs a 'handle' string")
        display = item.get("display_name", item["handle"])
        if not isinstance(display, str):
            raise ApiError(400, "notification handle display_name must be a string")
        out.append({"display_name": display, "handle": item["handle"]})
    return out


def _cells(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise ApiError(400, "data.attributes.initial_cells must be a list of objects")
    for cell in value:
        content = cell.get("content")
        if cell.get("cell_type") != "markdown" or not isinstance(content, dict):
            raise ApiError(400, "initial cells are markdown cells: {cell_type: markdown, content: {content: ...}}")
        if not isinstance(content.get("content"), str):
            raise ApiError(400, "initial cell content.content must be a string")
    return [dict(c) for c in value]


def _commander(relationships: Mapping[str, Any]) -> str | None:
    """The commander's user id, "" to clear it, or None when not mentioned."""
    if "commander_user" not in relationships:
        return None
    rel = relationships["commander_user"]
    data = rel.get("data") if isinstance(rel, dict) else None
    if rel is None or data is None:
        return ""
    if not isinstance(data, dict) or not isinstance(data.get("id"), str) or data.get("type", "users") != "users":
        raise ApiError(400, "relationships.commander_user.data must be {id, type: users} or null")
    return str(data["id"])


def _field_value(name: str, obj: Any, kind: str, allowed: tuple[str, ...] | None) -> FieldValue:
    if not isinstance(obj, dict) or "value" not in obj:
        raise ApiError(400, f"Invalid field '{name}': expected an object with 'type' and 'value'")
    given = obj.get("type")
    if given is not None and given != kind:
        raise ApiError(400, f"Invalid field '{name}': it is a {kind} field, got type '{given}'")
    value = obj["value"]
    if value is None:
        return None
    if kind in MULTI_KINDS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ApiError(400, f"Invalid field '{name}': a {kind} value is a list of strings")
        bad = [v for v in value if allowed is not None and v not in allowed]
    else:
        if not isinstance(value, str):
            raise ApiError(400, f"Invalid field '{name}': a {kind} value is a string")
        bad = [value] if allowed is not None and value not in allowed else []
    if bad:
        raise ApiError(400, f"Invalid field '{name}': {bad[0]!r} is not one of {', '.join(allowed or ())}")
    return list(value) if isinstance(value, list) else value


def _include(request: Request) -> set[str]:
    raw = ",".join(request.args.getlist("include"))
    wanted = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = wanted - {"users", "attachments"}
    if unknown:
        raise ApiError(400, f"Invalid parameter include: {sorted(unknown)[0]!r} (expected users or attachments)")
    return wanted


def _page(request: Request) -> tuple[int, int]:
    size = query_int(request, "page[size]", PAGE_DEFAULT, minimum=1, maximum=PAGE_MAX) or PAGE_DEFAULT
    offset = query_int(request, "page[offset]", 0) or 0
    return size, offset


def _pagination(offset: int, count: int, total: int) -> dict[str, int]:
    # The client's paginators stop on a short page; a last page carries no next_offset (recorded).
    out = {"offset": offset, "size": count}
    if offset + count < total:
        out["next_offset"] = offset + count
    return out


def _impact_duration(incident: StoredIncident) -> int:
    if incident.customer_impact_start is None or incident.customer_impact_end is None:
        return 0
    return max(0, int((incident.customer_impact_end - incident.customer_impact_start).total_seconds()))


def _field_analytics(incident: StoredIncident, now: float) -> dict[str, Any]:
    states: dict[str, dict[str, Any]] = {}
    for state, start, end in incident.state_spans:
        entry = states.setdefault(state, {"duration": 0, "spans": []})
        entry["spans"].append({"start": int(start), "end": int(end) if end is not None else None})
        entry["duration"] += int((end if end is not None else now) - start)
    return {"state": states}
