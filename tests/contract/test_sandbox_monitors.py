"""Sandbox monitors through the real datadog-api-client: recorded CRUD/validate traffic replayed, and the idle
monitor evaluated on the sandbox clock firing its webhook for the idle IR only."""

from __future__ import annotations

import json
import threading
import urllib.parse
from functools import partial
from typing import Any

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.exceptions import ApiException
from datadog_api_client.v1.api.monitors_api import MonitorsApi
from datadog_api_client.v1.api.webhooks_integration_api import WebhooksIntegrationApi
from datadog_api_client.v1.model.check_can_delete_monitor_response import CheckCanDeleteMonitorResponse
from datadog_api_client.v1.model.monitor import Monitor
from datadog_api_client.v1.model.monitor_options import MonitorOptions
from datadog_api_client.v1.model.monitor_overall_states import MonitorOverallStates
from datadog_api_client.v1.model.monitor_thresholds import MonitorThresholds
from datadog_api_client.v1.model.monitor_type import MonitorType
from datadog_api_client.v1.model.monitor_update_request import MonitorUpdateRequest
from datadog_api_client.v1.model.webhooks_integration import WebhooksIntegration
from datadog_api_client.v2.api.metrics_api import MetricsApi
from datadog_api_client.v2.model.metric_intake_type import MetricIntakeType
from datadog_api_client.v2.model.metric_payload import MetricPayload
from datadog_api_client.v2.model.metric_point import MetricPoint
from datadog_api_client.v2.model.metric_resource import MetricResource
from datadog_api_client.v2.model.metric_series import MetricSeries
from helpers import http as plain_http
from recorded import interactions, missing_keys, response_json
from werkzeug.wrappers import Request, Response

from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

pytestmark = pytest.mark.contract

UTIL = "gpufarm.gpu.utilization"
IDLE_QUERY = f"avg(last_1h):avg:{UTIL}{{gpufarm:managed}} by {{ir}} < 5"
IDLE_MESSAGE = (
    "{{#is_alert}}{{ir.name}} idle @webhook-gpufarm-idle{{/is_alert}}"
    "{{#is_recovery}}{{ir.name}} busy again @webhook-gpufarm-idle{{/is_recovery}}"
)

# The shared helper with the 30 s a request these tests always had.
http = partial(plain_http, timeout=30)


def deserialize(client: ApiClient, body: Any, model: type) -> Any:
    value = client.deserialize(json.dumps(body), (model,), True)
    assert not value._unparsed
    return value


# -- recorded traffic ------------------------------------------------------------------------------------------------

SCENARIOS = [
    'Create a metric monitor returns "OK" response',
    'Create a monitor returns "Bad Request" response',
    'Get a monitor\'s details returns "OK" response',
    'Get a monitor\'s details returns "Monitor Not Found error" response',
    'Edit a monitor returns "OK" response',
    'Edit a monitor returns "Monitor Not Found error" response',
    'Delete a monitor returns "OK" response',
    'Delete a monitor returns "Item not found error" response',
    'Validate a monitor returns "OK" response',
    'Validate a monitor returns "Invalid JSON" response',
    'Check if a monitor can be deleted returns "OK" response',
    'Get all monitors returns "Bad Request" response',
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_recorded_scenarios_replay_with_the_same_statuses_and_keys(
    client: ApiClient, sandbox_url: str, scenario: str
) -> None:
    ids: dict[str, str] = {}  # recorded monitor id -> ours

    def ours(text: str) -> str:
        for old, new in ids.items():
            text = text.replace(old, new)
        return text

    for step in interactions("v1-monitors.json", scenario):
        request, recorded = step["request"], response_json(step)
        query = urllib.parse.urlencode([(k, ours(v)) for k, v in request["query"]])
        url = f"{sandbox_url}{ours(request['path'])}" + (f"?{query}" if query else "")
        body = request["body"].get("value") if request["body"]["type"] == "json" else None
        status, answer = http(url, request["method"], body)
        assert status == step["response"]["status"], (request["method"], request["path"], answer)
        if status >= 400:
            assert answer == recorded  # Datadog's exact error answer
            continue
        assert missing_keys(answer, recorded) == set()
        if request["method"] == "POST" and request["path"] == "/api/v1/monitor":
            ids[str(recorded["id"])] = str(answer["id"])
        if request["method"] in {"POST", "PUT"} and "id" in recorded:
            typed = deserialize(client, answer, Monitor)
            assert typed.type.value == recorded["type"] and typed.query == recorded["query"]
            assert answer["options"] == recorded["options"]  # defaults filled in exactly as Datadog does


def test_metric_alert_is_stored_as_query_alert(client: ApiClient, sandbox_url: str) -> None:
    (create, _) = interactions("v1-monitors.json", 'Create a metric monitor returns "OK" response')
    status, answer = http(f"{sandbox_url}/api/v1/monitor", "POST", create["request"]["body"]["value"])
    assert status == 200
    recorded = response_json(create)
    assert (answer["type"], answer["multi"], answer["overall_state"], answer["options"]) == (
        recorded["type"],
        recorded["multi"],
        recorded["overall_state"],
        recorded["options"],
    )


# -- the client's monitor operations ---------------------------------------------------------------------------------


def idle_monitor() -> Monitor:
    return Monitor(
        name="[gpufarm] idle GPU allocation {{ir.name}}",
        type=MonitorType.QUERY_ALERT,
        query=IDLE_QUERY,
        message=IDLE_MESSAGE,
        tags=["service:gpufarm"],
        options=MonitorOptions(
            thresholds=MonitorThresholds(critical=5.0, warning=10.0),
            notify_no_data=False,
            require_full_window=False,
            include_tags=True,
            new_group_delay=600,
            notify_by=["ir"],
        ),
    )


def test_monitor_crud_validate_and_list(client: ApiClient) -> None:
    api = MonitorsApi(client)
    assert api.validate_monitor(idle_monitor()) == {}
    created = api.create_monitor(idle_monitor())
    assert isinstance(created, Monitor) and not created._unparsed
    assert created.overall_state == MonitorOverallStates.NO_DATA and created.multi is True
    fetched = api.get_monitor(created.id, group_states="all")
    assert fetched.query == IDLE_QUERY and fetched.state.groups == {}
    updated = api.update_monitor(created.id, MonitorUpdateRequest(name="renamed", message="@webhook-other"))
    assert (updated.name, updated.message, updated.query) == ("renamed", "@webhook-other", IDLE_QUERY)
    other = api.create_monitor(
        Monitor(name="hot", type=MonitorType.METRIC_ALERT, query=f"avg(last_5m):max:{UTIL}{{*}} > 95")
    )
    assert other.type == MonitorType.QUERY_ALERT
    assert [m.id for m in api.list_monitors()] == [created.id, other.id]
    assert [m.id for m in api.list_monitors(name="RENAM")] == [created.id]
    assert [m.id for m in api.list_monitors(monitor_tags="service:gpufarm")] == [created.id]
    assert [m.id for m in api.list_monitors(tags="gpufarm:managed")] == [created.id]
    assert [m.id for m in api.list_monitors(page=1, page_size=1)] == [other.id]
    assert [m.id for m in api.list_monitors(id_offset=created.id)] == [other.id]
    can = api.check_can_delete_monitor(monitor_ids=[created.id, 12345])
    assert isinstance(can, CheckCanDeleteMonitorResponse) and can.data.ok == [created.id]
    assert can.errors == {"12345": ["Monitor not found"]}
    assert api.delete_monitor(created.id).deleted_monitor_id == created.id
    with pytest.raises(ApiException) as info:
        api.get_monitor(created.id)
    assert info.value.status == 404


def test_validate_refuses_a_warning_below_critical_for_a_below_monitor(client: ApiClient) -> None:
    monitor = idle_monitor()
    monitor.options.thresholds = MonitorThresholds(critical=5.0, warning=3.0)
    with pytest.raises(ApiException) as info:
        MonitorsApi(client).validate_monitor(monitor)
    assert info.value.status == 400
    assert info.value.body == {
        "errors": ["Warning threshold (3) must be greater than the alert threshold (5) for the '<' comparator."]
    }


# -- evaluation ------------------------------------------------------------------------------------------------------


def feed(client: ApiClient, sandbox: Sandbox, values: dict[str, float], span: int) -> None:
    """One point a minute per host over the last `span` seconds."""
    now = int(sandbox.clock.now())
    series = [
        MetricSeries(
            metric=UTIL,
            type=MetricIntakeType.GAUGE,
            points=[MetricPoint(timestamp=t, value=v) for t in range(now - span, now + 1, 60)],
            resources=[MetricResource(name=host, type="host")],
            tags=["gpu:0"],
        )
        for host, v in values.items()
    ]
    assert MetricsApi(client).submit_metrics(MetricPayload(series=series)).errors == []


def advance(sandbox_url: str, seconds: int) -> None:
    assert http(f"{sandbox_url}/_sandbox/clock", "POST", {"advance": seconds})[0] == 200


def test_idle_monitor_triggers_only_for_the_idle_ir_then_recovers(
    client: ApiClient, sandbox: Sandbox, sandbox_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(
        sandbox.webhooks, "fire", lambda name, variables, *, origin: fired.append((name, dict(variables)))
    )
    for host, ir in (("gpu-node-01", "ir-1"), ("gpu-node-02", "ir-2")):
        assert (
            http(f"{sandbox_url}/api/v1/tags/hosts/{host}", "POST", {"tags": ["gpufarm:managed", f"ir:{ir}"]})[0] == 201
        )
    monitor = MonitorsApi(client).create_monitor(idle_monitor())
    feed(client, sandbox, {"gpu-node-01": 1.0, "gpu-node-02": 85.0}, span=3000)
    advance(sandbox_url, 60)
    assert [(n, v["ALERT_TRANSITION"], v["ALERT_SCOPE"]) for n, v in fired] == [
        ("gpufarm-idle", "Triggered", "ir:ir-1")
    ]
    variables = fired[0][1]
    assert variables["EVENT_MSG"] == "ir-1 idle @webhook-gpufarm-idle"
    assert variables["ALERT_TITLE"] == "[Triggered on {ir:ir-1}] [gpufarm] idle GPU allocation ir-1"
    assert variables["ALERT_ID"] == str(monitor.id) and variables["TAGS[ir]"] == "ir-1"
    state = MonitorsApi(client).get_monitor(monitor.id, group_states="all")
    assert state.overall_state == MonitorOverallStates.ALERT
    assert {name: g.status for name, g in state.state.groups.items()} == {
        "ir:ir-1": MonitorOverallStates.ALERT,
        "ir:ir-2": MonitorOverallStates.OK,
    }
    # The researcher gets busy: the hour's average climbs back over the warning threshold.
    feed(client, sandbox, {"gpu-node-01": 90.0, "gpu-node-02": 85.0}, span=900)
    advance(sandbox_url, 60)
    assert [(v["ALERT_TRANSITION"], v["ALERT_SCOPE"]) for _, v in fired[1:]] == [("Recovered", "ir:ir-1")]
    assert fired[1][1]["EVENT_MSG"] == "ir-1 busy again @webhook-gpufarm-idle"
    assert fired[1][1]["ALERT_CYCLE_KEY"] == variables["ALERT_CYCLE_KEY"]
    assert MonitorsApi(client).get_monitor(monitor.id).overall_state == MonitorOverallStates.OK
    status, log = http(f"{sandbox_url}/_sandbox/monitors/events?monitor_id={monitor.id}")
    assert status == 200 and [(e["transition"], e["group"]) for e in log["events"]] == [
        ("Triggered", "ir:ir-1"),
        ("Recovered", "ir:ir-1"),
    ]


class _Receiver:
    """A loopback webhook receiver that keeps every JSON body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.got = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        self.bodies.append(json.loads(Request(environ).get_data() or b"null"))
        self.got.set()
        return Response("ok")(environ, start_response)


def test_monitor_fires_through_the_webhooks_integration(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    receiver = _Receiver()
    with ServerThread(receiver) as server:
        WebhooksIntegrationApi(client).create_webhooks_integration(
            WebhooksIntegration(
                name="gpufarm-idle",
                url=f"{server.url}/hook",
                payload=json.dumps(
                    {"scope": "$ALERT_SCOPE", "transition": "$ALERT_TRANSITION", "ir": "$TAGS[ir]", "id": "$ALERT_ID"}
                ),
            )
        )
        assert (
            http(f"{sandbox_url}/api/v1/tags/hosts/gpu-node-01", "POST", {"tags": ["gpufarm:managed", "ir:ir-7"]})[0]
            == 201
        )
        monitor = MonitorsApi(client).create_monitor(idle_monitor())
        feed(client, sandbox, {"gpu-node-01": 0.5}, span=3000)
        assert http(f"{sandbox_url}/_sandbox/monitors/evaluate", "POST", {})[0] == 200
        assert sandbox.webhooks.drain(10)
        assert receiver.got.wait(5)
    assert receiver.bodies == [{"scope": "ir:ir-7", "transition": "Triggered", "ir": "ir-7", "id": str(monitor.id)}]
