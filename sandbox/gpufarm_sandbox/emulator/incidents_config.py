"""Sandbox: the organization's incident configuration: its user, incident types and user-defined fields.

Incident types live under `/api/v2/incidents/config/types` (the org keeps one default type, as a real org does);
each user-defined field belongs to one incident type (`relationships.incident_type`), so two types may define
fields of the same name and an incident carries the fields of its own type only. Answers follow the recorded
real traffic (tests/fixtures/datadog/v2-incidents.json) and the config endpoints' JSON:API error shape.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import ApiError, Route, empty_response, json_object, json_response, query_int

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


def jsonapi_bad(detail: str) -> JsonApiError:
    return JsonApiError(400, "Bad Request", detail)


def generic_not_found(detail: str) -> JsonApiError:
    return JsonApiError(404, "Generic Error", detail, with_status=False)


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


class IncidentConfig:
    """Incident types and user-defined fields of the sandbox's organization (state guarded by the sandbox lock)."""

    def __init__(self, context: SandboxContext) -> None:
        self.ctx = context
        self.types: dict[str, IncidentTypeRecord] = {}
        self.fields: dict[str, FieldDef] = {}
        self.reset()

    def routes(self) -> list[Route]:
        """Incident types and user-defined fields."""
        fields = f"{CONFIG}/user-defined-fields"
        types = f"{CONFIG}/types"
        return [
            Route(types, ("GET",), jsonapi(self._types_list)),
            Route(types, ("POST",), jsonapi(self._type_create)),
            Route(f"{types}/<type_id>", ("GET",), jsonapi(self._type_get)),
            Route(f"{types}/<type_id>", ("PATCH",), jsonapi(self._type_update)),
            Route(f"{types}/<type_id>", ("DELETE",), jsonapi(self._type_delete)),
            Route(fields, ("GET",), jsonapi(self._fields_list)),
            Route(fields, ("POST",), jsonapi(self._field_create)),
            Route(f"{fields}/<field_id>", ("GET",), jsonapi(self._field_get)),
            Route(f"{fields}/<field_id>", ("PATCH",), jsonapi(self._field_update)),
            Route(f"{fields}/<field_id>", ("DELETE",), jsonapi(self._field_delete)),
        ]

    def reset(self) -> None:
        """Forget every field and type but a fresh default incident type."""
        self.fields.clear()
        now = self.ctx.clock.now_dt()
        default = IncidentTypeRecord(str(uuid.uuid4()), "Incident", "", True, "IR", now, now)
        self.types = {default.id: default}

    def dump(self) -> dict[str, Any]:
        """Types and fields for `GET /_sandbox/state`."""
        return {
            "incident_types": [{"id": t.id, "name": t.name, "is_default": t.is_default} for t in self.types.values()],
            "fields": [
                {
                    "id": f.id,
                    "name": f.name,
                    "kind": f.kind,
                    "allowed": f.allowed,
                    "incident_type_id": f.incident_type_id,
                }
                for f in self.fields.values()
            ],
        }

    # -- lookups the incidents and notification modules use ------------------------------------------

    def default_type(self) -> IncidentTypeRecord:
        """The organization's default incident type."""
        return next(t for t in self.types.values() if t.is_default)

    def type_name(self, type_id: str) -> str:
        """A type's name (its id when it was deleted)."""
        record = self.types.get(type_id)
        return record.name if record else type_id

    def fields_of(self, type_id: str) -> list[FieldDef]:
        """The user-defined fields of one incident type, in creation order."""
        return [f for f in self.fields.values() if f.incident_type_id == type_id]

    def field_named(self, type_id: str, name: str) -> FieldDef | None:
        """A field of one incident type by name."""
        return next((f for f in self.fields.values() if f.incident_type_id == type_id and f.name == name), None)

    def field_kind(self, type_id: str, name: str) -> tuple[str, tuple[str, ...] | None] | None:
        """(kind, closed value set) of a field an incident of this type may carry; None when it has no such field."""
        if name in BUILTIN_FIELDS:
            return BUILTIN_FIELDS[name]
        definition = self.field_named(type_id, name)
        return (definition.kind, definition.allowed) if definition else None

    def is_field_name(self, name: str) -> bool:
        """True when a built-in field or any type's user-defined field has this name (a search facet)."""
        return name in BUILTIN_FIELDS or any(f.name == name for f in self.fields.values())

    def is_list_field(self, name: str) -> bool:
        """True when a built-in field or any type's user-defined field of this name holds a list of values."""
        if name in BUILTIN_FIELDS:
            return BUILTIN_FIELDS[name][0] in MULTI_KINDS
        return any(f.name == name and f.kind in MULTI_KINDS for f in self.fields.values())

    # -- incident types -----------------------------------------------------------------------------------

    def _type(self, type_id: str) -> IncidentTypeRecord:
        record = self.types.get(type_id)
        if record is None:
            raise JsonApiError(404, "Not Found")
        return record

    def _types_list(self, request: Request) -> Response:
        with self.ctx.lock:
            return json_response({"data": [type_view(t) for t in self.types.values()]})

    def _type_get(self, request: Request, type_id: str) -> Response:
        with self.ctx.lock:
            return json_response({"data": type_view(self._type(type_id))})

    def _type_create(self, request: Request) -> Response:
        data = jsonapi_data(json_object(request), "incident_types")
        attrs = jsonapi_object(data.get("attributes"), "attributes")
        name = attrs.get("name")
        if not isinstance(name, str) or not name.strip():
            raise jsonapi_bad("attributes.name is required")
        description = jsonapi_str(attrs.get("description", ""), "description")
        is_default = attrs.get("is_default", False)
        if not isinstance(is_default, bool):
            raise jsonapi_bad("attributes.is_default must be a boolean")
        now = self.ctx.clock.now_dt()
        record = IncidentTypeRecord(str(uuid.uuid4()), name, description, is_default, "IR", now, now)
        with self.ctx.lock:
            if is_default:
                for other in self.types.values():
                    other.is_default = False
            self.types[record.id] = record
            return json_response({"data": type_view(record)}, 201)

    def _type_update(self, request: Request, type_id: str) -> Response:
        data = jsonapi_data(json_object(request), "incident_types")
        attrs = jsonapi_object(data.get("attributes"), "attributes")
        with self.ctx.lock:
            record = self._type(type_id)
            name = attrs.get("name", record.name)
            if not isinstance(name, str) or not name.strip():
                raise jsonapi_bad("attributes.name must be a non-empty string")
            description = jsonapi_str(attrs.get("description", record.description), "description")
            is_default = attrs.get("is_default", record.is_default)
            if not isinstance(is_default, bool):
                raise jsonapi_bad("attributes.is_default must be a boolean")
            if record.is_default and not is_default:
                raise jsonapi_bad("make another incident type the default instead")
            if is_default:
                for other in self.types.values():
                    other.is_default = False
            record.name, record.description, record.is_default = name, description, is_default
            record.modified = self.ctx.clock.now_dt()
            return json_response({"data": type_view(record)})

    def _type_delete(self, request: Request, type_id: str) -> Response:
        with self.ctx.lock:
            record = self._type(type_id)
            if record.is_default:
                raise jsonapi_bad("the default incident type cannot be deleted")
            del self.types[type_id]
            # A type's fields go with it; its incidents keep their values (the sandbox deletes nothing else).
            for definition in self.fields_of(type_id):
                del self.fields[definition.id]
        return empty_response(204)

    # -- user-defined fields ------------------------------------------------------------------------------

    def _field(self, field_id: str) -> FieldDef:
        definition = self.fields.get(field_id)
        if definition is None:
            raise JsonApiError(404, "Not Found", "user-defined field not found")
        return definition

    def _fields_list(self, request: Request) -> Response:
        size = jsonapi_int(request, "page[size]", 1000, maximum=1000)
        number = jsonapi_int(request, "page[number]", 0)
        wanted_type = request.args.get("filter[incident-type]")
        with self.ctx.lock:
            chosen = [f for f in self.fields.values() if wanted_type in (None, "", f.incident_type_id)]
            page = chosen[number * size : number * size + size]
            return json_response(
                {"data": [field_view(f) for f in page], "meta": {"offset": number * size, "size": len(page)}}
            )

    def _field_get(self, request: Request, field_id: str) -> Response:
        with self.ctx.lock:
            return json_response({"data": field_view(self._field(field_id))})

    def _field_create(self, request: Request) -> Response:
        data = jsonapi_data(json_object(request), "user_defined_field")
        attrs = jsonapi_object(data.get("attributes"), "attributes")
        name = attrs.get("name")
        if not isinstance(name, str) or not FIELD_NAME.match(name):
            raise jsonapi_bad("attributes.name must start with a letter or digit and hold letters, digits, _ or .")
        type_code = attrs.get("type")
        if isinstance(type_code, bool) or not isinstance(type_code, int) or not 1 <= type_code <= 8:
            raise jsonapi_bad("attributes.type must be an integer from 1 to 8")
        if type_code not in TYPE_KINDS:
            raise jsonapi_bad("number (7) and datetime (8) fields are not supported by the sandbox; use a textbox")
        type_id = relationship_id(data.get("relationships"), "incident_type", required=True)
        with self.ctx.lock:
            if type_id not in self.types:
                raise JsonApiError(404, "Not Found", "incident type not found")
            if name in BUILTIN_FIELDS or name == SLUG or self.field_named(type_id, name):
                raise jsonapi_bad(f"a field named '{name}' already exists on this incident type")
            now = self.ctx.clock.now_dt()
            definition = FieldDef(
                id=str(uuid.uuid4()),
                name=name,
                type_code=type_code,
                display_name=name.replace("_", " ").replace(".", " ").title(),
                incident_type_id=type_id,
                created=now,
                modified=now,
                ordinal=str(len(self.fields_of(type_id)) + 1),
            )
            _apply_field_attributes(definition, attrs)
            self.fields[definition.id] = definition
            return json_response({"data": field_view(definition)}, 201)

    def _field_update(self, request: Request, field_id: str) -> Response:
        data = jsonapi_data(json_object(request), "user_defined_field")
        if "id" in data and data["id"] != field_id:
            raise jsonapi_bad("data.id does not match the field id in the path")
        attrs = jsonapi_object(data.get("attributes"), "attributes")
        with self.ctx.lock:
            current = self._field(field_id)
            updated = FieldDef(**current.__dict__)
            _apply_field_attributes(updated, attrs)
            updated.modified = self.ctx.clock.now_dt()
            self.fields[field_id] = updated
            return json_response({"data": field_view(updated)})

    def _field_delete(self, request: Request, field_id: str) -> Response:
        with self.ctx.lock:
            self._field(field_id)
            del self.fields[field_id]
        return empty_response(204)


# -- helpers ----------------------------------------------------------------------------------------------


def jsonapi(handler: Callable[..., Response]) -> Callable[..., Response]:
    """Answer JsonApiError in the config endpoints' JSON:API error shape."""

    def wrapped(request: Request, **kwargs: Any) -> Response:
        try:
            return handler(request, **kwargs)
        except JsonApiError as exc:
            return exc.response()

    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped


def jsonapi_data(body: Mapping[str, Any], expected: str) -> dict[str, Any]:
    data = body.get("data")
    if not isinstance(data, dict):
        raise jsonapi_bad("data is required and must be an object")
    if data.get("type") != expected:
        raise jsonapi_bad(f'got type "{data.get("type")}" expected one of "{expected}"')
    return data


def jsonapi_object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise jsonapi_bad(f"data.{name} is required and must be an object")
    return value


def jsonapi_str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise jsonapi_bad(f"attributes.{name} must be a string")
    return value


def jsonapi_int(request: Request, name: str, default: int, *, maximum: int | None = None) -> int:
    try:
        value = query_int(request, name, default, maximum=maximum)
    except ApiError as exc:
        raise jsonapi_bad(exc.messages[0]) from None
    return default if value is None else value


def relationship_id(relationships: Any, name: str, *, required: bool) -> str | None:
    if relationships is None and not required:
        return None
    rel = relationships.get(name) if isinstance(relationships, dict) else None
    if rel is None and not required:
        return None
    data = rel.get("data") if isinstance(rel, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
        raise jsonapi_bad(f"relationships.{name}.data.id is required")
    return str(data["id"])


def _apply_field_attributes(definition: FieldDef, attrs: Mapping[str, Any]) -> None:
    """Validate and set the updatable attributes of a field definition (create and PATCH)."""
    _set_plain_attributes(definition, attrs)
    if "valid_values" in attrs:
        definition.valid_values = _valid_values(attrs["valid_values"], definition.kind)
    if definition.required and definition.collected is not None:
        raise jsonapi_bad("collected cannot be set on required fields")
    allowed = definition.allowed
    if definition.default_value is not None and allowed is not None and definition.default_value not in allowed:
        raise jsonapi_bad("default_value must be one of the valid values")


def _set_plain_attributes(definition: FieldDef, attrs: Mapping[str, Any]) -> None:
    """display_name, the optional strings, required, collected and category, each checked as it is set."""
    if "display_name" in attrs:
        definition.display_name = jsonapi_str(attrs["display_name"], "display_name")
    for key in ("ordinal", "default_value", "tag_key"):
        if key in attrs:
            value = attrs[key]
            if value is not None and not isinstance(value, str):
                raise jsonapi_bad(f"attributes.{key} must be a string or null")
            setattr(definition, key, value)
    if "required" in attrs:
        if attrs["required"] is not None and not isinstance(attrs["required"], bool):
            raise jsonapi_bad("attributes.required must be a boolean")
        definition.required = bool(attrs["required"])
    for key, choices in (("collected", COLLECTED), ("category", CATEGORIES)):
        if key in attrs:
            if attrs[key] is not None and attrs[key] not in choices:
                raise jsonapi_bad(f"attributes.{key} must be one of {', '.join(choices)} or null")
            setattr(definition, key, attrs[key])


def _valid_values(value: Any, kind: str) -> list[dict[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise jsonapi_bad("attributes.valid_values must be a list")
    if value and kind not in VALUED_KINDS:
        raise jsonapi_bad(f"valid_values apply to dropdown and multiselect fields, not {kind}")
    if len(value) > MAX_VALID_VALUES:
        raise jsonapi_bad(f"at most {MAX_VALID_VALUES} valid values")
    out: list[dict[str, str]] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("value"), str) or not item["value"]:
            raise jsonapi_bad("each valid value needs a non-empty 'value' string")
        entry = {"display_name": str(item.get("display_name") or item["value"]), "value": item["value"]}
        for key in ("description", "short_description"):
            if isinstance(item.get(key), str):
                entry[key] = item[key]
        out.append(entry)
    names = [v["value"] for v in out]
    if len(set(names)) != len(names):
        raise jsonapi_bad("valid values must be unique")
    return out


def iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="microseconds") if value is not None else None


def user_ref(user_id: str) -> dict[str, str]:
    return {"type": "users", "id": user_id}


def user_attributes(user_id: str) -> dict[str, Any]:
    if user_id == SANDBOX_USER_ID:
        return dict(SANDBOX_USER)
    # A commander named by id only: the sandbox has no users API, so it knows no more than the id.
    return {"uuid": user_id, "handle": user_id, "email": "", "name": None, "icon": ""}


def user_expanded(user_id: str) -> dict[str, Any]:
    return {"data": {"type": "users", "id": user_id, "attributes": user_attributes(user_id)}}


def type_view(record: IncidentTypeRecord) -> dict[str, Any]:
    me = {"data": {"id": SANDBOX_USER_ID, "type": "users"}}
    return {
        "id": record.id,
        "type": "incident_types",
        "attributes": {
            "createdAt": iso(record.created),
            "createdBy": SANDBOX_USER_ID,
            "description": record.description,
            "is_default": record.is_default,
            "lastModifiedBy": SANDBOX_USER_ID,
            "modifiedAt": iso(record.modified),
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


def field_view(definition: FieldDef) -> dict[str, Any]:
    me = {"data": {"id": SANDBOX_USER_ID, "type": "users"}}
    valued = definition.kind in VALUED_KINDS
    return {
        "id": definition.id,
        "type": "user_defined_field",
        "attributes": {
            "attached_to": "incidents",
            "category": definition.category,
            "collected": definition.collected,
            "created": iso(definition.created),
            "default_value": definition.default_value,
            "deleted": None,
            "display_name": definition.display_name,
            "metadata": None,
            "modified": iso(definition.modified),
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
