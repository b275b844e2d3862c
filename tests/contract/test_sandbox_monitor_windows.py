"""The sandbox's monitor windows through the real datadog-api-client: validate, create and update take exactly the
windows Datadog's reference documents (the fixed list by default, the current reference's ranges on request) and
refuse the rest with the same 400, so validate says what create would do."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.exceptions import ApiException
from datadog_api_client.v1.api.monitors_api import MonitorsApi
from datadog_api_client.v1.model.monitor import Monitor
from datadog_api_client.v1.model.monitor_options import MonitorOptions
from datadog_api_client.v1.model.monitor_thresholds import MonitorThresholds
from datadog_api_client.v1.model.monitor_type import MonitorType
from datadog_api_client.v1.model.monitor_update_request import MonitorUpdateRequest
from helpers import http as plain_http

from gpufarm.core.config.farm import MONITOR_WINDOW_MINUTES
from gpufarm.setup.monitors import window_text

pytestmark = pytest.mark.contract

http = partial(plain_http, timeout=30)

FIXED = ["last_5m", "last_10m", "last_15m", "last_30m", "last_1h", "last_2h", "last_4h", "last_1d"]
# In no version of the reference's fixed list: minutes that make a whole hour, odd minutes, more than a day.
NOT_FIXED = ["last_60m", "last_120m", "last_7m", "last_1m", "last_90m", "last_3h", "last_2d", "last_1w", "last_05m"]
# Not in the current reference's ranges either: past a week, whole days but one, zero, leading zeros.
NEVER = ["last_10081m", "last_169h", "last_2d", "last_2w", "last_0m", "last_060m", "last_1mo"]


def query(window: str) -> str:
    return f"avg({window}):avg:gpufarm.gpu.utilization{{gpufarm:managed}} by {{gpu_ir,host}} < 5"


def monitor(window: str) -> Monitor:
    return Monitor(
        name=f"window {window}",
        type=MonitorType.QUERY_ALERT,
        query=query(window),
        message="@webhook-gpufarm-idle",
        tags=["gpufarm:managed"],
        options=MonitorOptions(thresholds=MonitorThresholds(critical=5.0), new_group_delay=3600),
    )


def refusal(call: Any) -> tuple[int, Any]:
    """The status and body of the ApiException a client call raises (the test fails if it answers 2xx)."""
    with pytest.raises(ApiException) as info:
        call()
    return int(info.value.status), info.value.body


def test_gpufarm_writes_every_configurable_window_in_the_fixed_list() -> None:
    assert [window_text(minutes) for minutes in MONITOR_WINDOW_MINUTES] == FIXED


@pytest.mark.parametrize("window", FIXED)
def test_validate_and_create_take_a_documented_window(client: ApiClient, window: str) -> None:
    api = MonitorsApi(client)
    assert api.validate_monitor(monitor(window)) == {}
    created = api.create_monitor(monitor(window))
    assert created.query == query(window) and not created._unparsed
    assert api.validate_existing_monitor(created.id, monitor(window)) == {}


@pytest.mark.parametrize("window", NOT_FIXED)
def test_validate_create_and_update_refuse_an_undocumented_window_alike(client: ApiClient, window: str) -> None:
    api = MonitorsApi(client)
    expected = {"errors": [f"The value provided for parameter 'query' is invalid: invalid time window {window}"]}
    assert refusal(lambda: api.validate_monitor(monitor(window))) == (400, expected)
    assert refusal(lambda: api.create_monitor(monitor(window))) == (400, expected)
    kept = api.create_monitor(monitor("last_1h"))
    assert refusal(lambda: api.validate_existing_monitor(kept.id, monitor(window))) == (400, expected)
    assert refusal(lambda: api.update_monitor(kept.id, MonitorUpdateRequest(query=query(window)))) == (400, expected)
    # Nothing refused was stored, and the monitor refused an update kept its query.
    assert [(m.id, m.query) for m in api.list_monitors()] == [(kept.id, query("last_1h"))]


def test_the_current_references_ranges_on_request(client: ApiClient, sandbox_url: str) -> None:
    api = MonitorsApi(client)
    assert http(f"{sandbox_url}/_sandbox/monitors/windows") == (200, {"grammar": "fixed"})
    assert http(f"{sandbox_url}/_sandbox/monitors/windows", "POST", {"grammar": "ranges"}) == (
        200,
        {"grammar": "ranges"},
    )
    for window in ["last_60m", "last_7m", "last_1m", "last_90m", "last_10080m", "last_168h", "last_1w", *FIXED]:
        assert api.validate_monitor(monitor(window)) == {}, window
    for window in NEVER:
        status, body = refusal(lambda window=window: api.create_monitor(monitor(window)))
        assert status == 400 and "invalid time window" in body["errors"][0], window
    status, body = http(f"{sandbox_url}/_sandbox/monitors/windows", "POST", {"grammar": "any"})
    assert status == 400 and body == {"errors": ["grammar must be one of fixed, ranges"]}
    # A reset plays the fixed list again.
    assert http(f"{sandbox_url}/_sandbox/reset", "POST")[0] == 200
    assert http(f"{sandbox_url}/_sandbox/monitors/windows") == (200, {"grammar": "fixed"})
    assert refusal(lambda: api.validate_monitor(monitor("last_60m")))[0] == 400


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            {"query": "avg(last_1h):avg:gpufarm.gpu.utilization{gpufarm:managed} by {gpu_ir,host}"},
            "The value provided for parameter 'query' is invalid: invalid operator specified: ",
        ),
        (
            {"query": "avg(last_1h):avg:gpufarm.gpu.utilization{ < 5"},
            "The value provided for parameter 'query' is invalid: Error parsing query",
        ),
        (
            {"options": {"thresholds": {"critical": 5.0, "warning": 3.0}}},
            "Warning threshold (3) must be greater than the alert threshold (5) for the '<' comparator.",
        ),
        (
            {"options": {"thresholds": {"critical": 4.0}}},
            "The value provided for parameter 'query' is invalid: Alert threshold (4) does not match that used in "
            "the query (5).",
        ),
        (
            {"options": {"renotify_statuses": ["ok"]}},
            "The value provided for parameter 'renotify_statuses' is invalid: alert, warn, no data",
        ),
        (
            {"options": {"scheduling_options": {"evaluation_window": {"hour_starts": 0}}}},
            "Monitors with an evaluation_window scheduling_option must have a current query period and vice versa.",
        ),
        (
            {"query": "avg(current_1mo):avg:gpufarm.gpu.utilization{gpufarm:managed} < 5"},
            "Monitors with an evaluation_window scheduling_option must have a current query period and vice versa.",
        ),
    ],
)
def test_validate_refuses_what_create_refuses_with_the_same_answer(
    sandbox_url: str, change: dict[str, Any], error: str
) -> None:
    body = {**monitor("last_1h").to_dict(), **change}
    validate = http(f"{sandbox_url}/api/v1/monitor/validate", "POST", body)
    create = http(f"{sandbox_url}/api/v1/monitor", "POST", body)
    assert validate[0] == 400 and validate == create
    assert validate[1]["errors"][0].startswith(error)
    assert http(f"{sandbox_url}/api/v1/monitor")[1] == []


def test_a_cumulative_window_with_its_evaluation_window_is_taken(client: ApiClient, sandbox_url: str) -> None:
    body = {
        **monitor("last_1h").to_dict(),
        "query": "avg(current_1mo):avg:gpufarm.gpu.utilization{gpufarm:managed} < 5",
        "options": {
            "thresholds": {"critical": 5.0},
            "scheduling_options": {"evaluation_window": {"day_starts": "04:00", "month_starts": 1}},
        },
    }
    assert http(f"{sandbox_url}/api/v1/monitor/validate", "POST", body) == (200, {})
    assert http(f"{sandbox_url}/api/v1/monitor", "POST", body)[0] == 200
