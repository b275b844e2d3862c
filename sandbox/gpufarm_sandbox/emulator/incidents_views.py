"""How the sandbox shows an incident: the JSON:API views of get, list, create, patch and search answers, as recorded
(tests/fixtures/datadog/v2-incidents.json), and the plain field values of the state dump and the notifications."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from gpufarm_sandbox.emulator.clock import Clock
from gpufarm_sandbox.emulator.incidents_config import (
    BUILTIN_FIELDS,
    SANDBOX_USER_ID,
    SLUG,
    IncidentConfig,
    iso,
    user_expanded,
    user_ref,
)
from gpufarm_sandbox.emulator.incidents_record import FieldValue, StoredIncident, field_analytics, impact_duration
from gpufarm_sandbox.emulator.incidents_search import seconds_to_resolve


class IncidentViews:
    """Renders stored incidents with the incident types and fields of the organization's configuration."""

    def __init__(self, config: IncidentConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock

    def plain_fields(self, incident: StoredIncident) -> dict[str, FieldValue]:
        out: dict[str, FieldValue] = {name: incident.fields.get(name) for name in BUILTIN_FIELDS}
        for definition in self.config.fields_of(incident.incident_type_id):
            out[definition.name] = incident.fields.get(definition.name)
        out[SLUG] = incident.slug
        return out

    def encoded_fields(self, incident: StoredIncident) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, (kind, _) in BUILTIN_FIELDS.items():
            out[name] = {"type": kind, "value": incident.fields.get(name)}
        for definition in self.config.fields_of(incident.incident_type_id):
            out[definition.name] = {"type": definition.kind, "value": incident.fields.get(definition.name)}
        out[SLUG] = {"type": "textbox", "value": incident.slug}
        return out

    def search_answer(
        self,
        found: list[StoredIncident],
        page: list[StoredIncident],
        offset: int,
        facets: dict[str, Any],
        *,
        rendered: bool = True,
    ) -> dict[str, Any]:
        """A search answer; without `rendered`, its `incidents` list left empty for the caller to fill with the
        page's incidents rendered already (IncidentsModule's page text, `incident_text`)."""
        items = [{"data": self.incident(i, full=True, analytics=True)} for i in page] if rendered else []
        return {
            "data": {
                "type": "incidents_search_results",
                "attributes": {
                    "total": len(found),
                    "facets": facets,
                    "incidents": items,
                },
                "relationships": {
                    "incidents_relationship": {"data": [{"type": "incidents", "id": i.id} for i in page]}
                },
            },
            # Recorded: search answers carry next_offset on every page, the last one included.
            "meta": {"pagination": {"offset": offset, "next_offset": offset + len(page), "size": len(page)}},
        }

    def incident(self, incident: StoredIncident, *, full: bool, analytics: bool = False) -> dict[str, Any]:
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
            "customer_impact_duration": impact_duration(incident),
            "time_to_detect": 0,
            "time_to_repair": 0,
            "time_to_internal_response": 0,
            "time_to_resolve": seconds_to_resolve(incident),
            "archived": None,
            "is_test": incident.is_test,
            "declared": iso(incident.created),
            "fields": self.encoded_fields(incident),
            "field_analytics": field_analytics(incident, self.clock.now()) if analytics else None,
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
            "relationships": self.relationships(incident),
        }

    def relationships(self, incident: StoredIncident) -> dict[str, Any]:
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
    def included_users(incidents: Iterable[StoredIncident]) -> list[dict[str, Any]]:
        ids = [SANDBOX_USER_ID]
        for incident in incidents:
            if incident.commander_id and incident.commander_id not in ids:
                ids.append(incident.commander_id)
        return [user_expanded(uid)["data"] for uid in ids]


def pagination(offset: int, count: int, total: int) -> dict[str, int]:
    # The client's paginators stop on a short page; a last page carries no next_offset (recorded).
    out = {"offset": offset, "size": count}
    if offset + count < total:
        out["next_offset"] = offset + count
    return out
