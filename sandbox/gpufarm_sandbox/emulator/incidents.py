"""Sandbox module: Datadog Incidents v2: incidents, their search, and the configuration and rules they use.

Answers follow the recorded real traffic (tests/fixtures/datadog/v2-incidents.json): create/patch/search show
expanded user objects with `*_uuid` null, get/list show only the uuids. Every incident has an incident type
(`incident_type_uuid`; the org's default when none is given) and carries the user-defined fields of that type
only. The parts live beside this module: the search language (incidents_search), incident types and fields
(incidents_config), notification rules and the webhook calls they make (incidents_notifications).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.incidents_body import (
    body_data,
    body_object,
    checked_bool,
    checked_cells,
    checked_datetime,
    checked_handles,
    checked_title,
    commander_change,
    field_value,
    include_arg,
    optional_str,
    page_args,
)
from gpufarm_sandbox.emulator.incidents_config import (
    BUILTIN_DEFAULTS,
    ENDED_STATES,
    MULTI_KINDS,
    SANDBOX_USER_ID,
    SLUG,
    IncidentConfig,
    iso,
)
from gpufarm_sandbox.emulator.incidents_notifications import CREATED_TRIGGER, MODIFIED_TRIGGER, NotificationRules
from gpufarm_sandbox.emulator.incidents_record import FieldValue, StoredIncident, field_analytics, state_changed
from gpufarm_sandbox.emulator.incidents_search import (
    Node,
    QueryError,
    answer_facets,
    matches,
    parse_query,
    query_facets,
    without_facets,
    without_list_wildcards,
)
from gpufarm_sandbox.emulator.incidents_views import IncidentViews, pagination
from gpufarm_sandbox.emulator.quirks import FACETS_400, FACETS_IGNORED, NO_LIST_WILDCARD
from gpufarm_sandbox.emulator.web import ApiError, Route, empty_response, json_object, json_response
from gpufarm_sandbox.emulator.webhooks import WebhooksModule

INCIDENTS = "/api/v2/incidents"
SEP = (",", ":")  # compact JSON, as json_response writes it
SORTS = ("created", "-created")


# -- the module -------------------------------------------------------------------------------------------


# How many distinct searches keep their matches between pages.
SEARCH_CACHE = 32
# How many incidents keep their search view as JSON text between answers (about 10 KB each).
RENDER_CACHE = 20_000
# Where an incident's search view, rendered once per change, takes its field analytics (they age with the clock).
_ANALYTICS = '"field_analytics":null'
_NO_INCIDENTS = '"incidents":[]'
# Facets that are the incident's own attributes rather than a field.
_SPECIAL_FACETS = frozenset({"public_id", "id", "customer_impacted", "is_test", "incident_type", "commander", SLUG})


class IncidentsModule(BaseModule):
    """Incidents API of the sandbox: incidents, search, types, custom fields and notification rules."""

    name = "incidents"

    def __init__(self, context: SandboxContext, webhooks: WebhooksModule) -> None:
        super().__init__(context)
        self._incidents: dict[str, StoredIncident] = {}
        self._next_public_id = 1
        # Bumped by every change to an incident: a search's matches and facets are computed once per query and
        # version, and its later pages are cut from them, as a real index serves page after page.
        self._version = 0
        self._searches: dict[tuple[str, str], tuple[tuple[Any, ...], list[StoredIncident], dict[str, Any]]] = {}
        # Each incident's search view as JSON text, around its field analytics, with the version of its last change
        # and the field definitions it was rendered with: a page of a search is its incidents' texts joined, each
        # rendered again only once it changed (the view of 100 incidents is most of a page's cost).
        self._changed: dict[str, int] = {}
        self._texts: dict[str, tuple[tuple[Any, ...], str, str]] = {}
        self.config = IncidentConfig(context)
        self.rules = NotificationRules(context, self.config, webhooks)
        self.views = IncidentViews(self.config, context.clock)
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
        self._changed.clear()
        self._texts.clear()
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
                    "fields": self.views.plain_fields(inc),
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
        data = body_data(body, "incidents")
        attrs = body_object(data.get("attributes"), "data.attributes", required=True)
        with self.ctx.lock:
            incident = self._new_incident(data, attrs)
            view = {"data": self.views.incident(incident, full=True)}
            fired = self._notifications_for(incident, CREATED_TRIGGER, None)
        self.rules.fire(fired)
        return json_response(view, 201)

    def _get(self, request: Request, incident_id: str) -> Response:
        include = include_arg(request)
        with self.ctx.lock:
            incident = self._incident(incident_id)
            out: dict[str, Any] = {"data": self.views.incident(incident, full=False)}
            if "users" in include:
                out["included"] = self.views.included_users([incident])
        return json_response(out)

    def _update(self, request: Request, incident_id: str) -> Response:
        body = json_object(request)
        data = body_data(body, "incidents")
        if "id" in data and data["id"] != incident_id:
            raise ApiError(400, "data.id does not match the incident id in the path")
        attrs = body_object(data.get("attributes"), "data.attributes", required=False)
        with self.ctx.lock:
            incident = self._incident(incident_id)
            changed = self._apply_update(incident, attrs, body_object(data.get("relationships"), "relationships"))
            view = {"data": self.views.incident(incident, full=True)}
            fired = self._notifications_for(incident, MODIFIED_TRIGGER, changed) if changed else []
        self.rules.fire(fired)
        return json_response(view)

    def _delete(self, request: Request, incident_id: str) -> Response:
        with self.ctx.lock:
            self._incident(incident_id)
            del self._incidents[incident_id]
            self._version += 1
            self._changed.pop(incident_id, None)
            self._texts.pop(incident_id, None)
        return empty_response(204)

    def _list(self, request: Request) -> Response:
        include = include_arg(request)
        size, offset = page_args(request)
        with self.ctx.lock:
            ordered = sorted(self._incidents.values(), key=lambda i: i.public_id)
            page = ordered[offset : offset + size]
            out: dict[str, Any] = {
                "data": [self.views.incident(i, full=False) for i in page],
                "meta": {"pagination": pagination(offset, len(page), len(ordered))},
            }
            if "users" in include:
                out["included"] = self.views.included_users(page)
        return json_response(out)

    def _search(self, request: Request) -> Response:
        text = request.args.get("query")
        if text is None or not text.strip():
            raise ApiError(400, "Missing required query parameter: query")
        sort = request.args.get("sort") or "-created"
        if sort not in SORTS:
            raise ApiError(400, f"Invalid parameter sort: must be one of {', '.join(SORTS)}")
        include = include_arg(request)
        size, offset = page_args(request)
        try:
            query = parse_query(text)
        except QueryError as exc:
            raise ApiError(400, f"Invalid query: {exc}") from None
        with self.ctx.lock:
            unknown = sorted(f for f in query_facets(query) if not self._is_facet(f))
            if unknown:
                raise ApiError(400, f"Invalid query: unknown facet '{unknown[0]}'")
            found, facets = self._matching(text, sort, self._quirked(query))
            page = found[offset : offset + size]
            if "users" in include:
                out = self.views.search_answer(found, page, offset, facets)
                out["included"] = self.views.included_users(page)
                return json_response(out)
            envelope = json.dumps(self.views.search_answer(found, page, offset, facets, rendered=False), separators=SEP)
            head, marker, tail = envelope.partition(_NO_INCIDENTS)
            assert marker, "a search answer holds its incidents' list"
            now = self.ctx.clock.now()
            items = ",".join(self.incident_text(i, now) for i in page)
        return Response(f'{head}"incidents":[{items}]{tail}', content_type="application/json")

    def incident_text(self, incident: StoredIncident, now: float) -> str:
        """One search result (`{"data": ...}`) as JSON text: the view rendered once per change of the incident (or of
        the field definitions), its field analytics as of `now`; the same text as rendering it whole."""
        key = (self._changed.get(incident.id), tuple(id(d) for d in self.config.fields.values()))
        kept = self._texts.get(incident.id)
        if kept is None or kept[0] != key:
            text = json.dumps({"data": self.views.incident(incident, full=True)}, separators=SEP)
            before, marker, after = text.partition(_ANALYTICS)
            assert marker, "an incident's search view holds its field analytics"
            kept = (key, before, after)
            self._texts.pop(incident.id, None)
            if len(self._texts) >= RENDER_CACHE:
                self._texts.pop(next(iter(self._texts)))
            self._texts[incident.id] = kept
        analytics = json.dumps(field_analytics(incident, now), separators=SEP)
        return f'{kept[1]}"field_analytics":{analytics}{kept[2]}'

    # -- incidents: state changes -----------------------------------------------------------------------

    def _new_incident(self, data: Mapping[str, Any], attrs: Mapping[str, Any]) -> StoredIncident:
        title = checked_title(attrs.get("title"), required=True)
        if "customer_impacted" not in attrs:
            raise ApiError(400, "data.attributes.customer_impacted is required")
        impacted = checked_bool(attrs["customer_impacted"], "customer_impacted")
        scope = optional_str(attrs.get("customer_impact_scope"), "customer_impact_scope")
        if impacted and not scope:
            raise ApiError(400, "customer_impact_scope is required when customer_impacted is true")
        type_id = attrs.get("incident_type_uuid")
        if type_id is None:
            type_id = self.config.default_type().id
        elif not isinstance(type_id, str) or type_id not in self.config.types:
            raise ApiError(404, f"incident type {type_id} not found")
        values = self._validate_fields(attrs.get("fields"), type_id, current=None)
        commander = commander_change(body_object(data.get("relationships"), "relationships"))
        now = self.ctx.clock.now_dt()
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
            is_test=checked_bool(attrs.get("is_test", False), "is_test"),
            notification_handles=checked_handles(attrs.get("notification_handles")),
            initial_cells=checked_cells(attrs.get("initial_cells")),
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
        self._changed[incident.id] = self._version
        return incident

    def _apply_update(
        self, incident: StoredIncident, attrs: Mapping[str, Any], relationships: Mapping[str, Any]
    ) -> set[str]:
        before = self._snapshot(incident)
        values = self._validate_fields(attrs.get("fields"), incident.incident_type_id, current=incident)
        updates = _attribute_updates(attrs)
        commander = commander_change(relationships)
        # Everything is validated above; nothing below can fail, so a bad PATCH changes nothing.
        now = self.ctx.clock.now_dt()
        self._version += 1
        self._changed[incident.id] = self._version
        old_state = incident.state
        incident.fields.update(values)
        for key, value in updates.items():
            setattr(incident, key, value)
        if commander is not None:
            incident.commander_id = commander or None
            if commander and commander not in incident.responders:
                incident.responders.append(commander)
        if incident.state != old_state:
            state_changed(incident, old_state, now)
        changed = {k for k, v in self._snapshot(incident).items() if before.get(k) != v}
        if changed:
            incident.modified = now
            # The user who modifies an incident becomes one of its responders (recorded PATCH answer).
            if SANDBOX_USER_ID not in incident.responders:
                incident.responders.append(SANDBOX_USER_ID)
        return changed

    def _snapshot(self, incident: StoredIncident) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.views.plain_fields(incident))
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
            out[name] = field_value(name, obj, *spec)
        return out

    def _notifications_for(
        self, incident: StoredIncident, trigger: str, changed: set[str] | None
    ) -> list[tuple[str, dict[str, str]]]:
        return self.rules.for_change(
            incident,
            trigger,
            changed,
            values_of=self._facet_reader(incident),
            plain_fields=self.views.plain_fields(incident),
        )

    # -- incidents: search support --------------------------------------------------------------------

    def _is_facet(self, facet: str) -> bool:
        builtin = ("title", "public_id", "id", "customer_impacted", "is_test", "incident_type", "commander", SLUG)
        return facet in builtin or self.config.is_field_name(facet)

    def _quirked(self, query: Node) -> Node:
        """The query as Datadog would take it under the quirk modes played: refused (400) under `facets-400`, its
        custom-field terms dropped under `facets-ignored`, its wildcards on list fields dropped under
        `no-list-wildcard`."""
        quirks = self.ctx.quirks
        if FACETS_400 in quirks:
            refused = sorted(f for f in query_facets(query) if self._custom_facet(f))
            if refused:
                raise ApiError(400, f"Invalid query: searching by the facet '{refused[0]}' is not supported")
        if FACETS_IGNORED in quirks:
            query = without_facets(query, self._custom_facet)
        if NO_LIST_WILDCARD in quirks:
            query = without_list_wildcards(query, self.config.is_list_field)
        return query

    def _custom_facet(self, facet: str) -> bool:
        # What the facet quirks refuse or ignore: every field but state and severity, and the incident type.
        return facet == "incident_type" or (facet not in ("state", "severity") and self.config.is_field_name(facet))

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
            self.ctx.quirks,
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

    # -- incidents: rendering ---------------------------------------------------------------------------

    def _incident(self, incident_id: str) -> StoredIncident:
        incident = self._incidents.get(incident_id)
        if incident is None:
            raise ApiError(404, f"incident {incident_id} not found")
        return incident


# -- helpers ----------------------------------------------------------------------------------------------


def _attribute_updates(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The incident attributes a PATCH sets (fields and commander apart), each checked."""
    updates: dict[str, Any] = {}
    if "title" in attrs:
        updates["title"] = checked_title(attrs["title"], required=True)
    if "customer_impacted" in attrs:
        updates["customer_impacted"] = checked_bool(attrs["customer_impacted"], "customer_impacted")
    for key in ("customer_impact_start", "customer_impact_end", "detected"):
        if key in attrs:
            updates[key] = checked_datetime(attrs[key], key)
    handles = checked_handles(attrs["notification_handles"]) if "notification_handles" in attrs else None
    if handles is not None:
        updates["notification_handles"] = handles
    scope = optional_str(attrs.get("customer_impact_scope"), "customer_impact_scope")
    if "customer_impact_scope" in attrs:
        updates["customer_impact_scope"] = scope
    return updates
