"""The sandbox's Dashboards API driven by datadog-api-client, checked against recorded real Datadog traffic."""

from __future__ import annotations

from typing import Any

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.v1.api.dashboards_api import DashboardsApi
from helpers import call, http
from recorded import missing_keys, recorded, recorded_request

from gpufarm_sandbox.emulator.app import Sandbox

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


# -- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture
def api(client: ApiClient) -> DashboardsApi:
    """DashboardsApi of the real client, aimed at a freshly reset sandbox."""
    return DashboardsApi(client)


# -- tests ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [CREATE, NOTE])
def test_create_answers_as_recorded(api: DashboardsApi, scenario: str) -> None:
    body = recorded_request(RECORDING, scenario, 0)
    status, raw, model = call(api, "create_dashboard", body=body)
    want_status, want = recorded(RECORDING, scenario, 0)
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
    created = api.create_dashboard(body=recorded_request(RECORDING, GET, 0))
    status, raw, _ = call(api, "get_dashboard", dashboard_id=created.id)
    want_status, want = recorded(RECORDING, GET, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    sandbox.clock.advance(30)
    status, raw, model = call(
        api, "update_dashboard", dashboard_id=created.id, body=recorded_request(RECORDING, UPDATE, 1)
    )
    want_status, want = recorded(RECORDING, UPDATE, 1)
    assert status == want_status == 200
    assert missing_keys(raw, want) == set()
    assert model.description == "Updated description"
    assert model.created_at == created.created_at
    assert model.modified_at > created.modified_at
    assert raw["url"].split("/", 3)[3] == want["url"].split("/", 3)[3]  # the slug follows the new title
    status, raw, _ = call(api, "delete_dashboard", dashboard_id=created.id)
    assert (status, raw) == (200, {"deleted_dashboard_id": created.id})
    status, raw, _ = call(api, "delete_dashboard", dashboard_id=created.id)
    want_status, want = recorded(RECORDING, DELETE, 2)
    assert status == want_status == 404
    assert raw == {"errors": [f"Dashboard with ID {created.id} not found"]}
    assert call(api, "get_dashboard", dashboard_id=created.id)[0] == 404


def test_list_summaries_as_recorded(api: DashboardsApi) -> None:
    first = api.create_dashboard(body=recorded_request(RECORDING, LIST, 0))
    second = api.create_dashboard(body=GPUFARM_DASHBOARD)
    status, raw, model = call(api, "list_dashboards", filter_shared=False)
    want_status, want = recorded(RECORDING, LIST, 1)
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
    assert http(f"{sandbox_url}/api/v1/dashboard", "DELETE", missing)[0] == 404
    assert http(f"{sandbox_url}/api/v1/dashboard", "DELETE", {"data": []})[0] == 400


def test_invalid_team_tags_as_recorded(sandbox_url: str) -> None:
    assert http(f"{sandbox_url}/api/v1/dashboard", "POST", recorded_request(RECORDING, BAD_TAGS, 0)) == recorded(
        RECORDING, BAD_TAGS, 0
    )


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
    status, answer = http(f"{sandbox_url}/api/v1/dashboard", "POST", body)
    assert status == 400
    assert message in answer["errors"][0]
    assert http(f"{sandbox_url}/api/v1/dashboard", "GET")[1] == {"dashboards": []}


def test_auth_and_unknown_ids(sandbox_url: str) -> None:
    assert http(f"{sandbox_url}/api/v1/dashboard", "GET", keys=False) == (403, {"errors": ["Forbidden"]})
    assert http(f"{sandbox_url}/api/v1/dashboard/abc-def-ghi", "PUT", GPUFARM_DASHBOARD) == (
        404,
        {"errors": ["Dashboard with ID abc-def-ghi not found"]},
    )
    assert http(f"{sandbox_url}/api/v1/dashboard?count=101", "GET")[0] == 400
    assert http(f"{sandbox_url}/api/v1/dashboard?filter[deleted]=maybe", "GET")[0] == 400
