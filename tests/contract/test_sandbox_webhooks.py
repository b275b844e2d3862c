"""The sandbox's Webhooks integration and delivery engine: recorded shapes, then incident rules firing end to end."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.v1.api.webhooks_integration_api import WebhooksIntegrationApi
from datadog_api_client.v2.api.incidents_api import IncidentsApi
from helpers import call, http
from recorded import missing_keys, recorded, recorded_request
from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread
from gpufarm_sandbox.emulator.webhook_delivery import DEFAULT_PAYLOAD

pytestmark = pytest.mark.contract

RECORDING = "v1-webhooks-integration.json"
HOOK_CREATE = 'Create a webhooks integration returns "OK" response'
HOOK_GET = 'Get a webhook integration returns "OK" response'
HOOK_UPDATE = 'Update a webhook returns "OK" response'
HOOK_DELETE = 'Delete a webhook returns "OK" response'
VAR_CREATE = 'Create a custom variable returns "OK" response'
VAR_UPDATE = 'Update a custom variable returns "OK" response'
VAR_DELETE = 'Delete a custom variable returns "OK" response'

SECRET = "s3cr3t-token-value-9f8e7d"
PAYLOAD = (
    '{"id": "$INCIDENT_UUID", "ir": "$INCIDENT_PUBLIC_ID", "status": "$INCIDENT_STATUS", '
    '"title": "$INCIDENT_TITLE", "fields": $INCIDENT_FIELDS, "event": "$EVENT_TYPE", "date": "$DATE", '
    '"note": "token is $GPUFARM_WEBHOOK_SECRET"}'
)


# -- helpers ----------------------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A tiny webhook receiver: answers the queued statuses in turn (then 200) and keeps every request."""

    statuses: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    gate: threading.Event | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            status = self.statuses.pop(0) if self.statuses else 200
            self.requests.append(
                {
                    "path": request.path,
                    "headers": dict(request.headers),
                    "body": request.get_data(as_text=True),
                    "status": status,
                }
            )
        return Response(f"answered {status}", status=status)(environ, start_response)


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def hooks(client: ApiClient) -> WebhooksIntegrationApi:
    """WebhooksIntegrationApi."""
    return WebhooksIntegrationApi(client)


@pytest.fixture
def incidents(client: ApiClient) -> IncidentsApi:
    """IncidentsApi."""
    return IncidentsApi(client)


@pytest.fixture(scope="module")
def receiver_server() -> Iterator[tuple[Receiver, str]]:
    """One receiver server for the module (stopping one costs half a second of polling)."""
    app = Receiver()
    with ServerThread(app, "127.0.0.1", 0) as server:
        yield app, server.url


@pytest.fixture
def receiver(receiver_server: tuple[Receiver, str], sandbox: Sandbox) -> Iterator[tuple[Receiver, str]]:
    """The receiver, emptied, and its URL; after the test nothing is left in flight towards it."""
    app, url = receiver_server
    app.statuses, app.requests, app.gate = [], [], None
    yield app, url
    if app.gate is not None:
        app.gate.set()
    assert sandbox.webhooks.drain(10)


@pytest.fixture
def fast_retries(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """Keep retry backoff tiny so the retry tests take milliseconds."""
    monkeypatch.setattr(sandbox.webhooks.delivery, "backoff_s", 0.01)
    return sandbox


# -- webhooks integration API as recorded -----------------------------------------------------------------


def test_webhook_crud_answers_as_recorded(hooks: WebhooksIntegrationApi) -> None:
    body = recorded_request(RECORDING, HOOK_CREATE, 0)
    status, raw, model = call(hooks, "create_webhooks_integration", body=body)
    assert (status, raw) == recorded(RECORDING, HOOK_CREATE, 0)
    assert model.payload == DEFAULT_PAYLOAD
    name = body["name"]
    status, raw, _ = call(hooks, "get_webhooks_integration", webhook_name=name)
    assert status == 200
    assert raw == recorded(RECORDING, HOOK_CREATE, 0)[1]
    status, raw, _ = call(
        hooks, "update_webhooks_integration", webhook_name=name, body=recorded_request(RECORDING, HOOK_UPDATE, 1)
    )
    want_status, want = recorded(RECORDING, HOOK_UPDATE, 1)
    assert status == want_status
    assert missing_keys(raw, want) == set()
    assert raw["url"] == "https://example.com/webhook-updated"
    status, raw, _ = call(hooks, "delete_webhooks_integration", webhook_name=name)
    assert (status, raw) == recorded(RECORDING, HOOK_DELETE, 1)
    status, raw, _ = call(hooks, "delete_webhooks_integration", webhook_name=name)
    assert (status, raw) == recorded(RECORDING, HOOK_DELETE, 2)
    status, _, _ = call(hooks, "get_webhooks_integration", webhook_name=name)
    assert status == 404


def test_get_answers_as_recorded(hooks: WebhooksIntegrationApi) -> None:
    body = recorded_request(RECORDING, HOOK_GET, 0)
    hooks.create_webhooks_integration(body=body)
    status, raw, _ = call(hooks, "get_webhooks_integration", webhook_name=body["name"])
    assert (status, raw) == recorded(RECORDING, HOOK_GET, 1)


def test_custom_variables_hide_secrets_as_recorded(hooks: WebhooksIntegrationApi, sandbox: Sandbox) -> None:
    secret = recorded_request(RECORDING, VAR_CREATE, 0)
    status, raw, _ = call(hooks, "create_webhooks_integration_custom_variable", body=secret)
    assert (status, raw) == recorded(RECORDING, VAR_CREATE, 0)
    assert "value" not in raw
    status, raw, _ = call(hooks, "get_webhooks_integration_custom_variable", custom_variable_name=secret["name"])
    assert (status, raw) == (200, {"is_secret": True, "name": secret["name"]})
    plain = recorded_request(RECORDING, VAR_UPDATE, 0)
    assert call(hooks, "create_webhooks_integration_custom_variable", body=plain)[:2] == recorded(
        RECORDING, VAR_UPDATE, 0
    )
    status, raw, _ = call(
        hooks,
        "update_webhooks_integration_custom_variable",
        custom_variable_name=plain["name"],
        body=recorded_request(RECORDING, VAR_UPDATE, 1),
    )
    assert (status, raw) == recorded(RECORDING, VAR_UPDATE, 1)
    assert secret["value"] not in json.dumps(sandbox.dump())
    deleted = recorded_request(RECORDING, VAR_DELETE, 0)
    hooks.create_webhooks_integration_custom_variable(body=deleted)
    name = deleted["name"]
    assert call(hooks, "delete_webhooks_integration_custom_variable", custom_variable_name=name)[:2] == recorded(
        RECORDING, VAR_DELETE, 1
    )
    assert call(hooks, "delete_webhooks_integration_custom_variable", custom_variable_name=name)[:2] == recorded(
        RECORDING, VAR_DELETE, 2
    )


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("webhooks", {"url": "https://example.com"}, "name"),
        ("webhooks", {"name": "x"}, "url"),
        ("webhooks", {"name": "x", "url": "ftp://example.com"}, "http"),
        ("webhooks", {"name": "x", "url": "https://example.com:port/"}, "http"),
        ("webhooks", {"name": "has space", "url": "https://example.com"}, "name"),
        ("webhooks", {"name": "x", "url": "https://example.com", "encode_as": "xml"}, "encode_as"),
        ("webhooks", {"name": "x", "url": "https://example.com", "custom_headers": "{nope"}, "custom_headers"),
        ("webhooks", {"name": "x", "url": "https://example.com", "custom_headers": '{"a": 1}'}, "custom_headers"),
        ("webhooks", {"name": "x", "url": "https://example.com", "payload": 5}, "payload"),
        ("webhooks", "[]", "object"),
        ("custom-variables", {"name": "lower", "value": "v", "is_secret": False}, "name"),
        ("custom-variables", {"name": "OK", "is_secret": False}, "value"),
        ("custom-variables", {"name": "OK", "value": "v", "is_secret": "no"}, "is_secret"),
    ],
)
def test_bad_bodies_get_datadog_400s(sandbox_url: str, path: str, body: Any, message: str) -> None:
    status, answer = http(f"{sandbox_url}/api/v1/integration/webhooks/configuration/{path}", "POST", body)
    assert status == 400
    assert message in answer["errors"][0]


def test_duplicates_and_renames(hooks: WebhooksIntegrationApi, sandbox_url: str) -> None:
    hooks.create_webhooks_integration(body={"name": "one", "url": "https://example.com/1"})
    hooks.create_webhooks_integration(body={"name": "two", "url": "https://example.com/2"})
    assert call(hooks, "create_webhooks_integration", body={"name": "one", "url": "https://x.example"})[0] == 400
    assert call(hooks, "update_webhooks_integration", webhook_name="two", body={"name": "one"})[0] == 400
    renamed = hooks.update_webhooks_integration(webhook_name="two", body={"name": "three", "encode_as": "form"})
    assert (renamed.name, renamed.encode_as.value) == ("three", "form")
    assert call(hooks, "get_webhooks_integration", webhook_name="two")[0] == 404
    variable = {"name": "DUP", "value": "v", "is_secret": False}
    hooks.create_webhooks_integration_custom_variable(body=variable)
    assert call(hooks, "create_webhooks_integration_custom_variable", body=variable)[0] == 400


def test_auth_is_required(sandbox_url: str) -> None:
    path = "/api/v1/integration/webhooks/configuration/webhooks/any"
    assert http(f"{sandbox_url}{path}", "GET", keys=False) == (403, {"errors": ["Forbidden"]})
    assert http(f"{sandbox_url}/_sandbox/webhooks/deliveries", "GET", keys=False)[0] == 200


# -- delivery engine -------------------------------------------------------------------------------------------


def setup_farm(hooks: WebhooksIntegrationApi, incidents: IncidentsApi, url: str, **webhook: Any) -> None:
    """What `gpufarm datadog apply` sets up: fields, a webhook with a secret header, two notification rules."""
    type_id = next(t.id for t in incidents.list_incident_types().data if t.attributes.is_default)
    relationship = {"incident_type": {"data": {"id": type_id, "type": "incident_types"}}}
    for name, code, values in (("phase", 1, ["requested", "allocated"]), ("team", 1, ["nlp"]), ("hosts", 4, None)):
        attributes: dict[str, Any] = {"name": name, "type": code}
        if values:
            attributes["valid_values"] = [{"value": v, "display_name": v} for v in values]
        incidents.create_incident_user_defined_field(
            body={"data": {"type": "user_defined_field", "attributes": attributes, "relationships": relationship}}
        )
    hooks.create_webhooks_integration_custom_variable(
        body={"name": "GPUFARM_WEBHOOK_SECRET", "value": SECRET, "is_secret": True}
    )
    hooks.create_webhooks_integration(
        body={
            "name": "gpufarm-incidents",
            "url": url + "/incident",
            "payload": PAYLOAD,
            "custom_headers": '{"X-Gpufarm-Token": "$GPUFARM_WEBHOOK_SECRET"}',
            **webhook,
        }
    )
    for trigger, extra in (
        ("incident_created_trigger", {}),
        ("incident_modified_trigger", {"renotify_on": ["state"]}),
    ):
        incidents.create_incident_notification_rule(
            body={
                "data": {
                    "type": "incident_notification_rules",
                    "attributes": {
                        "conditions": [{"field": "state", "values": ["active", "stable", "resolved"]}],
                        "handles": ["@webhook-gpufarm-incidents", "@ops@example.com"],
                        "trigger": trigger,
                        "enabled": True,
                        **extra,
                    },
                }
            }
        )


def new_incident(incidents: IncidentsApi, title: str, **attributes: Any) -> Any:
    """Create an incident with gpufarm-like fields."""
    fields = {
        "team": {"type": "dropdown", "value": "nlp"},
        "phase": {"type": "dropdown", "value": "requested"},
        "hosts": {"type": "textarray", "value": ["gpu-node-01"]},
    }
    body = {
        "data": {
            "type": "incidents",
            "attributes": {"title": title, "customer_impacted": False, "fields": fields, **attributes},
        }
    }
    return incidents.create_incident(body=body).data


def patch(incidents: IncidentsApi, incident_id: str, **fields: str) -> None:
    """Set dropdown fields."""
    body = {
        "data": {
            "id": incident_id,
            "type": "incidents",
            "attributes": {"fields": {k: {"type": "dropdown", "value": v} for k, v in fields.items()}},
        }
    }
    incidents.update_incident(incident_id=incident_id, body=body)


def test_rules_deliver_rendered_webhooks_retrying_5xx(
    hooks: WebhooksIntegrationApi,
    incidents: IncidentsApi,
    fast_retries: Sandbox,
    receiver: tuple[Receiver, str],
    sandbox_url: str,
) -> None:
    app, url = receiver
    setup_farm(hooks, incidents, url)
    app.statuses = [503, 502]
    incident = new_incident(incidents, 'GPU "urgent" request\nnlp')
    assert fast_retries.webhooks.drain(10)
    assert [r["status"] for r in app.requests] == [503, 502, 200]
    delivered = app.requests[-1]
    assert delivered["headers"]["X-Gpufarm-Token"] == SECRET
    assert delivered["headers"]["Content-Type"] == "application/json"
    payload = json.loads(delivered["body"])
    assert payload["id"] == incident.id
    assert payload["ir"] == "1"
    assert payload["status"] == "active"
    assert payload["title"] == 'GPU "urgent" request\nnlp'
    assert payload["fields"] == {
        "severity": "UNKNOWN",
        "state": "active",
        "detection_method": "unknown",
        "team": "nlp",
        "phase": "requested",
        "hosts": ["gpu-node-01"],
        "slug": "IR-1",
    }
    assert payload["event"] == "incident_created"
    assert payload["note"] == f"token is {SECRET}"

    status, log = http(f"{sandbox_url}/_sandbox/webhooks/deliveries?webhook=gpufarm-incidents", "GET")
    assert status == 200
    attempts = log["deliveries"]
    assert [(a["attempt"], a["status"], a["ok"], a["final"]) for a in attempts] == [
        (1, 503, False, False),
        (2, 502, False, False),
        (3, 200, True, True),
    ]
    assert {a["origin"] for a in attempts} == {"incident"}
    assert attempts[-1]["headers"]["X-Gpufarm-Token"] == "***"
    assert json.loads(attempts[-1]["payload"])["note"] == "token is ***"
    assert attempts[-1]["response"] == "answered 200"
    assert SECRET not in json.dumps(log)
    assert SECRET not in json.dumps(fast_retries.dump())


def test_modified_rule_fires_only_when_renotify_fields_change(
    hooks: WebhooksIntegrationApi, incidents: IncidentsApi, sandbox: Sandbox, receiver: tuple[Receiver, str]
) -> None:
    app, url = receiver
    setup_farm(hooks, incidents, url)
    incident = new_incident(incidents, "req")
    assert sandbox.webhooks.drain(10)
    patch(incidents, incident.id, phase="allocated")  # phase is not in renotify_on: no webhook
    patch(incidents, incident.id, state="active")  # no change at all: no webhook
    patch(incidents, incident.id, state="stable")
    patch(incidents, incident.id, state="resolved")
    assert sandbox.webhooks.drain(10)
    statuses = [(json.loads(r["body"])["status"], json.loads(r["body"])["event"]) for r in app.requests]
    assert statuses == [
        ("active", "incident_created"),
        ("stable", "incident_modified"),
        ("resolved", "incident_modified"),
    ]
    assert json.loads(app.requests[1]["body"])["fields"]["phase"] == "allocated"
    notified = [n["handle"] for n in sandbox.dump()["incidents"]["notifications"]]
    assert notified.count("@ops@example.com") == 3  # non-webhook handles are recorded, not delivered


def test_test_incidents_disabled_rules_and_unmatched_conditions_stay_quiet(
    hooks: WebhooksIntegrationApi, incidents: IncidentsApi, sandbox: Sandbox, receiver: tuple[Receiver, str]
) -> None:
    app, url = receiver
    setup_farm(hooks, incidents, url)
    new_incident(incidents, "drill", is_test=True)
    for rule in incidents.list_incident_notification_rules().data:
        attributes = rule.attributes
        body = {
            "data": {
                "id": rule.id,
                "type": "incident_notification_rules",
                "attributes": {
                    "conditions": [{"field": "team", "values": ["vision"]}],
                    "handles": attributes.handles,
                    "trigger": attributes.trigger,
                    "enabled": attributes.trigger == "incident_created_trigger",
                },
            }
        }
        incidents.update_incident_notification_rule(id=rule.id, body=body)
    incident = new_incident(incidents, "team nlp does not match team:vision")
    patch(incidents, incident.id, state="stable")
    assert sandbox.webhooks.drain(10)
    assert app.requests == []
    assert sandbox.webhooks.deliveries == []


def test_incident_notification_handles_fire_on_create(
    hooks: WebhooksIntegrationApi, incidents: IncidentsApi, sandbox: Sandbox, receiver: tuple[Receiver, str]
) -> None:
    app, url = receiver
    hooks.create_webhooks_integration(body={"name": "direct", "url": url + "/direct"})
    body = {
        "data": {
            "type": "incidents",
            "attributes": {
                "title": "declared",
                "customer_impacted": False,
                "notification_handles": [{"display_name": "gpufarm", "handle": "@webhook-direct"}],
            },
        }
    }
    incidents.create_incident(body=body)
    assert sandbox.webhooks.drain(10)
    assert len(app.requests) == 1
    default = json.loads(app.requests[0]["body"])  # the default payload, rendered
    assert default["event_type"] == "incident_created"
    assert default["title"] == "IR-1: declared"
    assert default["org"] == {"id": "1", "name": "gpufarm sandbox"}
    assert default["date"].isdigit()


def test_client_errors_end_a_delivery_and_dead_receivers_are_retried_five_times(
    fast_retries: Sandbox, receiver: tuple[Receiver, str], hooks: WebhooksIntegrationApi
) -> None:
    app, url = receiver
    hooks.create_webhooks_integration(body={"name": "picky", "url": url + "/picky"})
    app.statuses = [400]
    fast_retries.webhooks.fire("picky", {"EVENT_MSG": "hello"}, origin="test")
    # Nothing listens on a port that was just bound and released.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    hooks.create_webhooks_integration(body={"name": "dead", "url": f"http://127.0.0.1:{dead_port}/gone"})
    fast_retries.webhooks.fire("dead", {}, origin="test")
    fast_retries.webhooks.fire("no-such-webhook", {}, origin="test")
    assert fast_retries.webhooks.drain(10)
    log = fast_retries.webhooks.deliveries
    picky = [a for a in log if a["webhook"] == "picky"]
    assert [(a["status"], a["final"]) for a in picky] == [(400, True)]
    dead = [a for a in log if a["webhook"] == "dead"]
    assert [a["attempt"] for a in dead] == [1, 2, 3, 4, 5]
    assert all(a["status"] is None and "connection failed" in a["error"] for a in dead)
    assert dead[-1]["final"] is True
    unknown = [a for a in log if a["webhook"] == "no-such-webhook"]
    assert [(a["ok"], a["error"]) for a in unknown] == [(False, "webhook 'no-such-webhook' does not exist")]


def test_form_encoding_and_basic_auth(
    sandbox: Sandbox, receiver: tuple[Receiver, str], hooks: WebhooksIntegrationApi
) -> None:
    app, url = receiver
    hooks.create_webhooks_integration_custom_variable(body={"name": "PASS", "value": SECRET, "is_secret": True})
    authed = url.replace("http://", "http://bot:$PASS@")
    hooks.create_webhooks_integration(
        body={"name": "form", "url": authed + "/form", "payload": '{"a": "$A", "n": $N}', "encode_as": "form"}
    )
    sandbox.webhooks.fire("form", {"A": "x y&z", "N": "[1, 2]"}, origin="test")
    assert sandbox.webhooks.drain(10)
    request = app.requests[0]
    assert request["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert parse_qs(request["body"]) == {"a": ["x y&z"], "n": ["[1, 2]"]}
    assert request["headers"]["Authorization"].startswith("Basic ")
    entry = sandbox.webhooks.deliveries[0]
    assert entry["url"].startswith("http://bot:***@")
    assert SECRET not in json.dumps(entry)
    # A password typed into the URL itself stays out of the state dump as well.
    hooks.create_webhooks_integration(body={"name": "literal", "url": url.replace("http://", f"http://bot:{SECRET}@")})
    assert SECRET not in json.dumps(sandbox.dump())


def test_delivery_happens_off_the_request_thread_without_the_sandbox_lock(
    hooks: WebhooksIntegrationApi, incidents: IncidentsApi, sandbox: Sandbox, receiver: tuple[Receiver, str]
) -> None:
    app, url = receiver
    setup_farm(hooks, incidents, url)
    app.gate = threading.Event()
    new_incident(incidents, "first")  # returns although the receiver is still holding the delivery
    assert sandbox.webhooks.pending == 1
    # The sandbox keeps answering (and storing) while a delivery is in flight.
    second = new_incident(incidents, "second")
    assert second.attributes.public_id == 2
    assert not sandbox.webhooks.drain(0.05)
    app.gate.set()
    assert sandbox.webhooks.drain(10)
    # Workers deliver concurrently, so the two may land in either order.
    assert sorted(json.loads(r["body"])["ir"] for r in app.requests) == ["1", "2"]


def test_drain_endpoint_and_reset_drop_pending_work(
    sandbox: Sandbox, sandbox_url: str, receiver: tuple[Receiver, str], hooks: WebhooksIntegrationApi
) -> None:
    app, url = receiver
    hooks.create_webhooks_integration(body={"name": "slow", "url": url + "/slow"})
    app.gate = threading.Event()
    sandbox.webhooks.fire("slow", {}, origin="test")
    assert http(f"{sandbox_url}/_sandbox/webhooks/drain", "POST", {"timeout": 0.05}) == (
        200,
        {"drained": False, "pending": 1},
    )
    assert http(f"{sandbox_url}/_sandbox/webhooks/drain", "POST", {"timeout": "soon"})[0] == 400
    sandbox.reset()
    app.gate.set()
    assert http(f"{sandbox_url}/_sandbox/webhooks/drain", "POST", {"timeout": 10}) == (
        200,
        {"drained": True, "pending": 0},
    )
    assert sandbox.webhooks.deliveries == []  # the delivery that straddled the reset is not logged
