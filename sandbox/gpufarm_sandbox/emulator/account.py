"""Sandbox module: what the keys themselves answer. `GET /api/v1/validate` checks the API key alone (no
application key: the sandbox's auth answers a wrong one with Datadog's 403); `GET /api/v2/current_user` is the
application key's user with its one role, the Datadog Admin Role, and the permissions the role grants
(`included`), in the shape datadog-api-client's UserResponse reads. `permissions` may be narrowed by a test to
play a role that lacks some."""

from __future__ import annotations

import uuid
from typing import Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.base import BaseModule
from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.incidents_config import SANDBOX_USER, SANDBOX_USER_ID
from gpufarm_sandbox.emulator.web import Auth, Route, json_response

ROLE_ID = "5a8d0a2e-6c1b-11ee-9c3b-da7ad0900002"
ROLE_NAME = "Datadog Admin Role"
ORG_ID = "5a8d0a2e-6c1b-11ee-9c3b-da7ad0900001"
CREATED = "2024-01-01T00:00:00.000000+00:00"
# The permissions the sandbox's admin role grants: Datadog's names for everything the sandbox serves (a subset of
# the real admin role's several hundred), (name, group, read or write).
ADMIN_PERMISSIONS: tuple[tuple[str, str, str], ...] = (
    ("incident_read", "Case and Incident Management", "read"),
    ("incident_write", "Case and Incident Management", "write"),
    ("incident_settings_read", "Case and Incident Management", "read"),
    ("incident_settings_write", "Case and Incident Management", "write"),
    ("incident_notification_settings_read", "Case and Incident Management", "read"),
    ("incident_notification_settings_write", "Case and Incident Management", "write"),
    ("integrations_read", "Integrations", "read"),
    ("manage_integrations", "Integrations", "write"),
    ("create_webhooks", "Integrations", "write"),
    ("hosts_read", "Infrastructure", "read"),
    ("monitors_read", "Monitors", "read"),
    ("monitors_write", "Monitors", "write"),
    ("dashboards_read", "Dashboards", "read"),
    ("dashboards_write", "Dashboards", "write"),
    ("metrics_read", "Metrics", "read"),
    ("metrics_metadata_write", "Metrics", "write"),
    ("timeseries_query", "Metrics", "read"),
    ("events_read", "Events", "read"),
    ("user_access_read", "Access Management", "read"),
)


def permission_id(name: str) -> str:
    """A permission's id: stable per name, as Datadog's are."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://sandbox.gpufarm.local/permissions/{name}"))


class AccountModule(BaseModule):
    """The API key's validation and the application key's user, role and permissions."""

    name = "account"

    def __init__(self, context: SandboxContext) -> None:
        super().__init__(context)
        self.permissions: list[str] = []
        self.reset()

    def routes(self) -> list[Route]:
        """`/api/v1/validate` (API key only) and `/api/v2/current_user`."""
        return [
            Route("/api/v1/validate", ("GET",), self._validate, Auth.DD_API),
            Route("/api/v2/current_user", ("GET",), self._current_user),
        ]

    def reset(self) -> None:
        """The admin role grants every permission again."""
        with self.ctx.lock:
            self.permissions = [name for name, _, _ in ADMIN_PERMISSIONS]

    def dump(self) -> dict[str, Any]:
        """The role's permissions."""
        with self.ctx.lock:
            return {"role": ROLE_NAME, "permissions": list(self.permissions)}

    def _validate(self, request: Request) -> Response:
        return json_response({"valid": True})

    def _current_user(self, request: Request) -> Response:
        with self.ctx.lock:
            granted = [p for p in ADMIN_PERMISSIONS if p[0] in self.permissions]
        role = {
            "type": "roles",
            "id": ROLE_ID,
            "attributes": {"name": ROLE_NAME, "created_at": CREATED, "modified_at": CREATED, "user_count": 1},
            "relationships": {
                "permissions": {"data": [{"type": "permissions", "id": permission_id(name)} for name, _, _ in granted]}
            },
        }
        included = [role, *(_permission(name, group, kind) for name, group, kind in granted)]
        return json_response({"data": _user(), "included": included})


def _user() -> dict[str, Any]:
    attributes = {
        "name": SANDBOX_USER["name"],
        "handle": SANDBOX_USER["handle"],
        "email": SANDBOX_USER["email"],
        "icon": SANDBOX_USER["icon"],
        "title": None,
        "status": "Active",
        "verified": True,
        "disabled": False,
        "service_account": False,
        "created_at": CREATED,
        "modified_at": CREATED,
    }
    return {
        "type": "users",
        "id": SANDBOX_USER_ID,
        "attributes": attributes,
        "relationships": {
            "roles": {"data": [{"type": "roles", "id": ROLE_ID}]},
            "org": {"data": {"type": "orgs", "id": ORG_ID}},
        },
    }


def _permission(name: str, group: str, kind: str) -> dict[str, Any]:
    return {
        "type": "permissions",
        "id": permission_id(name),
        "attributes": {
            "name": name,
            "display_name": name.replace("_", " ").title(),
            "description": f"The sandbox's {name}",
            "created": CREATED,
            "group_name": group,
            "display_type": kind,
            "restricted": False,
        },
    }
