"""The sandbox's Incidents API driven by datadog-api-client, checked against recorded real Datadog traffic."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.exceptions import ApiException
from datadog_api_client.v2.api.incidents_api import IncidentsApi
from helpers import call, http
from recorded import missing_keys, recorded, recorded_request

from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

RECORDING = "v2-incidents.json"
CREATE = 'Create an incident returns "CREATED" response'
GET = 'Get the details of an incident returns "OK" response'
UPDATE = 'Update an existing incident returns "OK" response'
DELETE = 'Delete an existing incident returns "OK" response'
LIST_PAGES = 'Get a list of incidents returns "OK" response with pagination'
SEARCH = 'Search for incidents returns "OK" response'
SEARCH_PAGES = 'Search for incidents returns "OK" response with pagination'
TYPE_CREATE = 'Create an incident type returns "CREATED" response'
RULE_CREATE = 'Create incident notification rule returns "Created" response'
RULE_BAD = 'Create incident notification rule returns "Bad Request" response'
RULE_MISSING = 'Get incident notification rule returns "Not Found" response'
RULE_LIST = 'List incident notification rules returns "OK" response'
RULE_UPDATE = 'Update incident notification rule returns "OK" response'
RULE_UPDATE_MISSING = 'Update incident notification rule returns "Not Found" response'
RULE_DELETE = 'Delete incident notification rule returns "No Content" response'

# Search answers from Datadog also list every incident under `included`; datadog-api-client's
# IncidentResponseIncludedItem (users | attachments) cannot parse incidents there, so they would come back
# `_unparsed`. The sandbox leaves them out (the same incidents are in data.attributes.incidents).
SEARCH_IGNORE = ("included",)
# The 2023 incidents of the paged search recording had integration metadata (Slack channels, Jira issues);
# the sandbox implements no incident integrations, so that relationship list is always empty here.
SEARCH_PAGES_IGNORE = (*SEARCH_IGNORE, "data.attributes.incidents[].data.relationships.integrations.data[]")


# -- helpers ----------------------------------------------------------------------------------------------


def incident_body(title: str, fields: dict[str, Any] | None = None, **attributes: Any) -> dict[str, Any]:
    """A create body in the client's JSON shape."""
    attrs: dict[str, Any] = {"title": title, "customer_impacted": False, **attributes}
    if fields is not None:
        attrs["fields"] = fields
    return {"data": {"type": "incidents", "attributes": attrs}}


def patch_body(incident_id: str, **attributes: Any) -> dict[str, Any]:
    """A PATCH body."""
    return {"data": {"id": incident_id, "type": "incidents", "attributes": attributes}}


def dropdown(value: str | None) -> dict[str, Any]:
    """A single-value dropdown field."""
    return {"type": "dropdown", "value": value}


# -- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def api(client: ApiClient) -> IncidentsApi:
    """IncidentsApi of the real client, aimed at a freshly reset sandbox."""
    return IncidentsApi(client)


@pytest.fixture
def type_id(api: IncidentsApi) -> str:
    """The organization's default incident type."""
    types = api.list_incident_types().data
    return str(next(t.id for t in types if t.attributes.is_default))


def define_field(api: IncidentsApi, type_id: str, name: str, type_code: int, values: list[str] | None = None) -> Any:
    """Create a user-defined field through the client."""
    attributes: dict[str, Any] = {"name": name, "type": type_code}
    if values is not None:
        attributes["valid_values"] = [{"value": v, "display_name": v.upper()} for v in values]
    body = {
        "data": {
            "type": "user_defined_field",
            "attributes": attributes,
            "relationships": {"incident_type": {"data": {"id": type_id, "type": "incident_types"}}},
        }
    }
    status, _, model = call(api, "create_incident_user_defined_field", body=body)
    assert status == 201
    return model


@pytest.fixture
def gpufarm_fields(api: IncidentsApi, type_id: str) -> None:
    """A few gpufarm-like custom fields: team (dropdown), phase (dropdown), hosts (textarray), project (textbox)."""
    define_field(api, type_id, "team", 1, ["nlp", "vision", "speech"])
    define_field(api, type_id, "phase", 1, ["requested", "allocated", "reclaimed"])
    define_field(api, type_id, "hosts", 4)
    define_field(api, type_id, "project", 3)


COMMANDER = {"commander_user": {"data": {"id": "654d8602-a17a-45dc-b651-ed566eb8a26b", "type": "users"}}}


@pytest.fixture
def mixed(api: IncidentsApi, gpufarm_fields: None) -> list[str]:
    """Three incidents as the recorded orgs had them: commanders, one resolved."""
    body = incident_body("with commander", {"team": dropdown("nlp")})
    body["data"]["relationships"] = COMMANDER
    ids = [api.create_incident(body=body).data.id]
    ids.append(api.create_incident(body=incident_body("to resolve", {"team": dropdown("nlp")})).data.id)
    api.update_incident(incident_id=ids[1], body=patch_body(ids[1], fields={"state": dropdown("resolved")}))
    body = incident_body("another commander")
    body["data"]["relationships"] = COMMANDER
    ids.append(api.create_incident(body=body).data.id)
    return ids


# -- incidents ---------------------------------------------------------------------------------------------


def test_create_answers_as_recorded(api: IncidentsApi, gpufarm_fields: None) -> None:
    status, raw, model = call(api, "create_incident", body=recorded_request(RECORDING, CREATE, 1))
    want_status, want = recorded(RECORDING, CREATE, 1)
    assert status == want_status == 201
    assert missing_keys(raw, want) == set()
    attributes = model.data.attributes
    assert attributes.public_id == 1
    assert attributes.fields["slug"].value == "IR-1"
    # The recorded request opens the incident already resolved: state mirrors the field, resolved is stamped.
    assert attributes.state == "resolved"
    assert attributes.resolved is not None
    assert attributes.fields["team"].value is None  # every defined custom field shows, null when unset
    second = api.create_incident(body=incident_body("second", {"team": dropdown("nlp")}))
    assert second.data.attributes.public_id == 2
    assert second.data.attributes.fields["team"].value == "nlp"
    assert second.data.attributes.state == "active"


def test_get_answers_as_recorded(api: IncidentsApi, gpufarm_fields: None) -> None:
    created = api.create_incident(body=recorded_request(RECORDING, GET, 0))
    status, raw, model = call(api, "get_incident", incident_id=created.data.id)
    want_status, want = recorded(RECORDING, GET, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert model.data.id == created.data.id
    # get answers carry user uuids instead of expanded users, as recorded.
    assert raw["data"]["attributes"]["created_by_uuid"] is not None
    status, raw, model = call(api, "get_incident", incident_id=created.data.id, include=["users"])
    assert status == 200
    assert [u["type"] for u in raw["included"]] == ["users"]


def test_patch_answers_as_recorded_and_tracks_resolution(
    api: IncidentsApi, gpufarm_fields: None, sandbox: Sandbox
) -> None:
    created = api.create_incident(body=recorded_request(RECORDING, UPDATE, 0))
    incident_id = created.data.id
    sandbox.clock.advance(90)
    body = recorded_request(RECORDING, UPDATE, 1)
    body["data"]["id"] = incident_id
    status, raw, model = call(api, "update_incident", incident_id=incident_id, body=body)
    want_status, want = recorded(RECORDING, UPDATE, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    attributes = model.data.attributes
    assert attributes.title.endswith("-updated")
    assert attributes.state == "resolved"
    assert attributes.resolved is not None
    assert attributes.time_to_resolve == 90
    assert attributes.modified > created.data.attributes.modified
    reopened = api.update_incident(
        incident_id=incident_id, body=patch_body(incident_id, fields={"state": dropdown("active")})
    )
    assert reopened.data.attributes.resolved is None
    assert reopened.data.attributes.state == "active"


def test_patch_merges_fields_and_keeps_the_rest(api: IncidentsApi, gpufarm_fields: None) -> None:
    created = api.create_incident(
        body=incident_body("req", {"team": dropdown("nlp"), "hosts": {"type": "textarray", "value": ["h1"]}})
    )
    incident_id = created.data.id
    updated = api.update_incident(
        incident_id=incident_id,
        body=patch_body(
            incident_id, fields={"phase": dropdown("allocated"), "slug": {"type": "textbox", "value": "IR-1"}}
        ),
    )
    fields = updated.data.attributes.fields
    assert fields["team"].value == "nlp"
    assert fields["hosts"].value == ["h1"]
    assert fields["phase"].value == "allocated"


def test_delete_twice_is_404_as_recorded(api: IncidentsApi) -> None:
    incident_id = api.create_incident(body=recorded_request(RECORDING, DELETE, 0)).data.id
    status, raw, _ = call(api, "delete_incident", incident_id=incident_id)
    assert (status, raw) == (recorded(RECORDING, DELETE, 1)[0], None)
    status, raw, _ = call(api, "delete_incident", incident_id=incident_id)
    want_status, want = recorded(RECORDING, DELETE, 2)
    assert status == want_status == 404
    assert raw == {"errors": [f"incident {incident_id} not found"]}
    assert want == {"errors": [want["errors"][0]]} and want["errors"][0].startswith("incident ")
    with pytest.raises(ApiException) as missing:
        api.get_incident(incident_id=incident_id)
    assert missing.value.status == 404


def test_list_pages_are_short_at_the_end_as_recorded(api: IncidentsApi, mixed: list[str]) -> None:
    status, first, _ = call(api, "list_incidents", page_size=2)
    want_status, want_first = recorded(RECORDING, LIST_PAGES, 0)
    assert status == want_status == 200
    assert missing_keys(first, want_first) == set()
    assert first["meta"]["pagination"] == {"offset": 0, "size": 2, "next_offset": 2}
    status, last, _ = call(api, "list_incidents", page_size=2, page_offset=2)
    _, want_last = recorded(RECORDING, LIST_PAGES, 1)
    assert missing_keys(last, want_last) == set()
    assert last["meta"]["pagination"] == want_last["meta"]["pagination"] == {"offset": 2, "size": 1}
    assert [i.id for i in api.list_incidents_with_pagination(page_size=2)] == mixed


def test_search_answers_as_recorded(api: IncidentsApi, mixed: list[str]) -> None:
    status, raw, model = call(api, "search_incidents", query="state:(active OR stable OR resolved)")
    want_status, want = recorded(RECORDING, SEARCH, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want, ignore=SEARCH_IGNORE) == set()
    attributes = model.data.attributes
    assert attributes.total == 3
    assert [i.data.id for i in attributes.incidents] == mixed[::-1]  # newest first by default
    states = {f.name: f.count for f in attributes.facets.state}
    assert states["active"] == 2 and states["resolved"] == 1 and states["stable"] == 0
    team = next(f for f in attributes.facets.fields if f.name == "team")
    assert {f.name: f.count for f in team.facets} == {"nlp": 2, "vision": 0, "speech": 0}
    assert [c.count for c in attributes.facets.commander] == [2]
    resolved = raw["data"]["attributes"]["incidents"][1]["data"]["attributes"]
    assert [s["end"] is None for s in resolved["field_analytics"]["state"]["resolved"]["spans"]] == [True]


def test_search_answers_from_views_kept_per_change_are_the_views_rendered_whole(
    api: IncidentsApi, mixed: list[str], sandbox: Sandbox, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A page is its incidents' views kept as text since their last change, with field analytics as of now; asking
    # for the users renders the page whole. Both must read the same, before and after a change and a later clock.
    now = [sandbox.clock.now() + 7200]
    monkeypatch.setattr(sandbox.clock, "now", lambda: now[0])
    url = f"{sandbox_url}/api/v2/incidents/search?" + urllib.parse.urlencode(
        {"query": "state:(active OR stable OR resolved)", "page[size]": 2, "page[offset]": 1}
    )

    def both() -> dict[str, Any]:
        kept, whole = http(url), http(url + "&include=users")
        assert kept[0] == whole[0] == 200
        whole[1].pop("included")
        assert kept[1] == whole[1]
        return dict(kept[1])

    before = both()
    api.update_incident(incident_id=mixed[0], body=patch_body(mixed[0], fields={"team": dropdown("vision")}))
    now[0] += 3600
    after = both()
    changed = after["data"]["attributes"]["incidents"][1]["data"]
    assert changed["id"] == mixed[0] and changed["attributes"]["fields"]["team"]["value"] == "vision"
    spans = changed["attributes"]["field_analytics"]["state"]["active"]
    assert (
        spans["duration"]
        == before["data"]["attributes"]["incidents"][1]["data"]["attributes"]["field_analytics"]["state"]["active"][
            "duration"
        ]
        + 3600
    )


def test_search_pages_end_short(api: IncidentsApi, mixed: list[str]) -> None:
    query = "state:(active OR stable OR resolved)"
    status, first, _ = call(api, "search_incidents", query=query, page_size=2)
    _, want_first = recorded(RECORDING, SEARCH_PAGES, 0)
    assert status == 200
    assert missing_keys(first, want_first, ignore=SEARCH_PAGES_IGNORE) == set()
    assert first["meta"]["pagination"] == want_first["meta"]["pagination"] == {"offset": 0, "next_offset": 2, "size": 2}
    _, last, _ = call(api, "search_incidents", query=query, page_size=2, page_offset=2)
    _, want_last = recorded(RECORDING, SEARCH_PAGES, 1)
    assert missing_keys(last, want_last, ignore=SEARCH_PAGES_IGNORE) == set()
    assert last["meta"]["pagination"] == {"offset": 2, "next_offset": 3, "size": 1}
    found = [i.data.attributes.public_id for i in api.search_incidents_with_pagination(query=query, page_size=2)]
    assert found == [3, 2, 1]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state:(active OR stable)", [1, 2, 4]),
        ("state:resolved", [3]),
        ("team:nlp", [1, 3]),
        ("team:nlp AND phase:allocated", [1]),
        ("team:nlp phase:allocated", [1]),
        ("team:vision OR state:resolved", [2, 3]),
        ("-team:nlp", [2, 4]),
        ("NOT state:resolved AND team:(nlp OR vision)", [1, 2]),
        ("(team:nlp OR team:vision) AND -phase:requested", [1, 3]),
        ("hosts:gpu-node-02", [2]),
        ("hosts:gpu-node-0*", [1, 2]),
        ('project:"llm ko"', [1]),
        ("slug:IR-4", [4]),
        ("public_id:2", [2]),
        ("benchmark", [4]),
        ('"llm"', [1]),
        ("severity:UNKNOWN AND is_test:false", [1, 2, 3, 4]),
    ],
)
def test_search_query_language(api: IncidentsApi, gpufarm_fields: None, query: str, expected: list[int]) -> None:
    api.create_incident(
        body=incident_body(
            "GPU request llm",
            {
                "team": dropdown("nlp"),
                "phase": dropdown("allocated"),
                "hosts": {"type": "textarray", "value": ["gpu-node-01"]},
                "project": {"type": "textbox", "value": "llm ko"},
            },
        )
    )
    api.create_incident(
        body=incident_body(
            "GPU request cv",
            {
                "team": dropdown("vision"),
                "phase": dropdown("requested"),
                "hosts": {"type": "textarray", "value": ["gpu-node-02"]},
            },
        )
    )
    third = api.create_incident(
        body=incident_body("old one", {"team": dropdown("nlp"), "phase": dropdown("reclaimed")})
    )
    api.update_incident(
        incident_id=third.data.id, body=patch_body(third.data.id, fields={"state": dropdown("resolved")})
    )
    api.create_incident(body=incident_body("benchmark run"))
    answer = api.search_incidents(query=query, sort="created")
    assert [i.data.attributes.public_id for i in answer.data.attributes.incidents] == expected
    assert answer.data.attributes.total == len(expected)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("nosuchfacet:1", "unknown facet 'nosuchfacet'"),
        ("state:(active OR", "Invalid query"),
        ("state:(active AND stable)", "joined by OR"),
        ("(state:active", "Invalid query"),
        ("OR state:active", "Invalid query"),
    ],
)
def test_search_rejects_bad_queries(sandbox_url: str, query: str, message: str) -> None:
    path = "/api/v2/incidents/search?" + urllib.parse.urlencode({"query": query})
    status, body = http(f"{sandbox_url}{path}", "GET")
    assert status == 400
    assert message in body["errors"][0]


def test_search_needs_a_query_and_a_known_sort(sandbox_url: str) -> None:
    assert http(f"{sandbox_url}/api/v2/incidents/search", "GET")[0] == 400
    status, body = http(f"{sandbox_url}/api/v2/incidents/search?query=state:active&sort=newest", "GET")
    assert status == 400
    assert "sort" in body["errors"][0]
    assert http(f"{sandbox_url}/api/v2/incidents?page[size]=101", "GET")[0] == 400


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (incident_body("x", {"gpu_flavour": dropdown("H100")}), "gpu_flavour"),
        (incident_body("x", {"team": dropdown("finance")}), "'finance' is not one of"),
        (incident_body("x", {"team": {"type": "textbox", "value": "nlp"}}), "is a dropdown field"),
        (incident_body("x", {"hosts": {"type": "textarray", "value": "gpu-node-01"}}), "list of strings"),
        (incident_body("x", {"project": {"type": "textbox", "value": 5}}), "is a string"),
        (incident_body("x", {"state": dropdown("reserved")}), "'reserved' is not one of"),
        (incident_body("x", {"slug": {"type": "textbox", "value": "IR-99"}}), "read-only"),
        (incident_body("x", {"team": "nlp"}), "'type' and 'value'"),
        ({"data": {"type": "incident", "attributes": {"title": "x", "customer_impacted": False}}}, "expected one of"),
        ({"data": {"type": "incidents", "attributes": {"customer_impacted": False}}}, "title"),
        ({"data": {"type": "incidents", "attributes": {"title": "x"}}}, "customer_impacted"),
        ({"data": {"type": "incidents", "attributes": {"title": "", "customer_impacted": False}}}, "title"),
        (incident_body("x", customer_impacted=True), "customer_impact_scope"),
        ({"data": []}, "data"),
        ("{not json", "Invalid JSON"),
    ],
)
def test_bad_incident_bodies_get_datadog_400s(sandbox_url: str, gpufarm_fields: None, body: Any, message: str) -> None:
    status, answer = http(f"{sandbox_url}/api/v2/incidents", "POST", body)
    assert status == 400
    assert isinstance(answer["errors"], list)
    assert message in answer["errors"][0]
    status, listing = http(f"{sandbox_url}/api/v2/incidents", "GET")
    assert (status, listing["data"]) == (200, [])  # a bad request changes nothing


def test_bad_patch_changes_nothing(api: IncidentsApi, gpufarm_fields: None, sandbox_url: str) -> None:
    created = api.create_incident(body=incident_body("keep", {"team": dropdown("nlp")}))
    incident_id = created.data.id
    body = patch_body(incident_id, title="changed", fields={"team": dropdown("vision"), "phase": dropdown("bogus")})
    status, _ = http(f"{sandbox_url}/api/v2/incidents/{incident_id}", "PATCH", body)
    assert status == 400
    after = api.get_incident(incident_id=incident_id).data.attributes
    assert (after.title, after.fields["team"].value) == ("keep", "nlp")
    other = patch_body("00000000-0000-0000-0000-000000000000", title="x")
    assert http(f"{sandbox_url}/api/v2/incidents/{incident_id}", "PATCH", other)[0] == 400
    assert http(f"{sandbox_url}/api/v2/incidents/nope", "PATCH", patch_body("nope", title="x"))[0] == 404


def test_auth_is_required(sandbox_url: str, dd_configuration: Configuration) -> None:
    assert http(f"{sandbox_url}/api/v2/incidents", "GET", keys=False) == (403, {"errors": ["Forbidden"]})
    dd_configuration.api_key["appKeyAuth"] = "wrong"
    with ApiClient(dd_configuration) as client, pytest.raises(ApiException) as denied:
        IncidentsApi(client).list_incidents()
    assert denied.value.status == 403


def test_test_incidents_and_states_show_in_dump(api: IncidentsApi, sandbox: Sandbox) -> None:
    api.create_incident(body=incident_body("drill", is_test=True))
    dumped = sandbox.dump()["incidents"]["incidents"]
    assert [(i["public_id"], i["is_test"], i["state"]) for i in dumped] == [(1, True, "active")]
    assert dumped[0]["fields"]["slug"] == "IR-1"


# -- incident types and custom fields ------------------------------------------------------------------------


def test_incident_types(api: IncidentsApi) -> None:
    status, raw, model = call(api, "create_incident_type", body=recorded_request(RECORDING, TYPE_CREATE, 0))
    want_status, want = recorded(RECORDING, TYPE_CREATE, 0)
    assert status == want_status == 201
    assert missing_keys(raw, want) == set()
    assert model.data.attributes.name == "Security Incident"
    names = sorted(t.attributes.name for t in api.list_incident_types().data)
    assert names == ["Incident", "Security Incident"]
    status, _, _ = call(api, "delete_incident_type", incident_type_id=model.data.id)
    assert status == 204
    status, raw, _ = call(api, "delete_incident_type", incident_type_id=model.data.id)
    assert (status, raw) == (404, {"errors": [{"status": "404", "title": "Not Found"}]})


def test_custom_field_definitions_crud(api: IncidentsApi, type_id: str) -> None:
    created = define_field(api, type_id, "gpu_model", 1, ["H100", "A100"])
    attributes = created.data.attributes
    assert (attributes.name, attributes.type, attributes.display_name) == ("gpu_model", 1, "Gpu Model")
    assert [v.value for v in attributes.valid_values] == ["H100", "A100"]
    field_id = created.data.id
    status, _, listing = call(api, "list_incident_user_defined_fields")
    assert status == 200
    assert [f.attributes.name for f in listing.data] == ["gpu_model"]
    body = {
        "data": {
            "id": field_id,
            "type": "user_defined_field",
            "attributes": {
                "display_name": "GPU model",
                "valid_values": [{"value": "H100", "display_name": "H100"}, {"value": "H200", "display_name": "H200"}],
            },
        }
    }
    status, _, updated = call(api, "update_incident_user_defined_field", field_id=field_id, body=body)
    assert status == 200
    assert updated.data.attributes.display_name == "GPU model"
    assert [v.value for v in updated.data.attributes.valid_values] == ["H100", "H200"]
    status, _, got = call(api, "get_incident_user_defined_field", field_id=field_id)
    assert (status, got.data.attributes.display_name) == (200, "GPU model")
    incident = api.create_incident(body=incident_body("x", {"gpu_model": dropdown("H200")}))
    assert incident.data.attributes.fields["gpu_model"].value == "H200"
    assert call(api, "delete_incident_user_defined_field", field_id=field_id)[0] == 204
    assert call(api, "delete_incident_user_defined_field", field_id=field_id)[0] == 404
    # Once the definition is gone, the field is no longer accepted on incidents.
    with pytest.raises(ApiException) as refused:
        api.create_incident(body=incident_body("y", {"gpu_model": dropdown("H100")}))
    assert refused.value.status == 400


@pytest.mark.parametrize(
    ("attributes", "status", "message"),
    [
        ({"name": "team", "type": 1}, 400, "already exists"),
        ({"name": "state", "type": 1}, 400, "already exists"),
        ({"name": "-bad", "type": 3}, 400, "name"),
        ({"name": "count", "type": 7}, 400, "not supported"),
        ({"name": "count", "type": 9}, 400, "from 1 to 8"),
        ({"name": "note", "type": 3, "valid_values": [{"value": "a"}]}, 400, "dropdown and multiselect"),
        ({"name": "pick", "type": 1, "valid_values": [{"value": "a"}, {"value": "a"}]}, 400, "unique"),
        ({"name": "pick", "type": 1, "valid_values": [{"value": "a"}], "default_value": "b"}, 400, "valid values"),
        ({"name": "must", "type": 3, "required": True, "collected": "active"}, 400, "required"),
    ],
)
def test_bad_field_definitions(
    sandbox_url: str, gpufarm_fields: None, type_id: str, attributes: dict[str, Any], status: int, message: str
) -> None:
    body = {
        "data": {
            "type": "user_defined_field",
            "attributes": attributes,
            "relationships": {"incident_type": {"data": {"id": type_id, "type": "incident_types"}}},
        }
    }
    got_status, answer = http(f"{sandbox_url}/api/v2/incidents/config/user-defined-fields", "POST", body)
    assert got_status == status
    assert message in answer["errors"][0]["detail"]


def test_field_definition_needs_an_existing_incident_type(sandbox_url: str) -> None:
    body: dict[str, Any] = {"data": {"type": "user_defined_field", "attributes": {"name": "x", "type": 3}}}
    status, answer = http(f"{sandbox_url}/api/v2/incidents/config/user-defined-fields", "POST", body)
    assert status == 400
    assert "incident_type" in answer["errors"][0]["detail"]
    body["data"]["relationships"] = {"incident_type": {"data": {"id": "nope", "type": "incident_types"}}}
    status, _ = http(f"{sandbox_url}/api/v2/incidents/config/user-defined-fields", "POST", body)
    assert status == 404


# -- notification rules ----------------------------------------------------------------------------------------


def rule_request(scenario: str, index: int, type_id: str) -> dict[str, Any]:
    """A recorded rule request, pointed at the sandbox's incident type."""
    body = recorded_request(RECORDING, scenario, index)
    body["data"]["relationships"]["incident_type"]["data"]["id"] = type_id
    return body


def test_notification_rules_answer_as_recorded(api: IncidentsApi, type_id: str) -> None:
    status, raw, model = call(api, "create_incident_notification_rule", body=rule_request(RULE_CREATE, 1, type_id))
    want_status, want = recorded(RECORDING, RULE_CREATE, 1)
    assert status == want_status == 201
    assert missing_keys(raw, want) == set()
    rule_id = model.data.id
    assert model.data.attributes.renotify_on == []
    status, raw, _ = call(api, "get_incident_notification_rule", id=rule_id)
    assert status == 200
    assert missing_keys(raw, want) == set()
    status, raw, _ = call(api, "list_incident_notification_rules")
    want_status, want = recorded(RECORDING, RULE_LIST, 2)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert raw["meta"]["pagination"] == {"offset": 0, "next_offset": 1, "size": 1}
    body = rule_request(RULE_UPDATE, 2, type_id)
    body["data"]["id"] = rule_id
    status, raw, updated = call(api, "update_incident_notification_rule", id=rule_id, body=body)
    want_status, want = recorded(RECORDING, RULE_UPDATE, 2)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert (updated.data.attributes.enabled, updated.data.attributes.trigger) == (False, "incident_modified_trigger")
    assert (
        call(api, "delete_incident_notification_rule", id=rule_id)[0] == recorded(RECORDING, RULE_DELETE, 2)[0] == 204
    )
    status, raw, _ = call(api, "delete_incident_notification_rule", id=rule_id)
    assert (status, raw) == recorded(RECORDING, RULE_DELETE, 3)


def test_notification_rule_errors_match_recordings(sandbox_url: str, api: IncidentsApi, type_id: str) -> None:
    bad = recorded_request(RECORDING, RULE_BAD, 0)
    assert http(f"{sandbox_url}/api/v2/incidents/config/notification-rules", "POST", bad) == recorded(
        RECORDING, RULE_BAD, 0
    )
    missing = "/api/v2/incidents/config/notification-rules/00000000-0000-0000-0000-000000000001"
    assert http(f"{sandbox_url}{missing}", "GET") == recorded(RECORDING, RULE_MISSING, 0)
    assert http(f"{sandbox_url}{missing}", "PUT", recorded_request(RECORDING, RULE_UPDATE_MISSING, 0)) == recorded(
        RECORDING, RULE_UPDATE_MISSING, 0
    )
    # Known incident type, unknown rule.
    body = rule_request(RULE_UPDATE_MISSING, 0, type_id)
    assert http(f"{sandbox_url}{missing}", "PUT", body) == (
        404,
        {"errors": [{"title": "Generic Error", "detail": "rule not found"}]},
    )


def test_notification_rule_without_incident_type_uses_the_default(api: IncidentsApi, type_id: str) -> None:
    body = {
        "data": {
            "type": "incident_notification_rules",
            "attributes": {
                "conditions": [{"field": "state", "values": ["active", "stable", "resolved"]}],
                "handles": ["@webhook-gpufarm-incidents"],
                "trigger": "incident_modified_trigger",
                "renotify_on": ["state", "phase"],
            },
        }
    }
    status, _, model = call(api, "create_incident_notification_rule", body=body)
    assert status == 201
    assert model.data.relationships.incident_type.data.id == type_id
    assert model.data.attributes.enabled is False  # the spec's default
    assert model.data.attributes.visibility.value == "organization"


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"handles": ["@x"], "trigger": "incident_created_trigger"}, "conditions"),
        ({"conditions": [], "trigger": "incident_created_trigger"}, "handles"),
        ({"conditions": [], "handles": ["@x"], "trigger": "incident_deleted_trigger"}, "trigger"),
        ({"conditions": [{"field": "state"}], "handles": ["@x"], "trigger": "incident_created_trigger"}, "values"),
        (
            {"conditions": [], "handles": ["@x"], "trigger": "incident_created_trigger", "visibility": "public"},
            "visibility",
        ),
        ({"conditions": [], "handles": ["@x"], "trigger": "incident_created_trigger", "enabled": "yes"}, "enabled"),
    ],
)
def test_bad_notification_rules(sandbox_url: str, attributes: dict[str, Any], message: str) -> None:
    body = {"data": {"type": "incident_notification_rules", "attributes": attributes}}
    status, answer = http(f"{sandbox_url}/api/v2/incidents/config/notification-rules", "POST", body)
    assert status == 400
    assert answer["errors"][0]["title"] == "Bad Request"
    assert message in answer["errors"][0]["detail"]
