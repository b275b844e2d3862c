"""Check 1, before anything is written: the Datadog keys work, and the application key's user holds what gpufarm
needs.

The API key is checked alone first (`GET /api/v1/validate` reads no application key), so a refusal names the key
that is wrong; a site that does not answer is named as such. Permissions come from `GET /api/v2/current_user`,
which needs no permission of its own: the user's roles and the permissions they grant. A scoped application key
may hold fewer than its user; the checks after this one meet that as refusals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufarm.config import Settings
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.setup.doctor.ports import AdminApi
from gpufarm.setup.doctor.report import Line, Status

KEYS = "datadog keys"

# The permissions each part of gpufarm needs (docs/deploy.md, "What to grant", whose Datadog table the code's calls
# are held to; a unit test holds these to it): the functions' and `gpufarm datadog apply`'s, and what for.
FUNCTIONS_PERMISSIONS: Mapping[str, str] = {
    "incident_read": "reading and searching leases",
    "incident_write": "creating and updating leases",
    "hosts_read": "the host list",
    "monitors_read": "the idle monitors' states",
    "dashboards_read": "finding gpufarm's dashboards for links",
    "dashboards_write": "re-signing the project dashboards' page links",
    "timeseries_query": "utilisation and usage queries",
}
APPLY_PERMISSIONS: Mapping[str, str] = {
    "incident_read": "reading gpufarm's incident type and fields",
    "incident_settings_write": "gpufarm's incident type and fields",
    "incident_notification_settings_read": "reading the notification rules",
    "incident_notification_settings_write": "the notification rules",
    "integrations_read": "reading the webhooks",
    "create_webhooks": "creating the webhooks",
    "manage_integrations": "updating the webhooks and their secret variable",
    "monitors_read": "validating the idle monitors",
    "monitors_write": "the idle monitors",
    "dashboards_read": "reading gpufarm's dashboards",
    "dashboards_write": "gpufarm's dashboards",
    "metrics_read": "reading metric metadata",
    "metrics_metadata_write": "metric metadata",
}
# Doctor reads what apply reads and writes a probe incident and a tag as the functions do: the key it is given must
# hold both parts' permissions (on day one, an administrator's).
REQUIRED_PERMISSIONS: Mapping[str, str] = {
    **{name: f"apply: {why}" for name, why in APPLY_PERMISSIONS.items()},
    **{name: f"functions: {why}" for name, why in FUNCTIONS_PERMISSIONS.items()},
}


def unset_keys(settings: Settings) -> Line | None:
    """The keys line when a key is not set at all (nothing is called then), else None."""
    if settings.datadog_api_key is None or not settings.datadog_api_key.get_secret_value():
        return Line(KEYS, Status.BROKEN, "bad API key: none is set (DD_API_KEY or GPUFARM_DATADOG_API_KEY)")
    if settings.datadog_app_key is None or not settings.datadog_app_key.get_secret_value():
        return Line(KEYS, Status.BROKEN, "bad application key: none is set (DD_APP_KEY or GPUFARM_DATADOG_APP_KEY)")
    return None


def check_keys(admin: AdminApi, where: str) -> Line:
    """The keys line: broken names the bad key or the site that cannot be reached; never a key's value."""
    try:
        if not admin.api_key_valid():
            return Line(KEYS, Status.BROKEN, f"bad API key: Datadog at {where} refuses it (keys are per site)")
    except GpufarmError as exc:
        return Line(KEYS, Status.BROKEN, f"cannot reach site {where}: {exc}")
    try:
        user = admin.current_user()
    except GpufarmError as exc:
        return Line(KEYS, Status.BROKEN, f"cannot read the application key's user at {where}: {exc}")
    if user is None:
        return Line(KEYS, Status.BROKEN, f"bad application key: Datadog at {where} takes the API key but not it")
    return _permissions_line(user, where)


def _permissions_line(user: Mapping[str, Any], where: str) -> Line:
    who, roles, granted = user_permissions(user)
    if not granted:
        # An answer without permission objects says nothing either way; the checks below exercise them.
        detail = f"keys of {who} work; Datadog listed no permissions for its roles ({', '.join(roles) or 'none'})"
        return Line(KEYS, Status.FELL_BACK, detail)
    missing = [name for name in REQUIRED_PERMISSIONS if name not in granted]
    if missing:
        needs = "; ".join(f"{name} ({REQUIRED_PERMISSIONS[name]})" for name in missing)
        return Line(KEYS, Status.BROKEN, f"{who} lacks {needs}: grant them to one of its roles")
    roles_text = ", ".join(roles) or "no role"
    detail = f"{where}: keys of {who} ({roles_text}) hold the {len(REQUIRED_PERMISSIONS)} permissions gpufarm needs"
    return Line(KEYS, Status.CONFIRMED, detail)


def user_permissions(user: Mapping[str, Any]) -> tuple[str, list[str], frozenset[str]]:
    """(who, role names, permission names) from `GET /api/v2/current_user`'s JSON: the user's handle, and the
    roles and permissions its `included` list carries."""
    data = _mapping(user.get("data"))
    attributes = _mapping(data.get("attributes"))
    who = str(attributes.get("handle") or attributes.get("email") or data.get("id") or "the key's user")[:100]
    included = [item for item in user.get("included") or [] if isinstance(item, Mapping)]
    roles = sorted(_name(item) for item in included if item.get("type") == "roles" and _name(item))
    granted = frozenset(_name(item) for item in included if item.get("type") == "permissions" and _name(item))
    return who, roles, granted


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(item: Mapping[str, Any]) -> str:
    attributes = item.get("attributes")
    return str(attributes.get("name") or "") if isinstance(attributes, Mapping) else ""
