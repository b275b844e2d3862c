"""The two webhooks gpufarm's Datadog calls: their names, the handles that call them, their payload templates and
the secret header each carries (gpufarm.setup.plan plans them; the handlers read the payloads)."""

from __future__ import annotations

import json

INCIDENT_WEBHOOK = "gpufarm-incidents"
IDLE_WEBHOOK = "gpufarm-idle"
INCIDENT_HANDLE = f"@webhook-{INCIDENT_WEBHOOK}"
IDLE_HANDLE = f"@webhook-{IDLE_WEBHOOK}"
SECRET_VARIABLE = "GPUFARM_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not its value
TOKEN_HEADER = "X-Gpufarm-Token"  # noqa: S105 - a header name
# The secret travels in the payload too: Datadog documents variables in payloads, not that it substitutes them in
# custom headers (gpufarm.handlers.webhook accepts either).
TOKEN_FIELD = "token"  # noqa: S105 - a field name

# Payload templates: Datadog substitutes the $VARIABLES when it calls the webhook. $INCIDENT_FIELDS is raw JSON
# (an object of plain field values), so it stands outside quotes; everything else is a JSON string. The handlers
# read only the incident's id (and the monitor's scope) and never trust the fields, so how Datadog encodes
# $INCIDENT_FIELDS (an object or a JSON string) does not matter.
INCIDENT_PAYLOAD = (
    f'{{"{TOKEN_FIELD}": "${SECRET_VARIABLE}", '
    '"event_type": "$EVENT_TYPE", "date": "$DATE", "incident_uuid": "$INCIDENT_UUID", '
    '"incident_public_id": "$INCIDENT_PUBLIC_ID", "incident_status": "$INCIDENT_STATUS", '
    '"incident_title": "$INCIDENT_TITLE", "incident_fields": $INCIDENT_FIELDS}'
)
# The idle monitors' tags ($TAGS: kind and window) and rendered message ($EVENT_MSG: the measured value) travel too.
IDLE_PAYLOAD = (
    f'{{"{TOKEN_FIELD}": "${SECRET_VARIABLE}", '
    '"alert_id": "$ALERT_ID", "alert_transition": "$ALERT_TRANSITION", "alert_scope": "$ALERT_SCOPE", '
    '"alert_status": "$ALERT_STATUS", "alert_title": "$ALERT_TITLE", "date": "$DATE", '
    '"alert_query": "$ALERT_QUERY", "tags": "$TAGS", "message": "$EVENT_MSG"}'
)
CUSTOM_HEADERS = json.dumps({TOKEN_HEADER: f"${SECRET_VARIABLE}"})
