"""The Datadog calls `gpufarm datadog apply` makes: a port, so planning and executing (gpufarm.setup.apply) run
against the real administration adapter (gpufarm.adapters.datadog_admin.DatadogAdmin) or a fake alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class SetupApi(Protocol):
    """The Datadog calls apply needs (gpufarm.adapters.datadog_admin.DatadogAdmin provides them)."""

    def list_incident_types(self) -> list[dict[str, Any]]:
        """Incident types."""

    def create_incident_type(self, name: str, description: str) -> dict[str, Any]:
        """Create an incident type."""

    def list_field_definitions(self, incident_type_id: str | None = None) -> list[dict[str, Any]]:
        """User-defined fields (of one incident type when given)."""

    def create_field_definition(self, attributes: Mapping[str, Any], incident_type_id: str) -> dict[str, Any]:
        """Create a field."""

    def update_field_definition(self, field_id: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Update a field."""

    def list_notification_rules(self) -> list[dict[str, Any]]:
        """Notification rules."""

    def create_notification_rule(self, attributes: Mapping[str, Any], incident_type_id: str) -> dict[str, Any]:
        """Create a rule scoped to an incident type."""

    def update_notification_rule(
        self, rule_id: str, attributes: Mapping[str, Any], incident_type_id: str
    ) -> dict[str, Any]:
        """Replace a rule (and its incident type)."""

    def get_webhook(self, name: str) -> dict[str, Any] | None:
        """A webhook or None."""

    def create_webhook(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a webhook."""

    def update_webhook(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Update a webhook."""

    def get_custom_variable(self, name: str) -> dict[str, Any] | None:
        """A custom variable or None."""

    def create_custom_variable(self, name: str, value: str, *, is_secret: bool) -> dict[str, Any]:
        """Create a custom variable."""

    def update_custom_variable(self, name: str, value: str, *, is_secret: bool) -> dict[str, Any]:
        """Update a custom variable."""

    def list_monitors(self, *, name: str | None = None, monitor_tags: str | None = None) -> list[dict[str, Any]]:
        """Monitors, optionally filtered by monitor tags."""

    def create_monitor(self, monitor: Mapping[str, Any]) -> dict[str, Any]:
        """Create a monitor."""

    def update_monitor(self, monitor_id: int, monitor: Mapping[str, Any]) -> dict[str, Any]:
        """Update a monitor in place."""

    def delete_monitor(self, monitor_id: int) -> None:
        """Delete a monitor."""

    def validate_monitor(self, monitor: Mapping[str, Any], monitor_id: int | None = None) -> None:
        """Have Datadog check a monitor (as an update of monitor_id when given); ValidationFailed if refused."""

    def list_dashboards(self) -> list[dict[str, Any]]:
        """Summaries of the custom dashboards (id, title, description...)."""

    def get_dashboard(self, dashboard_id: str) -> dict[str, Any] | None:
        """A dashboard's whole definition, or None."""

    def create_dashboard(self, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """Create a dashboard."""

    def update_dashboard(self, dashboard_id: str, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """Replace a dashboard's definition."""

    def delete_dashboard(self, dashboard_id: str) -> None:
        """Delete a dashboard."""

    def get_metric_metadata(self, metric: str) -> dict[str, Any] | None:
        """A metric's metadata, or None for a metric Datadog does not know."""

    def update_metric_metadata(self, metric: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Set a metric's metadata."""
