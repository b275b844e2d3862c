"""Sandbox metric intake and queries through the real datadog-api-client, checked against recorded Datadog traffic."""

from __future__ import annotations

import copy
import gzip
import json
from functools import partial
from typing import Any

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.exceptions import ApiException
from datadog_api_client.v1.api.metrics_api import MetricsApi as MetricsApiV1
from datadog_api_client.v1.model.intake_payload_accepted import IntakePayloadAccepted as V1Accepted
from datadog_api_client.v1.model.metrics_payload import MetricsPayload
from datadog_api_client.v1.model.metrics_query_response import MetricsQueryResponse
from datadog_api_client.v1.model.point import Point
from datadog_api_client.v1.model.series import Series
from datadog_api_client.v2.api.metrics_api import MetricsApi
from datadog_api_client.v2.model.formula_limit import FormulaLimit
from datadog_api_client.v2.model.intake_payload_accepted import IntakePayloadAccepted
from datadog_api_client.v2.model.metric_content_encoding import MetricContentEncoding
from datadog_api_client.v2.model.metric_intake_type import MetricIntakeType
from datadog_api_client.v2.model.metric_payload import MetricPayload
from datadog_api_client.v2.model.metric_point import MetricPoint
from datadog_api_client.v2.model.metric_resource import MetricResource
from datadog_api_client.v2.model.metric_series import MetricSeries
from datadog_api_client.v2.model.metrics_aggregator import MetricsAggregator
from datadog_api_client.v2.model.metrics_data_source import MetricsDataSource
from datadog_api_client.v2.model.metrics_scalar_query import MetricsScalarQuery
from datadog_api_client.v2.model.metrics_timeseries_query import MetricsTimeseriesQuery
from datadog_api_client.v2.model.query_formula import QueryFormula
from datadog_api_client.v2.model.query_sort_order import QuerySortOrder
from datadog_api_client.v2.model.scalar_formula_query_request import ScalarFormulaQueryRequest
from datadog_api_client.v2.model.scalar_formula_query_response import ScalarFormulaQueryResponse
from datadog_api_client.v2.model.scalar_formula_request import ScalarFormulaRequest
from datadog_api_client.v2.model.scalar_formula_request_attributes import ScalarFormulaRequestAttributes
from datadog_api_client.v2.model.scalar_formula_request_queries import ScalarFormulaRequestQueries
from datadog_api_client.v2.model.scalar_formula_request_type import ScalarFormulaRequestType
from datadog_api_client.v2.model.timeseries_formula_query_request import TimeseriesFormulaQueryRequest
from datadog_api_client.v2.model.timeseries_formula_query_response import TimeseriesFormulaQueryResponse
from datadog_api_client.v2.model.timeseries_formula_request import TimeseriesFormulaRequest
from datadog_api_client.v2.model.timeseries_formula_request_attributes import TimeseriesFormulaRequestAttributes
from datadog_api_client.v2.model.timeseries_formula_request_queries import TimeseriesFormulaRequestQueries
from datadog_api_client.v2.model.timeseries_formula_request_type import TimeseriesFormulaRequestType
from helpers import http as plain_http
from recorded import interactions, missing_keys, response_json

from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

UTIL = "gpufarm.gpu.utilization"

# The shared helper with the 30 s a request these tests always had.
http = partial(plain_http, timeout=30)


def submit(client: ApiClient, *series: MetricSeries, encoding: MetricContentEncoding | None = None) -> list[str]:
    kwargs = {"content_encoding": encoding} if encoding else {}
    answer = MetricsApi(client).submit_metrics(MetricPayload(series=list(series)), **kwargs)
    assert isinstance(answer, IntakePayloadAccepted) and not answer._unparsed
    return list(answer.errors)


def gauge(metric: str, host: str, points: list[tuple[float, float]], **extra: Any) -> MetricSeries:
    return MetricSeries(
        metric=metric,
        type=MetricIntakeType.GAUGE,
        points=[MetricPoint(timestamp=int(t), value=v) for t, v in points],
        resources=[MetricResource(name=host, type="host")],
        **extra,
    )


def tag_host(sandbox_url: str, host: str, *tags: str) -> None:
    assert http(f"{sandbox_url}/api/v1/tags/hosts/{host}", "PUT", {"tags": list(tags)})[0] == 201


# -- intake ----------------------------------------------------------------------------------------------------------


def test_v2_submit_matches_the_recorded_answer(sandbox: Sandbox, sandbox_url: str) -> None:
    (recorded,) = interactions("v2-metrics.json", 'Submit metrics returns "Payload accepted" response')
    body = copy.deepcopy(recorded["request"]["body"]["value"])
    body["series"][0]["points"][0]["timestamp"] = int(sandbox.clock.now())  # the recorded one is years old
    status, answer = http(f"{sandbox_url}{recorded['request']['path']}", "POST", body, {"DD-APPLICATION-KEY": ""})
    assert (status, answer) == (recorded["response"]["status"], response_json(recorded))
    assert sandbox.hosts.exists("dummyhost")


def test_v1_submit_matches_the_recorded_answer(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    (recorded,) = interactions("v1-metrics.json", 'Submit metrics returns "Payload accepted" response')
    body = copy.deepcopy(recorded["request"]["body"]["value"])
    body["series"][0]["points"][0][0] = int(sandbox.clock.now())
    status, answer = http(f"{sandbox_url}{recorded['request']['path']}", "POST", body, {"Content-Type": "text/json"})
    assert (status, answer) == (recorded["response"]["status"], response_json(recorded))
    now = int(sandbox.clock.now())
    typed = MetricsApiV1(client).submit_metrics(
        MetricsPayload(series=[Series(metric="system.load.1", points=[Point([now, 0.7])], host="h1", type="gauge")])
    )
    assert isinstance(typed, V1Accepted) and typed.status == "ok"


@pytest.mark.parametrize("encoding", [MetricContentEncoding.GZIP, MetricContentEncoding.DEFLATE])
def test_compressed_submit_through_the_client(
    client: ApiClient, sandbox: Sandbox, encoding: MetricContentEncoding
) -> None:
    now = sandbox.clock.now()
    assert (
        submit(client, gauge(UTIL, "gpu-1", [(now - 30, 40.0), (now, 60.0)], tags=["gpu:0"]), encoding=encoding) == []
    )
    (group,) = sandbox.metrics.query_series(f"avg:{UTIL}{{host:gpu-1,gpu:0}}", now - 60, now, interval=60)
    assert sum(v for _, v in group.points) / len(group.points) == pytest.approx(50.0, abs=10)


def test_points_too_old_or_too_new_are_dropped_with_an_explanation(client: ApiClient, sandbox: Sandbox) -> None:
    now = sandbox.clock.now()
    errors = submit(client, gauge(UTIL, "gpu-1", [(now - 2 * 3600, 1.0), (now + 3600, 2.0), (now, 3.0)]))
    assert errors == [
        f"{UTIL}: 2 point(s) dropped: timestamps must be within 60 minutes in the past and 10 minutes in the future"
    ]
    assert sandbox.metrics.dump()["points"] == 1


def test_intake_errors(sandbox_url: str) -> None:
    url = f"{sandbox_url}/api/v2/series"
    assert http(url, "POST", {"series": [{"metric": "m", "type": 9, "points": []}]})[0] == 400
    assert http(url, "POST", b"{not json")[0] == 400
    assert http(url, "POST", {"series": []}, {"DD-API-KEY": "nope"}) == (403, {"errors": ["Forbidden"]})
    too_big = gzip.compress(b" " * 10) + b"\0" * 600_000
    assert http(url, "POST", too_big, {"Content-Encoding": "gzip"}) == (413, {"errors": ["Payload too large"]})
    assert http(url, "POST", b"{}", {"Content-Encoding": "br"})[0] == 415


def test_hundred_thousand_points_in_batches_is_fast(sandbox: Sandbox, sandbox_url: str) -> None:
    now = int(sandbox.clock.now())
    bodies = []
    for batch in range(100):  # 100 x (100 series x 10 points), gzip, as the node agent batches
        series = [
            {
                "metric": UTIL,
                "type": 3,
                "points": [{"timestamp": now - 3000 + batch * 25 + p, "value": float(p)} for p in range(10)],
                "resources": [{"type": "host", "name": f"gpu-node-{s:03d}"}],
                "tags": [f"gpu:{s % 8}"],
            }
            for s in range(100)
        ]
        bodies.append(gzip.compress(json.dumps({"series": series}).encode()))
    # How fast this goes is measured by benchmarks/sandbox.py; here only that every point is kept.
    for body in bodies:
        assert http(f"{sandbox_url}/api/v2/series", "POST", body, {"Content-Encoding": "gzip"}) == (202, {"errors": []})
    assert sandbox.metrics.dump()["points"] == 100_000


# -- v1 query --------------------------------------------------------------------------------------------------------


def test_v1_query_matches_the_recorded_answer(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    (recorded,) = interactions("v1-metrics.json", 'Query timeseries points returns "OK" response')
    now = int(sandbox.clock.now())
    submit(
        client, gauge("system.cpu.idle", "h1", [(now - 600 + 15 * i, 90.0 + i % 3) for i in range(40)], unit="percent")
    )
    query = recorded["request"]["query"]
    params = dict(query)
    status, ours = http(f"{sandbox_url}/api/v1/query?from={now - 86400}&to={now}&query={params['query']}")
    assert status == recorded["response"]["status"]
    assert missing_keys(ours, response_json(recorded)) == set()
    (series,) = ours["series"]
    assert series["interval"] == 300 and series["scope"] == "*" and series["aggr"] is None  # as recorded for 1 day
    assert all(t % 300_000 == 0 for t, _ in series["pointlist"]) and series["length"] == len(series["pointlist"])
    assert series["unit"][0]["name"] == "percent"
    typed = MetricsApiV1(client).query_metrics(_from=now - 86400, to=now, query=params["query"])
    assert isinstance(typed, MetricsQueryResponse) and not typed._unparsed


def test_v1_query_groups_and_tags(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    tag_host(sandbox_url, "gpu-1", "ir:ir-1", "env:prod")
    tag_host(sandbox_url, "gpu-2", "ir:ir-2", "env:prod")
    now = int(sandbox.clock.now())
    submit(client, gauge(UTIL, "gpu-1", [(now - 60, 10.0)]), gauge(UTIL, "gpu-2", [(now - 60, 30.0)]))
    answer = MetricsApiV1(client).query_metrics(_from=now - 3600, to=now, query=f"max:{UTIL}{{env:prod}} by {{ir}}")
    got = {tuple(s.tag_set): (s.scope, s.expression, s.aggr, s.pointlist[0].value[1]) for s in answer.series}
    assert got == {
        ("ir:ir-1",): ("env:prod,ir:ir-1", f"max:{UTIL}{{env:prod,ir:ir-1}}", "max", 10.0),
        ("ir:ir-2",): ("env:prod,ir:ir-2", f"max:{UTIL}{{env:prod,ir:ir-2}}", "max", 30.0),
    }
    assert answer.group_by == ["ir"]


@pytest.mark.parametrize(
    ("query", "fragment"),
    [("from=1&to=2", "query"), ("to=2&query=a{*}", "from"), ("from=5&to=2&query=a{*}", "from"),
     ("from=1&to=2&query=avg:m{", "Error parsing query"), ("from=x&to=2&query=a{*}", "from")],
)  # fmt: skip
def test_v1_query_errors(sandbox_url: str, query: str, fragment: str) -> None:
    status, answer = http(f"{sandbox_url}/api/v1/query?{query}")
    assert status == 400 and fragment in answer["errors"][0]


# -- v2 timeseries and scalar ----------------------------------------------------------------------------------------


def _replay(recorded: dict[str, Any], sandbox_url: str, now_ms: int | None) -> tuple[int, Any]:
    body = copy.deepcopy(recorded["request"]["body"]["value"])
    if now_ms is not None:
        body["data"]["attributes"]["from"] = now_ms - 3_600_000
        body["data"]["attributes"]["to"] = now_ms
    return http(f"{sandbox_url}{recorded['request']['path']}", "POST", body)


def test_v2_timeseries_matches_the_recorded_answers(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    now = int(sandbox.clock.now())
    submit(client, gauge("datadog.estimated_usage.metrics.custom", "h1", [(now - 600, 1.0), (now - 300, 87.0)]))
    (ok,) = interactions("v2-metrics.json", 'Timeseries cross product query returns "OK" response')
    status, ours = _replay(ok, sandbox_url, now * 1000)
    assert status == ok["response"]["status"]
    assert missing_keys(ours, response_json(ok)) == set()
    assert ours["data"]["attributes"]["values"] == [[1.0, 87.0]]
    (bad,) = interactions("v2-metrics.json", 'Timeseries cross product query returns "Bad Request" response')
    assert _replay(bad, sandbox_url, None) == (bad["response"]["status"], response_json(bad))


def test_v2_scalar_matches_the_recorded_answers(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    now = int(sandbox.clock.now())
    submit(client, gauge("system.cpu.user", "h1", [(now - 600, 4.0), (now - 300, 8.0)], unit="percent"))
    (ok,) = interactions("v2-metrics.json", 'Scalar cross product query returns "OK" response')
    status, ours = _replay(ok, sandbox_url, now * 1000)
    assert status == ok["response"]["status"]
    assert missing_keys(ours, response_json(ok)) == set()
    assert ours["data"]["attributes"]["columns"][0]["values"] == [6.0]
    (bad,) = interactions("v2-metrics.json", 'Scalar cross product query returns "Bad Request" response')
    assert _replay(bad, sandbox_url, None) == (bad["response"]["status"], response_json(bad))


def _timeseries_request(now: int, queries: list[tuple[str, str]], formulas: list[str]) -> TimeseriesFormulaQueryRequest:
    return TimeseriesFormulaQueryRequest(
        data=TimeseriesFormulaRequest(
            type=TimeseriesFormulaRequestType.TIMESERIES_REQUEST,
            attributes=TimeseriesFormulaRequestAttributes(
                _from=(now - 3600) * 1000,
                to=now * 1000,
                interval=60_000,
                queries=TimeseriesFormulaRequestQueries(
                    [MetricsTimeseriesQuery(data_source=MetricsDataSource.METRICS, name=n, query=q) for n, q in queries]
                ),
                formulas=[QueryFormula(formula=f) for f in formulas],
            ),
        )
    )


def test_timeseries_formula_over_two_queries_by_ir(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    tag_host(sandbox_url, "gpu-1", "ir:ir-1")
    tag_host(sandbox_url, "gpu-2", "ir:ir-2")
    now = int(sandbox.clock.now()) // 60 * 60
    submit(
        client,
        gauge("gpufarm.gpu.memory.used", "gpu-1", [(now - 120, 20.0), (now - 60, 40.0)]),
        gauge("gpufarm.gpu.memory.total", "gpu-1", [(now - 120, 80.0), (now - 60, 80.0)]),
        gauge("gpufarm.gpu.memory.used", "gpu-2", [(now - 120, 8.0)]),
        gauge("gpufarm.gpu.memory.total", "gpu-2", [(now - 120, 80.0)]),
    )
    request = _timeseries_request(
        now,
        [("a", "sum:gpufarm.gpu.memory.used{*} by {ir}"), ("b", "sum:gpufarm.gpu.memory.total{*} by {ir}")],
        ["a / b * 100"],
    )
    answer = MetricsApi(client).query_timeseries_data(request)
    assert isinstance(answer, TimeseriesFormulaQueryResponse) and not answer._unparsed
    attrs = answer.data.attributes
    assert attrs.times.value == [(now - 120) * 1000, (now - 60) * 1000]
    rows = {tuple(s.group_tags.value): attrs.values.value[i].value for i, s in enumerate(attrs.series.value)}
    assert rows == {("ir:ir-1",): [25.0, 50.0], ("ir:ir-2",): [10.0, None]}
    assert {s.query_index for s in attrs.series.value} == {0}


def test_scalar_aggregators_and_limits(client: ApiClient, sandbox: Sandbox, sandbox_url: str) -> None:
    for i in range(1, 4):
        tag_host(sandbox_url, f"gpu-{i}", f"ir:ir-{i}")
    now = int(sandbox.clock.now())
    submit(client, *(gauge(UTIL, f"gpu-{i}", [(now - 120, 10.0 * i), (now - 60, 20.0 * i)]) for i in range(1, 4)))

    def scalar(aggregator: MetricsAggregator, limit: FormulaLimit | None = None) -> dict[str, float]:
        formula = QueryFormula(formula="a", limit=limit) if limit else QueryFormula(formula="a")
        request = ScalarFormulaQueryRequest(
            data=ScalarFormulaRequest(
                type=ScalarFormulaRequestType.SCALAR_REQUEST,
                attributes=ScalarFormulaRequestAttributes(
                    _from=(now - 3600) * 1000,
                    to=now * 1000,
                    queries=ScalarFormulaRequestQueries(
                        [
                            MetricsScalarQuery(
                                data_source=MetricsDataSource.METRICS,
                                name="a",
                                query=f"avg:{UTIL}{{*}} by {{ir}}",
                                aggregator=aggregator,
                            )
                        ]
                    ),
                    formulas=[formula],
                ),
            )
        )
        answer = MetricsApi(client).query_scalar_data(request)
        assert isinstance(answer, ScalarFormulaQueryResponse) and not answer._unparsed
        group, values = answer.data.attributes.columns
        assert (group.name, str(group.type), values.name, str(values.type)) == ("ir", "group", "a", "number")
        return {g[0]: v for g, v in zip(group.values, values.values, strict=True)}

    assert scalar(MetricsAggregator.AVG) == {"ir-1": 15.0, "ir-2": 30.0, "ir-3": 45.0}
    assert scalar(MetricsAggregator.MAX) == {"ir-1": 20.0, "ir-2": 40.0, "ir-3": 60.0}
    assert scalar(MetricsAggregator.LAST) == {"ir-1": 20.0, "ir-2": 40.0, "ir-3": 60.0}
    assert scalar(MetricsAggregator.SUM, FormulaLimit(count=2, order=QuerySortOrder.ASC)) == {
        "ir-1": 30.0,
        "ir-2": 60.0,
    }
    assert list(scalar(MetricsAggregator.MIN, FormulaLimit(count=1, order=QuerySortOrder.DESC))) == ["ir-3"]


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda a: a["queries"][0].update(query="avg:m{"), "Error parsing query"),
        (lambda a: a["queries"][0].update(data_source="logs"), "not supported by the sandbox"),
        (lambda a: a.update(formulas=[{"formula": "a / zz"}]), "unknown query name 'zz'"),
        (lambda a: a.update(formulas=[{"formula": "abs(a)"}]), "not supported"),
        (lambda a: a.update(queries=[]), "queries"),
        (lambda a: a.pop("to"), "from and to"),
        (lambda a: a.update(to=a["from"]), "from"),
        (lambda a: a["queries"][0].update(aggregator="percentile"), "distribution"),
        (lambda a: a["queries"][0].update(aggregator="median"), "aggregator"),
        (lambda a: a["formulas"][0].update(limit={"count": 0}), "limit"),
    ],
)
def test_scalar_request_errors(sandbox: Sandbox, sandbox_url: str, mutate: Any, fragment: str) -> None:
    now_ms = sandbox.clock.now_ms()
    attrs = {
        "from": now_ms - 3_600_000,
        "to": now_ms,
        "queries": [{"data_source": "metrics", "name": "a", "query": "avg:m{*}", "aggregator": "avg"}],
        "formulas": [{"formula": "a"}],
    }
    mutate(attrs)
    status, answer = http(
        f"{sandbox_url}/api/v2/query/scalar", "POST", {"data": {"type": "scalar_request", "attributes": attrs}}
    )
    assert status == 400 and fragment in answer["errors"][0], answer


def test_query_errors_reach_the_client_as_400(client: ApiClient, sandbox: Sandbox) -> None:
    now = int(sandbox.clock.now())
    with pytest.raises(ApiException) as info:
        MetricsApi(client).query_timeseries_data(_timeseries_request(now, [("a", "avg:m{env:prod")], ["a"]))
    assert info.value.status == 400 and "Error parsing query" in info.value.body["errors"][0]
