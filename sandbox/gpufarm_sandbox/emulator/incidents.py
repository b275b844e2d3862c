"""Sandbox module: Datadog Incidents v2, incident types, custom field definitions and notification rules.

Answers follow the recorded real traffic (tests/fixtures/datadog/v2-incidents.json): create/patch/search show
expanded user objects with `*_uuid` null, get/list show only the uuids. Notification rules fire the webhooks
module (`@webhook-<name>` handles) after the change is stored and outside the sandbox lock.
"""

from __future__ import annotations

import fnmatch
import json
import re
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.web import ApiError, Route, empty_response, json_object, json_response, query_int

INCIDENTS = "/api/v2/incidents"
CONFIG = "/api/v2/incidents/config"

# The one user the sandbox's API keys belong to: creator and modifier of everything.
SANDBOX_USER_ID = "3f2e7c1a-0b5d-4e8f-9a61-5c0d7e2b9f10"
SANDBOX_USER = {
    "uuid": SANDBOX_USER_ID,
    "handle": "sandbox@gpufarm.local",
    "email": "sandbox@gpufarm.local",
    "name": "gpufarm sandbox",
    "icon": "https://secure.gravatar.com/avatar/00000000000000000000000000000000?s=48&d=retro",
}

SEVERITIES = ("UNKNOWN", "SEV-0", "SEV-1", "SEV-2", "SEV-3", "SEV-4", "SEV-5")
STATES = ("active", "stable", "resolved", "completed")
ENDED_STATES = ("resolved", "completed")
DETECTION_METHODS = ("customer", "employee", "monitor", "other", "unknown")

SINGLE_KINDS = ("dropdown", "textbox")
MULTI_KINDS = ("multiselect", "textarray", "metrictag", "autocomplete")

# Built-in fields every incident carries (recorded order), their kind and closed value set.
BUILTIN_FIELDS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "teams": ("autocomplete", None),
    "severity": ("dropdown", SEVERITIES),
    "state": ("dropdown", STATES),
    "detection_method": ("dropdown", DETECTION_METHODS),
    "root_cause": ("textbox", None),
    "summary": ("textbox", None),
    "services": ("autocomplete", None),
}
BUILTIN_DEFAULTS = {"severity": "UNKNOWN", "state": "active", "detection_method": "unknown"}
SLUG = "slug"

# User-defined field type codes. 7 (number) and 8 (datetime) exist in Datadog but datadog-api-client's value-type
# enums lack them, so incidents carrying them would deserialize `_unparsed` (docs/datadog.md, "Custom field"); refused.
TYPE_KINDS = {1: "dropdown", 2: "multiselect", 3: "textbox", 4: "textarray", 5: "metrictag", 6: "autocomplete"}
VALUED_KINDS = ("dropdown", "multiselect")
FIELD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]*$")
MAX_VALID_VALUES = 1000
COLLECTED = ("active", "stable", "resolved", "completed")
CATEGORIES = ("what_happened", "why_it_happened")

CREATED_TRIGGER = "incident_created_trigger"
MODIFIED_TRIGGER = "incident_modified_trigger"
TRIGGERS = (CREATED_TRIGGER, MODIFIED_TRIGGER)
VISIBILITIES = ("all", "organization", "private")
WEBHOOK_HANDLE = "@webhook-"

PAGE_DEFAULT = 10
PAGE_MAX = 100
SORTS = ("created", "-created")

FieldValue = str | list[str] | None


class JsonApiError(Exception):
    """An error answered in JSON:API shape, as the config endpoints do (recorded)."""

    def __init__(self, status: int, title: str, detail: str | None = None, *, with_status: bool = True) -> None:
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.with_status = with_status

    def response(self) -> Response:
        """The `{"errors":[{status,title,detail}]}` answer."""
        error: dict[str, str] = {}
        if self.with_status:
            error["status"] = str(self.status)
        error["title"] = self.title
        if self.detail is not None:
            error["detail"] = self.detail
        return json_response({"errors": [error]}, self.status)


def _jsonapi_bad(detail: str) -> JsonApiError:
    return JsonApiError(400, "Bad Request", detail)


def _generic_not_found(detail: str) -> JsonApiError:
    return JsonApiError(404, "Generic Error", detail, with_status=False)


# -- search query language ----------------------------------------------------------------------------


class QueryError(ValueError):
    """A search query the sandbox cannot parse."""


@dataclass(frozen=True)
class Term:
    """`facet:value`, `facet:(a OR b)`, or free text on the title when facet is None."""

    facet: str | None
    values: tuple[str, ...]


@dataclass(frozen=True)
class Not:
    """Negation: `-facet:value` or `NOT term`."""

    child: Node


@dataclass(frozen=True)
class All:
    """Conjunction (`AND`, or terms side by side)."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class AnyOf:
    """Disjunction (`OR`)."""

    children: tuple[Node, ...]


Node = Term | Not | All | AnyOf

_TOKEN = re.compile(r'\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<q>"(?:[^"\\]|\\.)*")|(?P<w>[^\s()"]+))')


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise QueryError(f"unexpected character at position {pos}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent over: expr := and (OR and)*; and := unary ((AND)? unary)*; unary := NOT unary | primary."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise QueryError("the query is empty")
        node = self._expr()
        if self.pos != len(self.tokens):
            raise QueryError(f"unexpected {self.tokens[self.pos][1]!r}")
        return node

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise QueryError("the query ends too early")
        self.pos += 1
        return token

    def _expr(self) -> Node:
        nodes = [self._and()]
        while self._peek() == ("w", "OR"):
            self.pos += 1
            nodes.append(self._and())
        return nodes[0] if len(nodes) == 1 else AnyOf(tuple(nodes))

    def _and(self) -> Node:
        nodes = [self._unary()]
        while (token := self._peek()) is not None and token[0] != "rp" and token != ("w", "OR"):
            if token == ("w", "AND"):
                self.pos += 1
            nodes.append(self._unary())
        return nodes[0] if len(nodes) == 1 else All(tuple(nodes))

    def _unary(self) -> Node:
        if self._peek() == ("w", "NOT"):
            self.pos += 1
            return Not(self._unary())
        return self._primary()

    def _primary(self) -> Node:
        kind, text = self._next()
        if kind == "lp":
            inner = self._expr()
            if self._next()[0] != "rp":
                raise QueryError("missing ')'")
            return inner
        if kind == "q":
            return Term(None, (_unquote(text),))
        if kind == "rp" or text in ("AND", "OR"):
            raise QueryError(f"unexpected {text!r}")
        negated = text.startswith("-") and len(text) > 1
        word = text[1:] if negated else text
        facet, colon, value = word.partition(":")
        node: Node = Term(facet.lower(), self._values(value)) if colon and facet else Term(None, (word,))
        return Not(node) if negated else node

    def _values(self, inline: str) -> tuple[str, ...]:
        if inline:
            return (inline,)
        kind, text = self._next()
        if kind == "q":
            return (_unquote(text),)
        if kind == "w":
            return (text,)
        if kind != "lp":
            raise QueryError("a facet needs a value")
        values: list[str] = []
        while True:
            kind, text = self._next()
            if kind not in ("w", "q") or text in ("AND", "OR", "NOT"):
                raise QueryError("a facet group holds values joined by OR")
            values.append(_unquote(text) if kind == "q" else text)
            kind, text = self._next()
            if kind == "rp":
                return tuple(values)
            if (kind, text) != ("w", "OR"):
                raise QueryError("values inside a facet group are joined by OR")


def _unquote(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        raise QueryError(f"bad quoted value {text}") from None
    return str(value)


def parse_query(text: str) -> Node:
    """Parse Datadog's incident search syntax: `state:(active OR stable) AND team:nlp -severity:SEV-1`."""
    return _Parser(_tokenize(text)).parse()


def query_facets(node: Node) -> set[str]:
    """Every facet name a query uses."""
    if isinstance(node, Term):
        return {node.facet} if node.facet is not None else set()
    if isinstance(node, Not):
        return query_facets(node.child)
    out: set[str] = set()
    for child in node.children:
        out |= query_facets(child)
    return out


def matches(node: Node, values_of: Callable[[str | None], list[str]]) -> bool:
    """Evaluate a parsed query; `values_of(facet)` gives an incident's values for a facet (None: the title)."""
    if isinstance(node, Term):
        actual = values_of(node.facet)
        if node.facet is None:
            return any(_text_matches(a, p) for a in actual for p in node.values)
        return any(_value_matches(a, p) for a in actual for p in node.values)
    if isinstance(node, Not):
        return not matches(node.child, values_of)
    if isinstance(node, All):
        return all(matches(child, values_of) for child in node.children)
    return any(matches(child, values_of) for child in node.children)


def _glob(pattern: str) -> str:
    return pattern.lower().replace("[", "[[]")


def _value_matches(actual: str, pattern: str) -> bool:
    if "*" in pattern:
        return fnmatch.fnmatchcase(actual.lower(), _glob(pattern))
    return actual.lower() == pattern.lower()


def _text_matches(title: str, pattern: str) -> bool:
    # Free text finds words anywhere in the title, with or without wildcards.
    if "*" in pattern:
        return fnmatch.fnmatchcase(title.lower(), f"*{_glob(pattern)}*")
    return pattern.lower() in title.lower()


# -- stored objects -------------------------------------------------------------------------------------


@dataclass
class IncidentTypeRecord:
    """An incident type (the org's default one is created at reset)."""

    id: str
    name: str
    description: str
    is_default: bool
    prefix: str
    created: datetime
    modified: datetime


@dataclass
class FieldDef:
    """A user-defined incident field."""

    id: str
    name: str
    type_code: int
    display_name: str
    incident_type_id: str
    created: datetime
    modified: datetime
    valid_values: list[dict[str, str]] | None = None
    required: bool = False
    collected: str | None = None
    category: str | None = None
    default_value: str | None = None
    ordinal: str | None = None
    tag_key: str | None = None

    @property
    def kind(self) -> str:
        """The incident field value type (`dropdown`, `textbox`, ...)."""
        return TYPE_KINDS[self.type_code]

    @property
    def allowed(self) -> tuple[str, ...] | None:
        """Closed value set for dropdown/multiselect fields with valid values, else None."""
        if self.kind in VALUED_KINDS and self.valid_values:
            return tuple(v["value"] for v in self.valid_values)
        return None


@dataclass
class RuleRecord:
    """An incident notification rule."""

    id: str
    conditions: list[dict[str, Any]]
    handles: list[str]
    trigger: str
    enabled: bool
    renotify_on: list[str]
    visibility: str
    incident_type_id: str
    created: datetime
    modified: datetime
    notification_template: dict[str, Any] | None = None


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


Notification = tuple[str, dict[str, str]]


class IncidentsModule(BaseModule):
    """Incidents API of the sandbox: incidents, search, types, custom fields and notification rules."""

    name = "incidents"

    def __init__(self, sandbox: Any) -> None:
        super().__init__(sandbox)
        self._incidents: dict[str, StoredIncident] = {}
        self._types: dict[str, IncidentTypeRecord] = {}
        self._fields: dict[str, FieldDef] = {}
        self._rules: dict[str, RuleRecord] = {}
        self._next_public_id = 1
        self._notifications: deque[dict[str, Any]] = deque(maxlen=500)
        self.reset()

    # -- module protocol ----------------------------------------------------------------------------

    def routes(self) -> list[Route]:
        """Incidents, search, incident types, user-defined fields, notification rules."""
        fields = f"{CONFIG}/user-defined-fields"
        rules = f"{CONFIG}/notification-rules"
        types = f"{CONFIG}/types"
        return [
            Route(INCIDENTS, ("POST",), self._create),
            Route(INCIDENTS, ("GET",), self._list),
            Route(f"{INCIDENTS}/search", ("GET",), self._search),
            Route(f"{INCIDENTS}/<incident_id>", ("GET",), self._get),
            Route(f"{INCIDENTS}/<incident_id>", ("PATCH",), self._update),
            Route(f"{INCIDENTS}/<incident_id>", ("DELETE",), self._delete),
            Route(types, ("GET",), _jsonapi(self._types_list)),
            Route(types, ("POST",), _jsonapi(self._type_create)),
            Route(f"{types}/<type_id>", ("GET",), _jsonapi(self._type_get)),
            Route(f"{types}/<type_id>", ("PATCH",), _jsonapi(self._type_update)),
            Route(f"{types}/<type_id>", ("DELETE",), _jsonapi(self._type_delete)),
            Route(fields, ("GET",), _jsonapi(self._fields_list)),
            Route(fields, ("POST",), _jsonapi(self._field_create)),
            Route(f"{fields}/<field_id>", ("GET",), _jsonapi(self._field_get)),
            Route(f"{fields}/<field_id>", ("PATCH",), _jsonapi(self._field_update)),
            Route(f"{fields}/<field_id>", ("DELETE",), _jsonapi(self._field_delete)),
            Route(rules, ("GET",), _jsonapi(self._rules_list)),
            Route(rules, ("POST",), _jsonapi(self._rule_create)),
            Route(f"{rules}/<rule_id>", ("GET",), _jsonapi(self._rule_get)),
            Route(f"{rules}/<rule_id>", ("PUT",), _jsonapi(self._rule_update)),
            Route(f"{rules}/<rule_id>", ("DELETE",), _jsonapi(self._rule_delete)),
        ]

    def reset(self) -> None:
        """Forget everything; the organization keeps one default incident type, as a real org does."""
        self._incidents.clear()
        self._fields.clear()
        self._rules.clear()
        self._notifications.clear()
        self._next_public_id = 1
        now = self.sb.clock.now_dt()
        default = IncidentTypeRecord(str(uuid.uuid4()), "Incident", "", True, "IR", now, now)
        self._types = {default.id: default}

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
                    "fields": self._plain_fields(inc),
                    # There is no public timeline API; the dump is where the initial note can be read.
                    "initial_cells": inc.initial_cells,
                    "created": _iso(inc.created),
                    "modified": _iso(inc.modified),
                }
                for inc in self._incidents.values()
            ],
            "incident_types": [{"id": t.id, "name": t.name, "is_default": t.is_default} for t in self._types.values()],
            "fields": [
                {"id": f.id, "name": f.name, "kind": f.kind, "allowed": f.allowed} for f in self._fields.values()
            ],
            "notification_rules": [self._rule_view(r)["attributes"] | {"id": r.id} for r in self._rules.values()],
            "next_public_id": self._next_public_id,
            "notifications": list(self._notifications),
        }

    # -- incidents: handlers -------------------------------------------------------------------------

    def _create(self, request: Request) -> Response:
        body = json_object(request)
        data = _data(body, "incidents")
        attrs = _object(data.get("attributes"), "data.attributes", required=True)
        with self.sb.lock:
            incident = self._new_incident(data, attrs)
            view = {"data": self._incident_view(incident, full=True)}
            fired = self._notifications_for(incident, CREATED_TRIGGER, changed=None)
        self._fire(fired)
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
            fired = self._notifications_for(incident, MODIFIED_TRIGGER, changed=changed) if changed else []
        self._fire(fired)
        return json_response(view)

    def _delete(self, request: Request, incident_id: str) -> Response:
        with self.sb.lock:
            self._incident(incident_id)
            del self._incidents[incident_id]
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
            found = [i for i in self._incidents.values() if matches(query, self._facet_reader(i))]
            found.sort(key=lambda i: i.public_id, reverse=sort == "-created")
            page = found[offset : offset + size]
            out = self._search_answer(found, page, offset)
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
            type_id = self._default_type().id
        elif not isinstance(type_id, str) or type_id not in self._types:
            raise ApiError(404, f"incident type {type_id} not found")
        values = self._validate_fields(attrs.get("fields"), current=None)
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
        incident.fields = {**BUILTIN_DEFAULTS, **self._field_defaults(), **values}
        incident.state_spans.append([incident.state, now.timestamp(), None])
        if incident.state in ENDED_STATES:
            incident.resolved = now
        self._next_public_id += 1
        self._incidents[incident.id] = incident
        return incident

    def _apply_update(
        self, incident: StoredIncident, attrs: Mapping[str, Any], relationships: Mapping[str, Any]
    ) -> set[str]:
        before = self._snapshot(incident)
        values = self._validate_fields(attrs.get("fields"), current=incident)
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

    def _field_kind(self, name: str) -> tuple[str, tuple[str, ...] | None] | None:
        if name in BUILTIN_FIELDS:
            return BUILTIN_FIELDS[name]
        definition = self._field_by_name(name)
        return (definition.kind, definition.allowed) if definition else None

    def _field_by_name(self, name: str) -> FieldDef | None:
        return next((f for f in self._fields.values() if f.name == name), None)

    def _field_defaults(self) -> dict[str, FieldValue]:
        out: dict[str, FieldValue] = {}
        for definition in self._fields.values():
            if definition.default_value is not None:
                multi = definition.kind in MULTI_KINDS
                out[definition.name] = [definition.default_value] if multi else definition.default_value
        return out

    def _validate_fields(self, raw: Any, *, current: StoredIncident | None) -> dict[str, FieldValue]:
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
            spec = self._field_kind(name)
            if spec is None:
                raise ApiError(
                    400, f"Invalid field '{name}': no such incident field is defined (run `gpufarm datadog apply`)"
                )
            out[name] = _field_value(name, obj, *spec)
        return out

    def _plain_fields(self, incident: StoredIncident) -> dict[str, FieldValue]:
        out: dict[str, FieldValue] = {name: incident.fields.get(name) for name in BUILTIN_FIELDS}
        for definition in self._fields.values():
            out[definition.name] = incident.fields.get(definition.name)
        out[SLUG] = incident.slug
        return out

    def _encoded_fields(self, incident: StoredIncident) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, (kind, _) in BUILTIN_FIELDS.items():
            out[name] = {"type": kind, "value": incident.fields.get(name)}
        for definition in self._fields.values():
            out[definition.name] = {"type": definition.kind, "value": incident.fields.get(definition.name)}
        out[SLUG] = {"type": "textbox", "value": incident.slug}
        return out

    # -- incidents: search support --------------------------------------------------------------------

    def _is_facet(self, facet: str) -> bool:
        builtin = ("title", "public_id", "id", "customer_impacted", "is_test", "incident_type", "commander", SLUG)
        return facet in builtin or self._field_kind(facet) is not None

    def _facet_reader(self, incident: StoredIncident) -> Callable[[str | None], list[str]]:
        def values_of(facet: str | None) -> list[str]:
            if facet is None or facet == "title":
                return [incident.title]
            special: dict[str, list[str]] = {
                "public_id": [str(incident.public_id)],
                "id": [incident.id],
                "customer_impacted": [str(incident.customer_impacted).lower()],
                "is_test": [str(incident.is_test).lower()],
                "incident_type": [incident.incident_type_id, self._types[incident.incident_type_id].name]
                if incident.incident_type_id in self._types
                else [incident.incident_type_id],
                "commander": [incident.commander_id] if incident.commander_id else [],
                SLUG: [incident.slug],
            }
            if facet in special:
                return special[facet]
            value = incident.fields.get(facet)
            if value is None:
                return []
            return list(value) if isinstance(value, list) else [value]

        return values_of

    def _search_answer(self, found: list[StoredIncident], page: list[StoredIncident], offset: int) -> dict[str, Any]:
        return {
            "data": {
                "type": "incidents_search_results",
                "attributes": {
                    "total": len(found),
                    "facets": self._facets(found),
                    "incidents": [{"data": self._incident_view(i, full=True, analytics=True)} for i in page],
                },
                "relationships": {
                    "incidents_relationship": {"data": [{"type": "incidents", "id": i.id} for i in page]}
                },
            },
            # Recorded: search answers carry next_offset on every page, the last one included.
            "meta": {"pagination": {"offset": offset, "next_offset": offset + len(page), "size": len(page)}},
        }

    def _facets(self, found: list[StoredIncident]) -> dict[str, Any]:
        n = len(found)
        users = [_user_facet(SANDBOX_USER_ID, n)] if n else []
        return {
            "severity": _counts((i.severity for i in found), SEVERITIES),
            "time_to_repair": [_aggregate("time_to_repair", [])],
            "visibility": _counts(["organization"] * n),
            "responder": _user_facets(r for i in found for r in i.responders),
            "impact": _counts("customer" if i.customer_impacted else "none" for i in found),
            "time_to_detect": [_aggregate("time_to_detect", [])],
            "postmortem": [{"name": "No", "count": n}, {"name": "Yes", "count": 0}],
            "time_to_resolve": [_aggregate("time_to_resolve", [_time_to_resolve(i) for i in found if i.resolved])],
            "is_test": _bool_counts(i.is_test for i in found),
            "state": _counts((i.state for i in found), STATES),
            "customer_impacted": _bool_counts(i.customer_impacted for i in found),
            "fields": self._field_facets(found),
            "created_by": users,
            "declared_by": users,
            "last_modified_by": users,
            "commander": _user_facets(i.commander_id for i in found if i.commander_id),
            "incident_type": [
                {"name": self._types[t].name if t in self._types else t, "count": c, "id": t}
                for t, c in Counter(i.incident_type_id for i in found).most_common()
            ],
        }

    def _field_facets(self, found: list[StoredIncident]) -> list[dict[str, Any]]:
        specs: list[tuple[str, tuple[str, ...] | None]] = [
            (name, allowed) for name, (_, allowed) in BUILTIN_FIELDS.items() if name not in ("severity", "state")
        ]
        specs += [(f.name, f.allowed) for f in self._fields.values()]
        specs.append((SLUG, None))
        out = []
        for name, allowed in sorted(specs):
            values: list[str] = []
            for incident in found:
                value = incident.slug if name == SLUG else incident.fields.get(name)
                values.extend(value if isinstance(value, list) else [value] if value is not None else [])
            out.append({"name": name, "facets": _counts(values, allowed or ())})
        return out

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
            "resolved": _iso(incident.resolved),
            "customer_impact_scope": incident.customer_impact_scope,
            "customer_impact_start": _iso(incident.customer_impact_start),
            "customer_impact_end": _iso(incident.customer_impact_end),
            "customer_impacted": incident.customer_impacted,
            "notification_handles": incident.notification_handles,
            "created": _iso(incident.created),
            "modified": _iso(incident.modified),
            "detected": _iso(incident.detected),
            "creation_idempotency_key": None,
            "customer_impact_duration": _impact_duration(incident),
            "time_to_detect": 0,
            "time_to_repair": 0,
            "time_to_internal_response": 0,
            "time_to_resolve": _time_to_resolve(incident) if incident.resolved else 0,
            "archived": None,
            "is_test": incident.is_test,
            "declared": _iso(incident.created),
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
                attributes[key] = _user_expanded(SANDBOX_USER_ID)
            attributes[f"{key}_uuid"] = None if full else SANDBOX_USER_ID
        if full:
            attributes["commander"] = _user_expanded(incident.commander_id) if incident.commander_id else None
        return {
            "type": "incidents",
            "id": incident.id,
            "attributes": attributes,
            "relationships": self._relationships(incident),
        }

    def _relationships(self, incident: StoredIncident) -> dict[str, Any]:
        me = {"data": _user_ref(SANDBOX_USER_ID)}
        return {
            "created_by_user": me,
            "last_modified_by_user": me,
            "commander_user": {"data": _user_ref(incident.commander_id) if incident.commander_id else None},
            "declared_by_user": me,
            "user_defined_fields": {
                "data": [{"type": "user_defined_field", "id": f.id} for f in self._fields.values()]
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
        return [_user_expanded(uid)["data"] for uid in ids]

    # -- notifications ----------------------------------------------------------------------------------

    def _notifications_for(
        self, incident: StoredIncident, trigger: str, changed: set[str] | None
    ) -> list[Notification]:
        """Webhook firings for this change; computed under the lock, fired after it is released."""
        if incident.is_test:
            return []
        handles: list[tuple[str, str]] = []
        for rule in self._rules.values():
            if not rule.enabled or rule.trigger != trigger or rule.incident_type_id != incident.incident_type_id:
                continue
            if not self._conditions_match(rule, incident):
                continue
            if trigger == MODIFIED_TRIGGER and rule.renotify_on and not set(rule.renotify_on) & (changed or set()):
                continue
            handles += [(rule.id, h) for h in rule.handles]
        if trigger == CREATED_TRIGGER:
            handles += [("notification_handles", h["handle"]) for h in incident.notification_handles or []]
        out: list[Notification] = []
        seen: set[str] = set()
        event = "incident_created" if trigger == CREATED_TRIGGER else "incident_modified"
        for source, handle in handles:
            self._notifications.append(
                {"incident": incident.slug, "trigger": trigger, "source": source, "handle": handle}
            )
            if handle.startswith(WEBHOOK_HANDLE) and handle not in seen:
                seen.add(handle)
                out.append((handle[len(WEBHOOK_HANDLE) :], self._variables(incident, event)))
        return out

    def _conditions_match(self, rule: RuleRecord, incident: StoredIncident) -> bool:
        read = self._facet_reader(incident)
        for condition in rule.conditions:
            actual = {v.lower() for v in read(str(condition["field"]))}
            if not actual & {str(v).lower() for v in condition["values"]}:
                return False
        return True

    def _variables(self, incident: StoredIncident, event_type: str) -> dict[str, str]:
        plain = {k: v for k, v in self._plain_fields(incident).items() if v is not None}
        url = f"{self.sb.base_url}/incidents/{incident.public_id}"
        message = f"{incident.slug}: {incident.title}\nState: {incident.state}\nSeverity: {incident.severity}\n{url}"
        commander = _user_expanded(incident.commander_id)["data"]["attributes"] if incident.commander_id else None
        impact = {
            "customer_impacted": incident.customer_impacted,
            "customer_impact_scope": incident.customer_impact_scope,
            "customer_impact_start": _iso(incident.customer_impact_start),
            "customer_impact_end": _iso(incident.customer_impact_end),
        }
        return {
            "INCIDENT_PUBLIC_ID": str(incident.public_id),
            "INCIDENT_UUID": incident.id,
            "INCIDENT_TITLE": incident.title,
            "INCIDENT_STATUS": incident.state,
            "INCIDENT_SEVERITY": incident.severity,
            "INCIDENT_FIELDS": json.dumps(plain),
            "INCIDENT_URL": url,
            "INCIDENT_MSG": message,
            "INCIDENT_COMMANDER": json.dumps(commander),
            "INCIDENT_CUSTOMER_IMPACT": json.dumps(impact),
            "INCIDENT_TODOS": "[]",
            "INCIDENT_INTEGRATIONS": "[]",
            "INCIDENT_ATTACHMENTS": "[]",
            "EVENT_TYPE": event_type,
            "EVENT_TITLE": f"{incident.slug}: {incident.title}",
            "EVENT_MSG": message,
            "LINK": url,
            "LAST_UPDATED": str(int(incident.modified.timestamp() * 1000)),
        }

    def _fire(self, notifications: list[Notification]) -> None:
        for webhook, variables in notifications:
            self.sb.webhooks.fire(webhook, variables, origin="incident")

    # -- incident types -----------------------------------------------------------------------------------

    def _default_type(self) -> IncidentTypeRecord:
        return next(t for t in self._types.values() if t.is_default)

    def _type(self, type_id: str) -> IncidentTypeRecord:
        record = self._types.get(type_id)
        if record is None:
            raise JsonApiError(404, "Not Found")
        return record

    def _types_list(self, request: Request) -> Response:
        with self.sb.lock:
            return json_response({"data": [_type_view(t) for t in self._types.values()]})

    def _type_get(self, request: Request, type_id: str) -> Response:
        with self.sb.lock:
            return json_response({"data": _type_view(self._type(type_id))})

    def _type_create(self, request: Request) -> Response:
        data = _jsonapi_data(json_object(request), "incident_types")
        attrs = _jsonapi_object(data.get("attributes"), "attributes")
        name = attrs.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _jsonapi_bad("attributes.name is required")
        description = _jsonapi_str(attrs.get("description", ""), "description")
        is_default = attrs.get("is_default", False)
        if not isinstance(is_default, bool):
            raise _jsonapi_bad("attributes.is_default must be a boolean")
        now = self.sb.clock.now_dt()
        record = IncidentTypeRecord(str(uuid.uuid4()), name, description, is_default, "IR", now, now)
        with self.sb.lock:
            if is_default:
                for other in self._types.values():
                    other.is_default = False
            self._types[record.id] = record
            return json_response({"data": _type_view(record)}, 201)

    def _type_update(self, request: Request, type_id: str) -> Response:
        data = _jsonapi_data(json_object(request), "incident_types")
        attrs = _jsonapi_object(data.get("attributes"), "attributes")
        with self.sb.lock:
            record = self._type(type_id)
            name = attrs.get("name", record.name)
            if not isinstance(name, str) or not name.strip():
                raise _jsonapi_bad("attributes.name must be a non-empty string")
            description = _jsonapi_str(attrs.get("description", record.description), "description")
            is_default = attrs.get("is_default", record.is_default)
            if not isinstance(is_default, bool):
                raise _jsonapi_bad("attributes.is_default must be a boolean")
            if record.is_default and not is_default:
                raise _jsonapi_bad("make another incident type the default instead")
            if is_default:
                for other in self._types.values():
                    other.is_default = False
            record.name, record.description, record.is_default = name, description, is_default
            record.modified = self.sb.clock.now_dt()
            return json_response({"data": _type_view(record)})

    def _type_delete(self, request: Request, type_id: str) -> Response:
        with self.sb.lock:
            record = self._type(type_id)
            if record.is_default:
                raise _jsonapi_bad("the default incident type cannot be deleted")
            del self._types[type_id]
        return empty_response(204)

    # -- user-defined fields ------------------------------------------------------------------------------

    def _field(self, field_id: str) -> FieldDef:
        definition = self._fields.get(field_id)
        if definition is None:
            raise JsonApiError(404, "Not Found", "user-defined field not found")
        return definition

    def _fields_list(self, request: Request) -> Response:
        size = _jsonapi_int(request, "page[size]", 1000, maximum=1000)
        number = _jsonapi_int(request, "page[number]", 0)
        wanted_type = request.args.get("filter[incident-type]")
        with self.sb.lock:
            chosen = [f for f in self._fields.values() if wanted_type in (None, "", f.incident_type_id)]
            page = chosen[number * size : number * size + size]
            return json_response(
                {"data": [_field_view(f) for f in page], "meta": {"offset": number * size, "size": len(page)}}
            )

    def _field_get(self, request: Request, field_id: str) -> Response:
        with self.sb.lock:
            return json_response({"data": _field_view(self._field(field_id))})

    def _field_create(self, request: Request) -> Response:
        data = _jsonapi_data(json_object(request), "user_defined_field")
        attrs = _jsonapi_object(data.get("attributes"), "attributes")
        name = attrs.get("name")
        if not isinstance(name, str) or not FIELD_NAME.match(name):
            raise _jsonapi_bad("attributes.name must start with a letter or digit and hold letters, digits, _ or .")
        type_code = attrs.get("type")
        if isinstance(type_code, bool) or not isinstance(type_code, int) or not 1 <= type_code <= 8:
            raise _jsonapi_bad("attributes.type must be an integer from 1 to 8")
        if type_code not in TYPE_KINDS:
            raise _jsonapi_bad("number (7) and datetime (8) fields are not supported by the sandbox; use a textbox")
        type_id = _relationship_id(data.get("relationships"), "incident_type", required=True)
        with self.sb.lock:
            if type_id not in self._types:
                raise JsonApiError(404, "Not Found", "incident type not found")
            if name in BUILTIN_FIELDS or name == SLUG or self._field_by_name(name):
                raise _jsonapi_bad(f"a field named '{name}' already exists")
            now = self.sb.clock.now_dt()
            definition = FieldDef(
                id=str(uuid.uuid4()),
                name=name,
                type_code=type_code,
                display_name=name.replace("_", " ").replace(".", " ").title(),
                incident_type_id=type_id,
                created=now,
                modified=now,
                ordinal=str(len(self._fields) + 1),
            )
            _apply_field_attributes(definition, attrs)
            self._fields[definition.id] = definition
            return json_response({"data": _field_view(definition)}, 201)

    def _field_update(self, request: Request, field_id: str) -> Response:
        data = _jsonapi_data(json_object(request), "user_defined_field")
        if "id" in data and data["id"] != field_id:
            raise _jsonapi_bad("data.id does not match the field id in the path")
        attrs = _jsonapi_object(data.get("attributes"), "attributes")
        with self.sb.lock:
            current = self._field(field_id)
            updated = FieldDef(**current.__dict__)
            _apply_field_attributes(updated, attrs)
            updated.modified = self.sb.clock.now_dt()
            self._fields[field_id] = updated
            return json_response({"data": _field_view(updated)})

    def _field_delete(self, request: Request, field_id: str) -> Response:
        with self.sb.lock:
            self._field(field_id)
            del self._fields[field_id]
        return empty_response(204)

    # -- notification rules -------------------------------------------------------------------------------

    def _rule(self, rule_id: str) -> RuleRecord:
        rule = self._rules.get(rule_id)
        if rule is None:
            raise _generic_not_found("rule not found")
        return rule

    def _rules_list(self, request: Request) -> Response:
        with self.sb.lock:
            rules = [self._rule_view(r) for r in self._rules.values()]
        # Recorded: a single full page still carries next_offset.
        return json_response(
            {"data": rules, "meta": {"pagination": {"offset": 0, "next_offset": len(rules), "size": len(rules)}}}
        )

    def _rule_get(self, request: Request, rule_id: str) -> Response:
        with self.sb.lock:
            return json_response({"data": self._rule_view(self._rule(rule_id))})

    def _rule_create(self, request: Request) -> Response:
        data = _jsonapi_data(json_object(request), "incident_notification_rules")
        parsed = _rule_attributes(_jsonapi_object(data.get("attributes"), "attributes"))
        with self.sb.lock:
            type_id = self._rule_type(data.get("relationships"))
            now = self.sb.clock.now_dt()
            rule = RuleRecord(id=str(uuid.uuid4()), incident_type_id=type_id, created=now, modified=now, **parsed)
            rule.notification_template = _template_ref(data.get("relationships"))
            self._rules[rule.id] = rule
            return json_response({"data": self._rule_view(rule)}, 201)

    def _rule_update(self, request: Request, rule_id: str) -> Response:
        data = _jsonapi_data(json_object(request), "incident_notification_rules")
        if "id" in data and data["id"] != rule_id:
            raise _jsonapi_bad("data.id does not match the rule id in the path")
        parsed = _rule_attributes(_jsonapi_object(data.get("attributes"), "attributes"))
        with self.sb.lock:
            # Recorded: an unknown incident type is reported before an unknown rule.
            type_id = self._rule_type(data.get("relationships"))
            current = self._rule(rule_id)
            rule = RuleRecord(
                id=rule_id,
                incident_type_id=type_id,
                created=current.created,
                modified=self.sb.clock.now_dt(),
                **parsed,
            )
            rule.notification_template = _template_ref(data.get("relationships"))
            self._rules[rule_id] = rule
            return json_response({"data": self._rule_view(rule)})

    def _rule_delete(self, request: Request, rule_id: str) -> Response:
        with self.sb.lock:
            self._rule(rule_id)
            del self._rules[rule_id]
        return empty_response(204)

    def _rule_type(self, relationships: Any) -> str:
        type_id = _relationship_id(relationships, "incident_type", required=False)
        if type_id is None:
            return self._default_type().id
        if type_id not in self._types:
            raise _generic_not_found("incident type doesn't exist")
        return type_id

    @staticmethod
    def _rule_view(rule: RuleRecord) -> dict[str, Any]:
        me = {"data": {"id": SANDBOX_USER_ID, "type": "users"}}
        relationships: dict[str, Any] = {
            "created_by_user": me,
            "incident_type": {"data": {"id": rule.incident_type_id, "type": "incident_types"}},
            "last_modified_by_user": me,
        }
        if rule.notification_template is not None:
            relationships["notification_template"] = {"data": rule.notification_template}
        return {
            "id": rule.id,
            "type": "incident_notification_rules",
            "attributes": {
                "conditions": rule.conditions,
                "created": _iso(rule.created),
                "enabled": rule.enabled,
                "handles": rule.handles,
                "modified": _iso(rule.modified),
                "renotify_on": rule.renotify_on,
                "trigger": rule.trigger,
                "visibility": rule.visibility,
            },
            "relationships": relationships,
        }


# -- helpers: request parsing ---------------------------------------------------------------------------


def _jsonapi(handler: Callable[..., Response]) -> Callable[..., Response]:
    """Answer JsonApiError in the config endpoints' JSON:API error shape."""

    def wrapped(request: Request, **kwargs: Any) -> Response:
        try:
            return handler(request, **kwargs)
        except JsonApiError as exc:
            return exc.response()

    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped


def _data(body: Mapping[str, Any], expected: str) -> dict[str, Any]:
    data = body.get("data")
    if not isinstance(data, dict):
        raise ApiError(400, "data is required and must be an object")
    if data.get("type") != expected:
        raise ApiError(400, f'got type "{data.get("type")}" expected one of "{expected}"')
    return data


def _jsonapi_data(body: Mapping[str, Any], expected: str) -> dict[str, Any]:
    data = body.get("data")
    if not isinstance(data, dict):
        raise _jsonapi_bad("data is required and must be an object")
    if data.get("type") != expected:
        raise _jsonapi_bad(f'got type "{data.get("type")}" expected one of "{expected}"')
    return data


def _jsonapi_object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _jsonapi_bad(f"data.{name} is required and must be an object")
    return value


def _jsonapi_str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise _jsonapi_bad(f"attributes.{name} must be a string")
    return value


def _jsonapi_int(request: Request, name: str, default: int, *, maximum: int | None = None) -> int:
    try:
        value = query_int(request, name, default, maximum=maximum)
    except ApiError as exc:
        raise _jsonapi_bad(exc.messages[0]) from None
    return default if value is None else value


def _relationship_id(relationships: Any, name: str, *, required: bool) -> str | None:
    if relationships is None and not required:
        return None
    rel = relationships.get(name) if isinstance(relationships, dict) else None
    if rel is None and not required:
        return None
    data = rel.get("data") if isinstance(rel, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
        raise _jsonapi_bad(f"relationships.{name}.data.id is required")
    return str(data["id"])


def _template_ref(relationships: Any) -> dict[str, Any] | None:
    rel = relationships.get("notification_template") if isinstance(relationships, dict) else None
    data = rel.get("data") if isinstance(rel, dict) else None
    if not isinstance(data, dict):
        return None
    return {"id": str(data.get("id")), "type": "notification_templates"}


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


def _apply_field_attributes(definition: FieldDef, attrs: Mapping[str, Any]) -> None:
    """Validate and set the updatable attributes of a field definition (create and PATCH)."""
    if "display_name" in attrs:
        definition.display_name = _jsonapi_str(attrs["display_name"], "display_name")
    for key in ("ordinal", "default_value", "tag_key"):
        if key in attrs:
            value = attrs[key]
            if value is not None and not isinstance(value, str):
                raise _jsonapi_bad(f"attributes.{key} must be a string or null")
            setattr(definition, key, value)
    if "required" in attrs:
        if attrs["required"] is not None and not isinstance(attrs["required"], bool):
            raise _jsonapi_bad("attributes.required must be a boolean")
        definition.required = bool(attrs["required"])
    for key, choices in (("collected", COLLECTED), ("category", CATEGORIES)):
        if key in attrs:
            if attrs[key] is not None and attrs[key] not in choices:
                raise _jsonapi_bad(f"attributes.{key} must be one of {', '.join(choices)} or null")
            setattr(definition, key, attrs[key])
    if "valid_values" in attrs:
        definition.valid_values = _valid_values(attrs["valid_values"], definition.kind)
    if definition.required and definition.collected is not None:
        raise _jsonapi_bad("collected cannot be set on required fields")
    allowed = definition.allowed
    if definition.default_value is not None and allowed is not None and definition.default_value not in allowed:
        raise _jsonapi_bad("default_value must be one of the valid values")


def _valid_values(value: Any, kind: str) -> list[dict[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _jsonapi_bad("attributes.valid_values must be a list")
    if value and kind not in VALUED_KINDS:
        raise _jsonapi_bad(f"valid_values apply to dropdown and multiselect fields, not {kind}")
    if len(value) > MAX_VALID_VALUES:
        raise _jsonapi_bad(f"at most {MAX_VALID_VALUES} valid values")
    out: list[dict[str, str]] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("value"), str) or not item["value"]:
            raise _jsonapi_bad("each valid value needs a non-empty 'value' string")
        entry = {"display_name": str(item.get("display_name") or item["value"]), "value": item["value"]}
        for key in ("description", "short_description"):
            if isinstance(item.get(key), str):
                entry[key] = item[key]
        out.append(entry)
    names = [v["value"] for v in out]
    if len(set(names)) != len(names):
        raise _jsonapi_bad("valid values must be unique")
    return out


def _rule_attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    conditions = attrs.get("conditions")
    if not isinstance(conditions, list):
        raise _jsonapi_bad("attributes.conditions is required and must be a list")
    for condition in conditions:
        if not isinstance(condition, dict) or not isinstance(condition.get("field"), str) or not condition["field"]:
            raise _jsonapi_bad("each condition needs a 'field' string")
        values = condition.get("values")
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise _jsonapi_bad("each condition needs a non-empty 'values' list of strings")
    handles = attrs.get("handles")
    if not isinstance(handles, list) or not handles or not all(isinstance(h, str) and h for h in handles):
        raise _jsonapi_bad("attributes.handles is required and must be a non-empty list of strings")
    trigger = attrs.get("trigger")
    if trigger not in TRIGGERS:
        raise _jsonapi_bad(f"attributes.trigger must be one of {', '.join(TRIGGERS)}")
    renotify = attrs.get("renotify_on", [])
    if not isinstance(renotify, list) or not all(isinstance(v, str) for v in renotify):
        raise _jsonapi_bad("attributes.renotify_on must be a list of field names")
    # Spec default: a rule is disabled unless `enabled` says otherwise.
    enabled = attrs.get("enabled", False)
    if not isinstance(enabled, bool):
        raise _jsonapi_bad("attributes.enabled must be a boolean")
    visibility = attrs.get("visibility", "organization")
    if visibility not in VISIBILITIES:
        raise _jsonapi_bad(f"attributes.visibility must be one of {', '.join(VISIBILITIES)}")
    return {
        "conditions": [{"field": c["field"], "values": list(c["values"])} for c in conditions],
        "handles": list(handles),
        "trigger": trigger,
        "enabled": enabled,
        "renotify_on": list(renotify),
        "visibility": visibility,
    }


# -- helpers: rendering ------------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="microseconds") if value is not None else None


def _user_ref(user_id: str) -> dict[str, str]:
    return {"type": "users", "id": user_id}


def _user_attributes(user_id: str) -> dict[str, Any]:
    if user_id == SANDBOX_USER_ID:
        return dict(SANDBOX_USER)
    # A commander named by id only: the sandbox has no users API, so it knows no more than the id.
    return {"uuid": user_id, "handle": user_id, "email": "", "name": None, "icon": ""}


def _user_expanded(user_id: str) -> dict[str, Any]:
    return {"data": {"type": "users", "id": user_id, "attributes": _user_attributes(user_id)}}


def _user_facet(user_id: str, count: int) -> dict[str, Any]:
    attrs = _user_attributes(user_id)
    return {
        "name": attrs["name"] or attrs["handle"],
        "count": count,
        "handle": attrs["handle"],
        "uuid": user_id,
        "email": attrs["email"],
    }


def _user_facets(user_ids: Iterable[str]) -> list[dict[str, Any]]:
    return [_user_facet(uid, count) for uid, count in Counter(user_ids).most_common()]


def _counts(values: Iterable[str], order: Sequence[str] = ()) -> list[dict[str, Any]]:
    counted = Counter(values)
    out: list[dict[str, Any]] = [{"name": name, "count": count} for name, count in counted.most_common()]
    out += [{"name": name, "count": 0} for name in order if name not in counted]
    return out


def _bool_counts(values: Iterable[bool]) -> list[dict[str, Any]]:
    counted = Counter(values)
    return [{"name": flag, "count": counted.get(flag, 0)} for flag in (False, True)]


def _aggregate(name: str, values: list[int]) -> dict[str, Any]:
    return {
        "name": name,
        "aggregates": {"min": float(min(values)) if values else None, "max": float(max(values)) if values else None},
    }


def _time_to_resolve(incident: StoredIncident) -> int:
    if incident.resolved is None:
        return 0
    return max(0, int((incident.resolved - incident.created).total_seconds()))


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


def _type_view(record: IncidentTypeRecord) -> dict[str, Any]:
    me = {"data": {"id": SANDBOX_USER_ID, "type": "users"}}
    return {
        "id": record.id,
        "type": "incident_types",
        "attributes": {
            "createdAt": _iso(record.created),
            "createdBy": SANDBOX_USER_ID,
            "description": record.description,
            "is_default": record.is_default,
            "lastModifiedBy": SANDBOX_USER_ID,
            "modifiedAt": _iso(record.modified),
            "name": record.name,
            "prefix": record.prefix,
        },
        "relationships": {
            "created_by_user": me,
            "google_chat_configuration": {"data": None},
            "google_meet_configuration": {"data": None},
            "last_modified_by_user": me,
            "microsoft_teams_configuration": {"data": None},
            "zoom_configuration": {"data": None},
        },
    }


def _field_view(definition: FieldDef) -> dict[str, Any]:
    me = {"data": {"id": SANDBOX_USER_ID, "type": "users"}}
    valued = definition.kind in VALUED_KINDS
    return {
        "id": definition.id,
        "type": "user_defined_field",
        "attributes": {
            "attached_to": "incidents",
            "category": definition.category,
            "collected": definition.collected,
            "created": _iso(definition.created),
            "default_value": definition.default_value,
            "deleted": None,
            "display_name": definition.display_name,
            "metadata": None,
            "modified": _iso(definition.modified),
            "name": definition.name,
            "ordinal": definition.ordinal,
            "prerequisite": None,
            "required": definition.required,
            "reserved": False,
            "table_id": 0,
            "tag_key": definition.tag_key,
            "type": definition.type_code,
            "valid_values": (definition.valid_values or []) if valued else None,
        },
        "relationships": {
            "created_by_user": me,
            "incident_type": {"data": {"id": definition.incident_type_id, "type": "incident_types"}},
            "last_modified_by_user": me,
        },
    }
