"""Incident types in the sandbox as Datadog has them: CRUD under /config/types, a type on every incident, fields
scoped to their type, notification rules that fire only for their type, and search by type; every answer is
deserialized by datadog-api-client's own models with nothing left unparsed."""

from __future__ import annotations

from typing import Any

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.v2.api.incidents_api import IncidentsApi
from helpers import call, http

from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract


@pytest.fixture
def api(client: ApiClient) -> IncidentsApi:
    """IncidentsApi of the real client, aimed at a freshly reset sandbox."""
    return IncidentsApi(client)


def _type(api: IncidentsApi, name: str) -> str:
    status, _, model = call(
        api,
        "create_incident_type",
        body={"data": {"type": "incident_types", "attributes": {"name": name, "description": f"{name} things"}}},
    )
    assert status == 201
    return str(model.data.id)


def _default(api: IncidentsApi) -> str:
    return str(next(t.id for t in api.list_incident_types().data if t.attributes.is_default))


def _field(api: IncidentsApi, type_id: str, name: str, type_code: int = 3, values: list[str] | None = None) -> str:
    attributes: dict[str, Any] = {"name": name, "type": type_code}
    if values is not None:
        attributes["valid_values"] = [{"value": v, "display_name": v} for v in values]
    body = {
        "data": {
            "type": "user_defined_field",
            "attributes": attributes,
            "relationships": {"incident_type": {"data": {"id": type_id, "type": "incident_types"}}},
        }
    }
    status, raw, model = call(api, "create_incident_user_defined_field", body=body)
    assert status == 201, raw
    assert model.data.relationships.incident_type.data.id == type_id
    return str(model.data.id)


def _incident(api: IncidentsApi, title: str, type_id: str | None, **fields: str) -> Any:
    attributes: dict[str, Any] = {
        "title": title,
        "customer_impacted": False,
        "fields": {k: {"type": "textbox", "value": v} for k, v in fields.items()},
    }
    if type_id is not None:
        attributes["incident_type_uuid"] = type_id
    status, raw, model = call(api, "create_incident", body={"data": {"type": "incidents", "attributes": attributes}})
    assert status == 201, raw
    return model.data


def test_type_crud_answers_deserialize(api: IncidentsApi) -> None:
    type_id = _type(api, "GPU allocation")
    status, _, got = call(api, "get_incident_type", incident_type_id=type_id)
    assert status == 200
    assert (got.data.attributes.name, got.data.attributes.is_default) == ("GPU allocation", False)
    body = {"data": {"id": type_id, "type": "incident_types", "attributes": {"description": "leases"}}}
    status, _, patched = call(api, "update_incident_type", incident_type_id=type_id, body=body)
    assert status == 200
    assert patched.data.attributes.description == "leases"
    status, _, listed = call(api, "list_incident_types")
    assert sorted(t.attributes.name for t in listed.data) == ["GPU allocation", "Incident"]
    # The default type stays: it cannot be deleted, nor stop being the default without another taking over.
    status, raw, _ = call(api, "delete_incident_type", incident_type_id=_default(api))
    assert status == 400, raw


def test_incidents_carry_their_type_and_the_default_when_none_is_given(api: IncidentsApi) -> None:
    gpu = _type(api, "GPU allocation")
    ours = _incident(api, "lease", gpu)
    theirs = _incident(api, "outage", None)
    assert ours.attributes.incident_type_uuid == gpu
    assert theirs.attributes.incident_type_uuid == _default(api)
    status, raw, _ = call(
        api,
        "create_incident",
        body={
            "data": {
                "type": "incidents",
                "attributes": {"title": "x", "customer_impacted": False, "incident_type_uuid": "no-such-type"},
            }
        },
    )
    assert status == 404, raw


def test_fields_belong_to_their_type(api: IncidentsApi, sandbox_url: str) -> None:
    gpu, default = _type(api, "GPU allocation"), _default(api)
    # The same name on two types is two fields; a second one on the same type is refused.
    ours = _field(api, gpu, "request_id")
    theirs = _field(api, default, "request_id")
    _field(api, gpu, "hosts", 4)
    assert ours != theirs
    again = {
        "data": {
            "type": "user_defined_field",
            "attributes": {"name": "request_id", "type": 3},
            "relationships": {"incident_type": {"data": {"id": gpu, "type": "incident_types"}}},
        }
    }
    status, answer = http(f"{sandbox_url}/api/v2/incidents/config/user-defined-fields", "POST", again)
    assert status == 400
    assert "already exists" in answer["errors"][0]["detail"]

    status, _, listed = call(api, "list_incident_user_defined_fields", filter_incident_type=gpu)
    assert status == 200
    assert sorted(d.attributes.name for d in listed.data) == ["hosts", "request_id"]
    status, _, every = call(api, "list_incident_user_defined_fields")
    assert len(every.data) == 3

    # An incident carries its own type's fields only, and may set no other type's.
    lease = _incident(api, "lease", gpu, request_id="req-1")
    assert set(lease.attributes.fields) >= {"request_id", "hosts"}
    assert {r.id for r in lease.relationships.user_defined_fields.data} == {d.id for d in listed.data}
    outage = _incident(api, "outage", None, request_id="req-1")
    assert "hosts" not in outage.attributes.fields
    body = {"data": {"type": "incidents", "attributes": {"fields": {"hosts": {"type": "textarray", "value": ["h"]}}}}}
    status, answer = http(f"{sandbox_url}/api/v2/incidents/{outage.id}", "PATCH", body)
    assert status == 400
    assert "incident type 'Incident' defines no such field" in answer["errors"][0]


def test_search_by_type_id_or_name(api: IncidentsApi) -> None:
    gpu = _type(api, "GPU allocation")
    lease = _incident(api, "lease", gpu)
    _incident(api, "outage", None)
    for query in (f"incident_type:{gpu}", 'incident_type:"GPU allocation"', f"incident_type:{gpu} AND state:active"):
        status, _, found = call(api, "search_incidents", query=query)
        assert status == 200
        assert [i.data.id for i in found.data.attributes.incidents] == [lease.id], query
        assert [(t["name"], t["count"]) for t in found.data.attributes.facets["incident_type"]] == [
            ("GPU allocation", 1)
        ]
    status, _, rest = call(api, "search_incidents", query=f"state:active -incident_type:{gpu}")
    assert [i.data.attributes.title for i in rest.data.attributes.incidents] == ["outage"]


def test_a_rule_scoped_to_a_type_fires_only_for_its_incidents(api: IncidentsApi, sandbox: Sandbox) -> None:
    gpu, security = _type(api, "GPU allocation"), _type(api, "Security Incident")
    body = {
        "data": {
            "type": "incident_notification_rules",
            "attributes": {
                "conditions": [{"field": "state", "values": ["active", "stable", "resolved"]}],
                "handles": ["@webhook-gpufarm-incidents"],
                "trigger": "incident_created_trigger",
                "enabled": True,
                "visibility": "organization",
            },
            "relationships": {"incident_type": {"data": {"id": gpu, "type": "incident_types"}}},
        }
    }
    status, _, rule = call(api, "create_incident_notification_rule", body=body)
    assert status == 201
    assert rule.data.relationships.incident_type.data.id == gpu
    _incident(api, "outage", None)
    _incident(api, "breach", security)
    lease = _incident(api, "lease", gpu)
    fired = sandbox.incidents.dump()["notifications"]
    assert [(n["incident"], n["source"]) for n in fired] == [(f"IR-{lease.attributes.public_id}", str(rule.data.id))]


def test_deleting_a_type_deletes_its_fields(api: IncidentsApi) -> None:
    gpu = _type(api, "GPU allocation")
    _field(api, gpu, "request_id")
    _field(api, _default(api), "request_id")
    status, _, _ = call(api, "delete_incident_type", incident_type_id=gpu)
    assert status == 204
    status, _, left = call(api, "list_incident_user_defined_fields")
    assert [d.relationships.incident_type.data.id for d in left.data] == [_default(api)]
