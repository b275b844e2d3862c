"""The sandbox's Dashboards API driven by datadog-api-client, checked against recorded real Datadog traffic."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.exceptions import ApiException
from datadog_api_client.model_utils import OpenApiModel
from datadog_api_client.v1.api.dashboards_api import DashboardsApi
from recorded import interactions, missing_keys, response_json

from gpufarm.sandbox.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

pytestmark = pytest.mark.contract

RECORDING = "v1-dashboards.json"
CREATE = 'Create a new dashboard returns "OK" response'
NOTE = "Create a new dashboard with note widget"
GET = 'Get a dashboard returns "OK" response'
UPDATE = 'Update a dashboard returns "OK" response'
DELETE = 'Delete a dashboard returns "OK" response'
LIST = 'Get all dashboards returns "OK" response'
BAD_TAGS = 'Create a new dashboard with invalid team tags returns "Bad Request" response'

# A dashboard as gpufarm would write one: template variable, group, timeseries, query value, toplist, iframe.
GPUFARM_DASHBOARD: dict[str, Any] = {
    "title": "gpufarm: GPU usage by IR",
    "layout_type": "ordered",
    "template_variables": [{"name": "project", "prefix": "project"}],
    "widgets": [
        {
            "definition": {
                "type": "group",
                "layout_type": "ordered",
                "title": "Utilization",
                "widgets": [
                    {
                        "definition": {
                            "type": "timeseries",
                            "requests": [{"q": "avg:gpufarm.gpu.utilization{$project} by {ir}"}],
                        }
                    },
                    {
                        "definition": {
                            "type": "query_value",
                            "requests": [{"q": "avg:gpufarm.gpu.utilization{$project}", "aggregator": "avg"}],
                        }
                    },
                ],
            }
        },
        {
            "definition": {
                "type": "toplist",
                "requests": [{"q": "top(avg:gpufarm.gpu.utilization{*} by {ir}, 10, 'mean', 'desc')"}],
            }
        },
        {"definition": {"type": "iframe", "url": "https://example.com/profiler"}},
        {"definition": {"type": "note", "content": "Idle GPUs are reclaimed after the grace period."}},
    ],
}


# -- helpers ----------------------------------------------------------------------------------------------


def unparsed_paths(node: Any, path: str = "$") -> list[str]:
    """Where the client could not type an answer."""
    found: list[str] = []
    if isinstance(node, OpenApiModel):
        if getattr(node, "_unparsed", False):
            found.append(path)
        for key, value in node._data_store.items():
            found += unparsed_paths(value, f"{path}.{key}")
    elif isinstance(node, (list, tuple)):
        for index, item in enumerate(node):
            found += unparsed_paths(item, f"{path}[{index}]")
    return found


def call(api: Any, operation: str, **kwargs: Any) -> tuple[int, Any, Any]:
    """(status, raw JSON, typed model) of one client operation; errors as (status, body, None)."""
    cfg = api.api_client.configuration
    cfg.preload_content = False
    try:
        answer = getattr(api, operation)(**kwargs)
    except ApiException as exc:
        return int(exc.status), exc.body or None, None
    finally:
        cfg.preload_content = True
    raw = json.loads(answer.data) if answer.data else None
    model = None
    response_type = getattr(api, f"_{operation}_endpoint").settings["response_type"]
    if raw is not None and response_type:
        model = api.api_client.deserialize(answer.data.decode(), response_type, True)
        assert unparsed_paths(model) == []
    return answer.status, raw, model


def recorded(scenario: str, index: int) -> tuple[int, Any]:
    """Status and JSON body of one recorded answer."""
    interaction = interactions(RECORDING, scenario)[index]
    return interaction["response"]["status"], response_json(interaction)


def recorded_request(scenario: str, index: int) -> dict[str, Any]:
    """The JSON body of one recorded request."""
    body = interactions(RECORDING, scenario)[index]["request"]["body"]["value"]
    return dict(json.loads(body) if isinstance(body, str) else body)


def http(url: str, method: str, path: str, body: Any = None, *, keys: bool = True) -> tuple[int, Any]:
    """Plain HTTP, for bodies the client refuses to build."""
    headers = {"Content-Type": "application/json"}
    if keys:
        headers.update({"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY})
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, json.loads(text) if text else None


@pytest.fixture
def api(sandbox_url: str) -> Iterator[DashboardsApi]:
    """DashboardsApi of the real client, aimed at a freshly reset sandbox."""
    cfg = Configuration(host=sandbox_url, check_return_type=True)
    cfg.api_key["apiKeyAuth"] = DEFAULT_DD_API_KEY
    cfg.api_key["appKeyAuth"] = DEFAULT_DD_APP_KEY
    with ApiClient(cfg) as client:
        yield DashboardsApi(client)


# -- tests ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [CREATE, NOTE])
def test_create_answers_as_recorded(api: DashboardsApi, scenario: str) -> None:
    body = recorded_request(scenario, 0)
    status, raw, model = call(api, "create_dashboard", body=body)
    want_status, want = recorded(scenario, 0)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert model.title == body["title"]
    assert len(model.id) == 11 and model.id.count("-") == 2
    assert model.url == f"/dashboard/{model.id}/" + want["url"].split("/", 3)[3]  # same slug rule as Datadog
    assert all(isinstance(w.id, int) for w in model.widgets)
    # Widgets are kept verbatim: Datadog adds only their ids.
    assert [{k: v for k, v in w.items() if k != "id"} for w in raw["widgets"]] == body["widgets"]


def test_gpufarm_dashboard_round_trip(api: DashboardsApi) -> None:
    status, raw, model = call(api, "create_dashboard", body=GPUFARM_DASHBOARD)
    assert status == 200
    group = raw["widgets"][0]["definition"]
    assert all(isinstance(w["id"], int) for w in group["widgets"])
    assert raw["template_variables"] == GPUFARM_DASHBOARD["template_variables"]
    status, got, _ = call(api, "get_dashboard", dashboard_id=model.id)
    assert (status, got) == (200, raw)


def test_get_update_delete_as_recorded(api: DashboardsApi, sandbox: Sandbox) -> None:
    created = api.create_dashboard(body=recorded_request(GET, 0))
    status, raw, _ = call(api, "get_dashboard", dashboard_id=created.id)
    want_status, want = recorded(GET, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    sandbox.clock.advance(30)
    status, raw, model = call(api, "update_dashboard", dashboard_id=created.id, body=recorded_request(UPDATE, 1))
    want_status, want = recorded(UPDATE, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert model.description == "Updated description"
    assert model.created_at == created.created_at
    assert model.modified_at > created.modified_at
    assert raw["url"].split("/", 3)[3] == want["url"].split("/", 3)[3]  # the slug follows the new title
    status, raw, _ = call(api, "delete_dashboard", dashboard_id=created.id)
    assert (status, raw) == (200, {"deleted_dashboard_id": created.id})
    status, raw, _ = call(api, "delete_dashboard", dashboard_id=created.id)
    want_status, want = recorded(DELETE, 2)
    assert status == want_status == 404
    assert raw == {"errors": [f"Dashboard with ID {created.id} not found"]}
    assert call(api, "get_dashboard", dashboard_id=created.id)[0] == 404


def test_list_summaries_as_recorded(api: DashboardsApi) -> None:
    first = api.create_dashboard(body=recorded_request(LIST, 0))
    second = api.create_dashboard(body=GPUFARM_DASHBOARD)
    status, raw, model = call(api, "list_dashboards", filter_shared=False)
    want_status, want = recorded(LIST, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert [d.id for d in model.dashboards] == [first.id, second.id]
    assert "widgets" not in raw["dashboards"][0]
    assert [d.id for d in api.list_dashboards(count=1, start=1).dashboards] == [second.id]
    assert [d.id for d in api.list_dashboards_with_pagination(count=1)] == [first.id, second.id]
    api.delete_dashboard(dashboard_id=first.id)
    assert [d.id for d in api.list_dashboards().dashboards] == [second.id]
    deleted = api.list_dashboards(filter_deleted=True).dashboards
    assert [d.id for d in deleted] == [first.id]
    assert api.list_dashboards(filter_shared=True).dashboards == []


def test_bulk_delete_and_restore(api: DashboardsApi, sandbox_url: str) -> None:
    ids = [api.create_dashboard(body=GPUFARM_DASHBOARD).id for _ in range(2)]
    items = {"data": [{"id": i, "type": "dashboard"} for i in ids]}
    assert call(api, "delete_dashboards", body=items)[0] == 204
    assert api.list_dashboards().dashboards == []
    assert call(api, "restore_dashboards", body=items)[0] == 204
    assert sorted(d.id for d in api.list_dashboards().dashboards) == sorted(ids)
    missing = {"data": [{"id": "abc-def-ghi", "type": "dashboard"}]}
    assert http(sandbox_url, "DELETE", "/api/v1/dashboard", missing)[0] == 404
    assert http(sandbox_url, "DELETE", "/api/v1/dashboard", {"data": []})[0] == 400


def test_invalid_team_tags_as_recorded(sandbox_url: str) -> None:
    assert http(sandbox_url, "POST", "/api/v1/dashboard", recorded_request(BAD_TAGS, 0)) == recorded(BAD_TAGS, 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"layout_type": "ordered", "widgets": []}, "'title'"),
        ({"title": "t", "widgets": []}, "'layout_type'"),
        ({"title": "t", "layout_type": "ordered"}, "'widgets'"),
        ({"title": 5, "layout_type": "ordered", "widgets": []}, "title"),
        ({"title": "t", "layout_type": "grid", "widgets": []}, "layout_type"),
        ({"title": "t", "layout_type": "ordered", "widgets": {}}, "widgets"),
        (
            {"title": "t", "layout_type": "ordered", "widgets": [{"definition": {"type": "nope"}}]},
            "widgets[0].definition",
        ),
        (
            {"title": "t", "layout_type": "ordered", "widgets": [{"definition": {"type": "note"}}]},
            "widgets[0].definition",
        ),
        (
            {"title": "t", "layout_type": "free", "widgets": [{"definition": {"type": "note", "content": "x"}}]},
            "layout",
        ),
        ({"title": "t", "layout_type": "ordered", "widgets": [], "notify_list": "ops"}, "Invalid dashboard"),
        ("[1]", "object"),
    ],
)
def test_bodies_the_client_model_rejects_get_400s(sandbox_url: str, body: Any, message: str) -> None:
    status, answer = http(sandbox_url, "POST", "/api/v1/dashboard", body)
    assert status == 400
    assert message in answer["errors"][0]
    assert http(sandbox_url, "GET", "/api/v1/dashboard")[1] == {"dashboards": []}


def test_auth_and_unknown_ids(sandbox_url: str) -> None:
    assert http(sandbox_url, "GET", "/api/v1/dashboard", keys=False) == (403, {"errors": ["Forbidden"]})
    assert http(sandbox_url, "PUT", "/api/v1/dashboard/abc-def-ghi", GPUFARM_DASHBOARD) == (
        404,
        {"errors": ["Dashboard with ID abc-def-ghi not found"]},
    )
    assert http(sandbox_url, "GET", "/api/v1/dashboard?count=101")[0] == 400
    assert http(sandbox_url, "GET", "/api/v1/dashboard?filter[deleted]=maybe")[0] == 400
