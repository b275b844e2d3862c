"""Hostile inputs to the hosts, metrics and monitors endpoints get Datadog-style 4xx answers, never a 5xx."""

from __future__ import annotations

import pytest
from werkzeug.test import Client

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

HEADERS = {
    "DD-API-KEY": DEFAULT_DD_API_KEY,
    "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY,
    "Content-Type": "application/json",
}
BIG = "1" + "0" * 400  # `BIG` in a case below stands for an integer no float can hold
TS = '{"data":{"type":"timeseries_request","attributes":{"from":1,"to":BIG,"queries":[{"data_source":"metrics","query":"a{*}"}]}}}'  # noqa: E501
MONITOR = '{"type":"query alert","query":"avg(last_5m):avg:m{*} < 5","options":OPTIONS}'

CASES = [
    ("GET", "/api/v1/query?from=1e400&to=2&query=a{*}", None, 400),
    ("GET", "/api/v1/query?from=1&to=BIG&query=a{*}", None, 400),
    ("GET", "/api/v1/query?from=1&to=2&query=a{*},", None, 400),
    ("GET", "/api/v1/query?from=1&to=2&query=a{a IN ()}", None, 400),
    ("GET", "/api/v1/query?from=1&to=2&query=a{NOT}", None, 400),
    ("GET", "/api/v1/query?from=1&to=2&query=a{a:b)}", None, 400),
    ("POST", "/api/v2/query/timeseries", TS, 400),
    ("POST", "/api/v2/query/scalar", TS.replace("timeseries", "scalar").replace('"from":1', '"from":-BIG'), 400),
    ("POST", "/api/v2/series", '{"series":[{"metric":"m","points":[{"timestamp":BIG,"value":1}]}]}', 400),
    ("POST", "/api/v2/series", '{"series":[{"metric":"m","points":[{"timestamp":1,"value":BIG}]}]}', 202),
    ("POST", "/api/v2/series", '{"series":[{"metric":"m","points":[{"timestamp":1,"value":NaN}]}]}', 202),
    ("POST", "/api/v1/series", '{"series":[{"metric":"m","points":[[BIG,1]]}]}', 400),
    ("POST", "/api/v1/series", '{"series":[{"metric":"m","points":[[1,2,3]]}]}', 400),
    ("POST", "/api/v1/monitor", MONITOR.replace("OPTIONS", '{"thresholds":{"critical":BIG}}'), 400),
    ("POST", "/api/v1/monitor", MONITOR.replace("< 5", "< BIG").replace("OPTIONS", "{}"), 400),
    ("POST", "/api/v1/monitor", MONITOR.replace("OPTIONS", '{"evaluation_delay":BIG}'), 400),
    ("POST", "/api/v1/monitor", '"just a string"', 400),
    ("POST", "/api/v1/monitor/validate", "{", 400),
    ("POST", "/_sandbox/hosts", '{"hosts":[{"name":"h","last_reported":BIG}]}', 400),
    ("GET", "/api/v1/hosts?from=BIG", None, 400),
    ("GET", "/api/v1/hosts?start=BIG", None, 200),
    ("GET", "/api/v1/monitor?page=BIG", None, 200),
    ("GET", "/api/v1/monitor/BIG", None, 404),
    ("GET", "/api/v1/monitor/can_delete?monitor_ids=a,b", None, 400),
    ("POST", "/_sandbox/monitors/evaluate", "[1]", 400),
    ("GET", "/_sandbox/monitors/events?monitor_id=x", None, 400),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), CASES)
def test_hostile_input_gets_a_client_error(method: str, path: str, body: str | None, status: int) -> None:
    data = body.replace("BIG", BIG) if body else None
    response = Client(Sandbox()).open(path.replace("BIG", BIG), method=method, data=data, headers=HEADERS)
    assert response.status_code == status, response.get_data(as_text=True)
    if status >= 400:
        errors = response.json["errors"]  # type: ignore[index]
        assert errors and all(isinstance(e, str) and "Traceback" not in e for e in errors)
