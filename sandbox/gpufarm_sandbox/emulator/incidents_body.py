"""What an incident request may carry: the checks on a create or update body and on the list and search arguments,
with Datadog's error wording."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request

from gpufarm_sandbox.emulator.incidents_config import MULTI_KINDS
from gpufarm_sandbox.emulator.incidents_record import FieldValue
from gpufarm_sandbox.emulator.web import ApiError, query_int

PAGE_DEFAULT = 10
PAGE_MAX = 100


def body_data(body: Mapping[str, Any], expected: str) -> dict[str, Any]:
    data = body.get("data")
    if not isinstance(data, dict):
        raise ApiError(400, "data is required and must be an object")
    if data.get("type") != expected:
        raise ApiError(400, f'got type "{data.get("type")}" expected one of "{expected}"')
    return data


def body_object(value: Any, name: str, *, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, f"{name} is required and must be an object")
    return value


def checked_title(value: Any, *, required: bool) -> str:
    if value is None and required:
        raise ApiError(400, "data.attributes.title is required")
    if not isinstance(value, str) or not value.strip():
        raise ApiError(400, "data.attributes.title must be a non-empty string")
    return value


def checked_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ApiError(400, f"data.attributes.{name} must be a boolean")
    return value


def optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"data.attributes.{name} must be a string")
    return value


def checked_datetime(value: Any, name: str) -> datetime | None:
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


def checked_handles(value: Any) -> list[dict[str, str]] | None:
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


def checked_cells(value: Any) -> list[dict[str, Any]]:
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


def commander_change(relationships: Mapping[str, Any]) -> str | None:
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


def field_value(name: str, obj: Any, kind: str, allowed: tuple[str, ...] | None) -> FieldValue:
    if not isinstance(obj, dict) or "value" not in obj:
        raise ApiError(400, f"Invalid field '{name}': expected an object with 'type' and 'value'")
    given = obj.get("type")
    if given is not None and given != kind:
        raise ApiError(400, f"Invalid field '{name}': it is a {kind} field, got type '{given}'")
    value = obj["value"]
    if value is None:
        return None
    bad = _not_allowed(name, value, kind, allowed)
    if bad:
        raise ApiError(400, f"Invalid field '{name}': {bad[0]!r} is not one of {', '.join(allowed or ())}")
    return list(value) if isinstance(value, list) else value


def _not_allowed(name: str, value: Any, kind: str, allowed: tuple[str, ...] | None) -> list[str]:
    """The values outside a field's choices (none when it has no choices); ApiError for a value of the wrong shape."""
    if kind in MULTI_KINDS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ApiError(400, f"Invalid field '{name}': a {kind} value is a list of strings")
        return [v for v in value if allowed is not None and v not in allowed]
    if not isinstance(value, str):
        raise ApiError(400, f"Invalid field '{name}': a {kind} value is a string")
    return [value] if allowed is not None and value not in allowed else []


def include_arg(request: Request) -> set[str]:
    raw = ",".join(request.args.getlist("include"))
    wanted = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = wanted - {"users", "attachments"}
    if unknown:
        raise ApiError(400, f"Invalid parameter include: {sorted(unknown)[0]!r} (expected users or attachments)")
    return wanted


def page_args(request: Request) -> tuple[int, int]:
    size = query_int(request, "page[size]", PAGE_DEFAULT, minimum=1, maximum=PAGE_MAX) or PAGE_DEFAULT
    offset = query_int(request, "page[offset]", 0) or 0
    return size, offset
