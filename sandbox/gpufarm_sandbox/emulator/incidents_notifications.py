"""Sandbox: incident notification rules, and the webhook calls they make when incidents change.

A rule belongs to one incident type (`relationships.incident_type`; the default type when none is sent) and
fires only for incidents of that type, on its trigger (created / modified), when its conditions hold (AND across
fields, OR within one) and, for modifications, when a field in `renotify_on` changed (under the `no-field-trigger`
quirk: only when state or severity changed, whatever `renotify_on` says). Test incidents skip rules.
Firings are computed under the sandbox lock and sent to the webhooks module (`@webhook-<name>` handles) after
it is released.
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.incidents_config import (
    CONFIG,
    SANDBOX_USER_ID,
    IncidentConfig,
    generic_not_found,
    iso,
    jsonapi,
    jsonapi_bad,
    jsonapi_data,
    jsonapi_object,
    relationship_id,
    user_expanded,
)
from gpufarm_sandbox.emulator.quirks import NO_FIELD_TRIGGER
from gpufarm_sandbox.emulator.web import Route, empty_response, json_object, json_response
from gpufarm_sandbox.emulator.webhooks import WebhooksModule

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.incidents_record import StoredIncident

CREATED_TRIGGER = "incident_created_trigger"
MODIFIED_TRIGGER = "incident_modified_trigger"
TRIGGERS = (CREATED_TRIGGER, MODIFIED_TRIGGER)
VISIBILITIES = ("all", "organization", "private")
WEBHOOK_HANDLE = "@webhook-"
# What a modification must change for a rule to fire under the `no-field-trigger` quirk.
STATE_FIELDS = frozenset({"state", "severity"})

# (webhook name, template variables) of one call to make.
Notification = tuple[str, dict[str, str]]


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


class NotificationRules:
    """The rules of the sandbox's organization, and what they fire (state guarded by the sandbox lock)."""

    def __init__(self, context: SandboxContext, config: IncidentConfig, webhooks: WebhooksModule) -> None:
        self.ctx = context
        self.webhooks = webhooks
        self.config = config
        self.rules: dict[str, RuleRecord] = {}
        # What the rules matched recently (every handle, webhook or not), for `GET /_sandbox/state`.
        self.recent: deque[dict[str, Any]] = deque(maxlen=500)

    def routes(self) -> list[Route]:
        """CRUD under /api/v2/incidents/config/notification-rules."""
        rules = f"{CONFIG}/notification-rules"
        return [
            Route(rules, ("GET",), jsonapi(self._rules_list)),
            Route(rules, ("POST",), jsonapi(self._rule_create)),
            Route(f"{rules}/<rule_id>", ("GET",), jsonapi(self._rule_get)),
            Route(f"{rules}/<rule_id>", ("PUT",), jsonapi(self._rule_update)),
            Route(f"{rules}/<rule_id>", ("DELETE",), jsonapi(self._rule_delete)),
        ]

    def reset(self) -> None:
        """Forget every rule and firing."""
        self.rules.clear()
        self.recent.clear()

    def dump(self) -> dict[str, Any]:
        """Rules and recent firings for `GET /_sandbox/state`."""
        return {
            "notification_rules": [
                rule_view(r)["attributes"] | {"id": r.id, "incident_type_id": r.incident_type_id}
                for r in self.rules.values()
            ],
            "notifications": list(self.recent),
        }

    def for_change(
        self,
        incident: StoredIncident,
        trigger: str,
        changed: set[str] | None,
        *,
        values_of: Callable[[str | None], list[str]],
        plain_fields: Mapping[str, Any],
    ) -> list[Notification]:
        """Webhook firings for this change; computed under the lock, fired after it is released.

        values_of: the incident's values per facet (what conditions test); plain_fields: its fields as plain
        values (what $INCIDENT_FIELDS carries).
        """
        if incident.is_test:
            return []
        state_only = NO_FIELD_TRIGGER in self.ctx.quirks
        handles = [
            (rule.id, h)
            for rule in self.rules.values()
            if _rule_applies(rule, incident, trigger, changed, values_of, state_only=state_only)
            for h in rule.handles
        ]
        if trigger == CREATED_TRIGGER:
            handles += [("notification_handles", h["handle"]) for h in incident.notification_handles or []]
        out: list[Notification] = []
        seen: set[str] = set()
        event = "incident_created" if trigger == CREATED_TRIGGER else "incident_modified"
        for source, handle in handles:
            self.recent.append({"incident": incident.slug, "trigger": trigger, "source": source, "handle": handle})
            if handle.startswith(WEBHOOK_HANDLE) and handle not in seen:
                seen.add(handle)
                out.append(
                    (handle[len(WEBHOOK_HANDLE) :], _variables(incident, event, plain_fields, self.ctx.base_url))
                )
        return out

    def fire(self, notifications: list[Notification]) -> None:
        """Send the webhook calls (outside the sandbox lock)."""
        for webhook, variables in notifications:
            self.webhooks.fire(webhook, variables, origin="incident")

    # -- notification rules -------------------------------------------------------------------------------

    def _rule(self, rule_id: str) -> RuleRecord:
        rule = self.rules.get(rule_id)
        if rule is None:
            raise generic_not_found("rule not found")
        return rule

    def _rules_list(self, request: Request) -> Response:
        with self.ctx.lock:
            rules = [rule_view(r) for r in self.rules.values()]
        # Recorded: a single full page still carries next_offset.
        return json_response(
            {"data": rules, "meta": {"pagination": {"offset": 0, "next_offset": len(rules), "size": len(rules)}}}
        )

    def _rule_get(self, request: Request, rule_id: str) -> Response:
        with self.ctx.lock:
            return json_response({"data": rule_view(self._rule(rule_id))})

    def _rule_create(self, request: Request) -> Response:
        data = jsonapi_data(json_object(request), "incident_notification_rules")
        parsed = _rule_attributes(jsonapi_object(data.get("attributes"), "attributes"))
        with self.ctx.lock:
            type_id = self._rule_type(data.get("relationships"))
            now = self.ctx.clock.now_dt()
            rule = RuleRecord(id=str(uuid.uuid4()), incident_type_id=type_id, created=now, modified=now, **parsed)
            rule.notification_template = _template_ref(data.get("relationships"))
            self.rules[rule.id] = rule
            return json_response({"data": rule_view(rule)}, 201)

    def _rule_update(self, request: Request, rule_id: str) -> Response:
        data = jsonapi_data(json_object(request), "incident_notification_rules")
        if "id" in data and data["id"] != rule_id:
            raise jsonapi_bad("data.id does not match the rule id in the path")
        parsed = _rule_attributes(jsonapi_object(data.get("attributes"), "attributes"))
        with self.ctx.lock:
            # Recorded: an unknown incident type is reported before an unknown rule.
            type_id = self._rule_type(data.get("relationships"))
            current = self._rule(rule_id)
            rule = RuleRecord(
                id=rule_id,
                incident_type_id=type_id,
                created=current.created,
                modified=self.ctx.clock.now_dt(),
                **parsed,
            )
            rule.notification_template = _template_ref(data.get("relationships"))
            self.rules[rule_id] = rule
            return json_response({"data": rule_view(rule)})

    def _rule_delete(self, request: Request, rule_id: str) -> Response:
        with self.ctx.lock:
            self._rule(rule_id)
            del self.rules[rule_id]
        return empty_response(204)

    def _rule_type(self, relationships: Any) -> str:
        type_id = relationship_id(relationships, "incident_type", required=False)
        if type_id is None:
            return self.config.default_type().id
        if type_id not in self.config.types:
            raise generic_not_found("incident type doesn't exist")
        return type_id


# -- helpers ----------------------------------------------------------------------------------------------


def _conditions_match(rule: RuleRecord, values_of: Callable[[str | None], list[str]]) -> bool:
    for condition in rule.conditions:
        actual = {v.lower() for v in values_of(str(condition["field"]))}
        if not actual & {str(v).lower() for v in condition["values"]}:
            return False
    return True


def _variables(
    incident: StoredIncident, event_type: str, plain_fields: Mapping[str, Any], base_url: str
) -> dict[str, str]:
    plain = {k: v for k, v in plain_fields.items() if v is not None}
    url = f"{base_url}/incidents/{incident.public_id}"
    message = f"{incident.slug}: {incident.title}\nState: {incident.state}\nSeverity: {incident.severity}\n{url}"
    commander = user_expanded(incident.commander_id)["data"]["attributes"] if incident.commander_id else None
    impact = {
        "customer_impacted": incident.customer_impacted,
        "customer_impact_scope": incident.customer_impact_scope,
        "customer_impact_start": iso(incident.customer_impact_start),
        "customer_impact_end": iso(incident.customer_impact_end),
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


def rule_view(rule: RuleRecord) -> dict[str, Any]:
    """A rule in the API's JSON:API shape."""
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
            "created": iso(rule.created),
            "enabled": rule.enabled,
            "handles": rule.handles,
            "modified": iso(rule.modified),
            "renotify_on": rule.renotify_on,
            "trigger": rule.trigger,
            "visibility": rule.visibility,
        },
        "relationships": relationships,
    }


def _template_ref(relationships: Any) -> dict[str, Any] | None:
    rel = relationships.get("notification_template") if isinstance(relationships, dict) else None
    data = rel.get("data") if isinstance(rel, dict) else None
    if not isinstance(data, dict):
        return None
    return {"id": str(data.get("id")), "type": "notification_templates"}


def _rule_attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    conditions = _rule_conditions(attrs.get("conditions"))
    handles = attrs.get("handles")
    if not isinstance(handles, list) or not handles or not all(isinstance(h, str) and h for h in handles):
        raise jsonapi_bad("attributes.handles is required and must be a non-empty list of strings")
    trigger = attrs.get("trigger")
    if trigger not in TRIGGERS:
        raise jsonapi_bad(f"attributes.trigger must be one of {', '.join(TRIGGERS)}")
    renotify = attrs.get("renotify_on", [])
    if not isinstance(renotify, list) or not all(isinstance(v, str) for v in renotify):
        raise jsonapi_bad("attributes.renotify_on must be a list of field names")
    # Spec default: a rule is disabled unless `enabled` says otherwise.
    enabled = attrs.get("enabled", False)
    if not isinstance(enabled, bool):
        raise jsonapi_bad("attributes.enabled must be a boolean")
    visibility = attrs.get("visibility", "organization")
    if visibility not in VISIBILITIES:
        raise jsonapi_bad(f"attributes.visibility must be one of {', '.join(VISIBILITIES)}")
    return {
        "conditions": conditions,
        "handles": list(handles),
        "trigger": trigger,
        "enabled": enabled,
        "renotify_on": list(renotify),
        "visibility": visibility,
    }


def _rule_applies(
    rule: RuleRecord,
    incident: StoredIncident,
    trigger: str,
    changed: set[str] | None,
    values_of: Callable[[str | None], list[str]],
    *,
    state_only: bool = False,
) -> bool:
    """An enabled rule of the incident's type and trigger whose conditions match (and, for a modification with
    renotify_on, one of those fields changed; with state_only, the `no-field-trigger` quirk, state or severity)."""
    if not rule.enabled or rule.trigger != trigger or rule.incident_type_id != incident.incident_type_id:
        return False
    if not _conditions_match(rule, values_of):
        return False
    if trigger != MODIFIED_TRIGGER:
        return True
    if state_only:
        return bool(STATE_FIELDS & (changed or set()))
    return not (rule.renotify_on and not set(rule.renotify_on) & (changed or set()))


def _rule_conditions(conditions: Any) -> list[dict[str, Any]]:
    if not isinstance(conditions, list):
        raise jsonapi_bad("attributes.conditions is required and must be a list")
    for condition in conditions:
        if not isinstance(condition, dict) or not isinstance(condition.get("field"), str) or not condition["field"]:
            raise jsonapi_bad("each condition needs a 'field' string")
        values = condition.get("values")
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise jsonapi_bad("each condition needs a non-empty 'values' list of strings")
    return [{"field": c["field"], "values": list(c["values"])} for c in conditions]
