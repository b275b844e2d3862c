"""Datadog setup-time administration: what `gpufarm datadog apply` (gpufarm.setup) reads and writes.

Incident types, user-defined field definitions, incident notification rules, the Webhooks integration (webhooks
and custom variables), monitors and dashboards. None of it runs in a request path: the handlers use the runtime
gateway (`gpufarm.adapters.datadog`). Both build their clients and map errors through `gpufarm.adapters.datadog_client`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpufarm.adapters import datadog_client as dc
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed

if TYPE_CHECKING:
    from gpufarm.setup.api import SetupApi

FIELDS_PAGE = 1000  # maximum page[size] for user-defined fields
MONITORS_PAGE = 1000  # page_size for the monitors list (unpaged when `page` is absent)


class DatadogAdmin:
    """The setup objects gpufarm manages in Datadog, as plain JSON-shaped dicts (Datadog's own key names)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_url = settings.datadog_base_url()
        self._client = dc.api_client(settings, retry=True)
        # Dashboards are read and written as JSON: the client's models take about a second to decode each one.
        self._raw_client = dc.api_client(settings, retry=True, raw=True)

    def close(self) -> None:
        """Release the HTTP connection pools."""
        self._client.close()
        self._raw_client.close()

    @cached_property
    def _incidents(self) -> Any:
        return dc.build("datadog_api_client.v2.api.incidents_api", "IncidentsApi", self._client)

    @cached_property
    def _webhooks(self) -> Any:
        return dc.build("datadog_api_client.v1.api.webhooks_integration_api", "WebhooksIntegrationApi", self._client)

    @cached_property
    def _monitors(self) -> Any:
        return dc.build("datadog_api_client.v1.api.monitors_api", "MonitorsApi", self._client)

    @cached_property
    def _dashboards(self) -> Any:
        return dc.build("datadog_api_client.v1.api.dashboards_api", "DashboardsApi", self._client)

    @cached_property
    def _dashboards_raw(self) -> Any:
        return dc.build("datadog_api_client.v1.api.dashboards_api", "DashboardsApi", self._raw_client)

    @cached_property
    def _metrics(self) -> Any:
        return dc.build("datadog_api_client.v1.api.metrics_api", "MetricsApi", self._client)

    @cached_property
    def _authentication(self) -> Any:
        return dc.build("datadog_api_client.v1.api.authentication_api", "AuthenticationApi", self._client)

    @cached_property
    def _users_raw(self) -> Any:
        return dc.build("datadog_api_client.v2.api.users_api", "UsersApi", self._raw_client)

    # -- the keys -------------------------------------------------------------------------------------

    def api_key_valid(self) -> bool:
        """Whether Datadog takes the API key (`GET /api/v1/validate`, which reads no application key).

        False when Datadog refuses it (403); raises a gpufarm error when the site cannot be reached or answers
        anything else (a URL that is no Datadog API).
        """
        try:
            with dc.classified("validate API key"):
                answer = self._authentication.validate()
        except dc.Failed as failed:
            if failed.outcome.status in (401, 403):
                return False
            raise failed.error() from None
        return dc.get(answer, "valid") is not False

    def current_user(self) -> dict[str, Any] | None:
        """The application key's user, its roles and their permissions (`GET /api/v2/current_user`, which needs no
        permission beyond valid keys), as Datadog's JSON; None when Datadog refuses the application key (403)."""
        try:
            with dc.classified("read the current user"):
                answer = dc.read_json(self._users_raw.get_current_user())
        except dc.Failed as failed:
            if failed.outcome.status in (401, 403):
                return None
            raise failed.error() from None
        if not isinstance(answer, dict):
            raise UpstreamError("Datadog answered the current user with an unexpected shape")
        return answer

    # -- incident types -------------------------------------------------------------------------------

    def list_incident_types(self) -> list[dict[str, Any]]:
        """Incident types of the organization (`id`, `attributes.name`, `attributes.is_default`, ...)."""
        with dc.errors("list incident types"):
            response = self._incidents.list_incident_types()
        return [dc.plain_dict(item) for item in (dc.get(response, "data") or [])]

    def create_incident_type(self, name: str, description: str) -> dict[str, Any]:
        """Create an incident type (never the default one)."""
        body = {
            "data": {
                "type": "incident_types",
                "attributes": {"name": name, "description": description, "is_default": False},
            }
        }
        with dc.errors("create incident type"):
            response = self._incidents.create_incident_type(body=body)
        return dc.plain_dict(response.data)

    def update_incident_type(self, type_id: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Change an incident type's name or description."""
        body = {"data": {"id": type_id, "type": "incident_types", "attributes": dict(attributes)}}
        with dc.errors("update incident type"):
            response = self._incidents.update_incident_type(incident_type_id=type_id, body=body)
        return dc.plain_dict(response.data)

    def delete_incident_type(self, type_id: str) -> None:
        """Delete an incident type (tests and cleanup)."""
        with dc.errors("delete incident type"):
            self._incidents.delete_incident_type(incident_type_id=type_id)

    # -- user-defined fields ---------------------------------------------------------------------------

    def list_field_definitions(self, incident_type_id: str | None = None) -> list[dict[str, Any]]:
        """Incident user-defined fields (`id`, `attributes{name,type,...}`), of one incident type when given."""
        out: list[dict[str, Any]] = []
        page = 0
        kwargs: dict[str, Any] = {"page_size": FIELDS_PAGE}
        if incident_type_id is not None:
            kwargs["filter_incident_type"] = incident_type_id
        while True:
            with dc.errors("list incident fields"):
                response = self._incidents.list_incident_user_defined_fields(page_number=page, **kwargs)
            items = [dc.plain_dict(item) for item in (dc.get(response, "data") or [])]
            out.extend(items)
            if len(items) < FIELDS_PAGE:
                return out
            page += 1

    def create_field_definition(self, attributes: Mapping[str, Any], incident_type_id: str) -> dict[str, Any]:
        """Define a custom incident field on an incident type."""
        body = {
            "data": {
                "type": "user_defined_field",
                "attributes": dict(attributes),
                "relationships": dc.type_relationship(incident_type_id),
            }
        }
        with dc.errors("create incident field"):
            response = self._incidents.create_incident_user_defined_field(body=body)
        return dc.plain_dict(response.data)

    def update_field_definition(self, field_id: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Change a custom incident field's display name, choices or collection settings."""
        body = {"data": {"id": field_id, "type": "user_defined_field", "attributes": dict(attributes)}}
        with dc.errors("update incident field"):
            response = self._incidents.update_incident_user_defined_field(field_id=field_id, body=body)
        return dc.plain_dict(response.data)

    # -- notification rules ----------------------------------------------------------------------------

    def list_notification_rules(self) -> list[dict[str, Any]]:
        """Incident notification rules (`id`, `attributes{trigger,conditions,...}`, `relationships.incident_type`)."""
        with dc.errors("list notification rules"):
            response = self._incidents.list_incident_notification_rules()
        return [dc.plain_dict(item) for item in (dc.get(response, "data") or [])]

    def create_notification_rule(self, attributes: Mapping[str, Any], incident_type_id: str) -> dict[str, Any]:
        """Create an incident notification rule that fires for incidents of one incident type only."""
        body = {
            "data": {
                "type": "incident_notification_rules",
                "attributes": dict(attributes),
                "relationships": dc.type_relationship(incident_type_id),
            }
        }
        with dc.errors("create notification rule"):
            response = self._incidents.create_incident_notification_rule(body=body)
        return dc.plain_dict(response.data)

    def update_notification_rule(
        self, rule_id: str, attributes: Mapping[str, Any], incident_type_id: str
    ) -> dict[str, Any]:
        """Replace an incident notification rule (PUT semantics: every attribute, and its incident type)."""
        try:
            rule_uuid = uuid.UUID(str(rule_id))
        except ValueError:
            raise ValidationFailed("rule_id", f"{str(rule_id)[:60]!r} is not a notification rule id") from None
        body = {
            "data": {
                "id": rule_uuid,
                "type": "incident_notification_rules",
                "attributes": dict(attributes),
                "relationships": dc.type_relationship(incident_type_id),
            }
        }
        with dc.errors("update notification rule"):
            response = self._incidents.update_incident_notification_rule(id=rule_uuid, body=body)
        return dc.plain_dict(response.data)

    # -- Webhooks integration -------------------------------------------------------------------------

    def get_webhook(self, name: str) -> dict[str, Any] | None:
        """A webhook of the Webhooks integration, or None."""
        try:
            with dc.errors("get webhook"):
                response = self._webhooks.get_webhooks_integration(webhook_name=name)
        except NotFound:
            return None
        return dc.plain_dict(response)

    def create_webhook(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a webhook (`name`, `url`, `payload`, `custom_headers`, `encode_as`)."""
        with dc.errors("create webhook", caller_body=True):
            response = self._webhooks.create_webhooks_integration(body=dict(spec))
        return dc.plain_dict(response)

    def update_webhook(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Update a webhook's URL, payload, headers or encoding."""
        with dc.errors("update webhook", caller_body=True):
            response = self._webhooks.update_webhooks_integration(webhook_name=name, body=dict(spec))
        return dc.plain_dict(response)

    def get_custom_variable(self, name: str) -> dict[str, Any] | None:
        """A webhooks custom variable (a secret one comes back without its value), or None."""
        try:
            with dc.errors("get custom variable"):
                response = self._webhooks.get_webhooks_integration_custom_variable(custom_variable_name=name)
        except NotFound:
            return None
        return dc.plain_dict(response)

    def create_custom_variable(self, name: str, value: str, *, is_secret: bool) -> dict[str, Any]:
        """Create a webhooks custom variable; the answer never carries a secret value back to callers."""
        body = {"name": name, "value": value, "is_secret": is_secret}
        with dc.errors("create custom variable"):
            response = self._webhooks.create_webhooks_integration_custom_variable(body=body)
        return _without_secret(dc.plain_dict(response))

    def update_custom_variable(self, name: str, value: str, *, is_secret: bool) -> dict[str, Any]:
        """Set a webhooks custom variable's value and secrecy."""
        body = {"value": value, "is_secret": is_secret}
        with dc.errors("update custom variable"):
            response = self._webhooks.update_webhooks_integration_custom_variable(custom_variable_name=name, body=body)
        return _without_secret(dc.plain_dict(response))

    # -- Monitors and dashboards ----------------------------------------------------------------------

    def list_monitors(self, *, name: str | None = None, monitor_tags: str | None = None) -> list[dict[str, Any]]:
        """Monitors, optionally filtered by name substring and monitor tags, every page."""
        out: list[dict[str, Any]] = []
        page = 0
        while True:
            kwargs: dict[str, Any] = {"page": page, "page_size": MONITORS_PAGE}
            if name:
                kwargs["name"] = name
            if monitor_tags:
                kwargs["monitor_tags"] = monitor_tags
            with dc.errors("list monitors"):
                response = self._monitors.list_monitors(**kwargs)
            items = [dc.plain_dict(m) for m in (response or [])]
            out.extend(items)
            if len(items) < MONITORS_PAGE:
                return out
            page += 1

    def create_monitor(self, monitor: Mapping[str, Any]) -> dict[str, Any]:
        """Create a monitor (Datadog's v1 monitor JSON)."""
        with dc.errors("create monitor", caller_body=True):
            response = self._monitors.create_monitor(body=dict(monitor))
        return dc.plain_dict(response)

    def update_monitor(self, monitor_id: int, monitor: Mapping[str, Any]) -> dict[str, Any]:
        """Update a monitor in place (its id and history are kept)."""
        with dc.errors("update monitor", caller_body=True):
            response = self._monitors.update_monitor(monitor_id=monitor_id, body=dict(monitor))
        return dc.plain_dict(response)

    def delete_monitor(self, monitor_id: int) -> None:
        """Delete a monitor; one already gone counts as deleted."""
        try:
            with dc.errors("delete monitor"):
                self._monitors.delete_monitor(monitor_id=monitor_id)
        except NotFound:
            return

    def validate_monitor(self, monitor: Mapping[str, Any], monitor_id: int | None = None) -> None:
        """Ask Datadog whether a monitor definition is valid, as a new monitor or (monitor_id given) as an update of
        that one (`POST /api/v1/monitor[/{id}]/validate`); raises ValidationFailed with Datadog's reasons."""
        with dc.errors("validate monitor", caller_body=True):
            if monitor_id is None:
                self._monitors.validate_monitor(body=dict(monitor))
            else:
                self._monitors.validate_existing_monitor(monitor_id=monitor_id, body=dict(monitor))

    def list_dashboards(self) -> list[dict[str, Any]]:
        """Summaries of the custom dashboards (`id`, `title`, `url`, ...)."""
        with dc.errors("list dashboards"):
            response = self._dashboards.list_dashboards()
        return [dc.plain_dict(d) for d in (dc.get(response, "dashboards") or [])]

    def create_dashboard(self, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """Create a dashboard (Datadog's v1 dashboard JSON)."""
        with dc.errors("create dashboard", caller_body=True):
            return _object(dc.read_json(self._dashboards_raw.create_dashboard(body=dict(dashboard))))

    def update_dashboard(self, dashboard_id: str, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """Replace a dashboard's definition, keeping its id and URL."""
        with dc.errors("update dashboard", caller_body=True):
            raw = self._dashboards_raw.update_dashboard(dashboard_id=dashboard_id, body=dict(dashboard))
            return _object(dc.read_json(raw))

    def get_dashboard(self, dashboard_id: str) -> dict[str, Any] | None:
        """A dashboard's whole definition (widgets with their ids), or None when it does not exist."""
        try:
            with dc.errors("get dashboard"):
                return _object(dc.read_json(self._dashboards_raw.get_dashboard(dashboard_id=dashboard_id)))
        except NotFound:
            return None

    def delete_dashboard(self, dashboard_id: str) -> None:
        """Delete a dashboard; one already gone counts as deleted."""
        try:
            with dc.errors("delete dashboard"):
                self._dashboards.delete_dashboard(dashboard_id=dashboard_id)
        except NotFound:
            return

    # -- Metric metadata ------------------------------------------------------------------------------

    def get_metric_metadata(self, metric: str) -> dict[str, Any] | None:
        """A metric's metadata (type, unit, per_unit, description, ...), or None for a metric Datadog does not know."""
        try:
            with dc.errors("get metric metadata"):
                response = self._metrics.get_metric_metadata(metric_name=metric)
        except NotFound:
            return None
        return dc.plain_dict(response)

    def update_metric_metadata(self, metric: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Set a metric's metadata (`PUT /api/v1/metrics/{metric_name}`)."""
        with dc.errors("update metric metadata", caller_body=True):
            response = self._metrics.update_metric_metadata(metric_name=metric, body=dict(metadata))
        return dc.plain_dict(response)


def _object(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise UpstreamError(f"Datadog answered with {type(answer).__name__} where a dashboard was expected")
    return answer


def _without_secret(variable: dict[str, Any]) -> dict[str, Any]:
    if variable.get("is_secret"):
        variable.pop("value", None)
    return variable


if TYPE_CHECKING:

    def _implements_setup_api(admin: DatadogAdmin) -> SetupApi:
        """mypy proves here that DatadogAdmin is what `gpufarm datadog apply` needs."""
        return admin
