"""Metric series sent as plain JSON: the body on the wire is the recorded real request's shape and exactly what the
client's models would have sent, through the client's own auth and compression.

`DatadogGateway.submit` checks each series itself and hands the JSON to a client configured not to rebuild it as
models (`datadog_client.api_client(check_input=False)`); these tests hold it to what the typed path sends.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from datadog_api_client import Configuration
from datadog_api_client.model_utils import OpenApiModel, data_to_dict, validate_and_convert_types
from datadog_api_client.v2.model.metric_payload import MetricPayload
from helpers import http
from recorded import interactions

from gpufarm.adapters import datadog as dd
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.ports import MetricPoint, MetricSeries

pytestmark = pytest.mark.contract

ACCEPTED = 'Submit metrics returns "Payload accepted" response'


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    gw = DatadogGateway(settings)
    yield gw
    gw.close()


def _typed(body: dict[str, Any]) -> Any:
    """What the client's models make of a body and send: the typed path's JSON."""
    model = validate_and_convert_types(body, (MetricPayload,), ["body"], True, True, configuration=Configuration())
    return data_to_dict(model)


def _series(now: int) -> list[MetricSeries]:
    return [
        MetricSeries("gpufarm.quota.used", (MetricPoint(now, 8.0),), tags=("team:nlp", "environment:hpc"), type=3),
        MetricSeries(
            "gpufarm.gpu.utilization",
            (MetricPoint(now - 60, 12.5), MetricPoint(now, 99.0)),
            host="gpu-node-01",
            unit="percent",
            interval=60,
        ),
    ]


def test_the_recorded_request_is_what_the_gateway_makes_of_the_same_series() -> None:
    (interaction,) = interactions("v2-metrics.json", ACCEPTED)
    recorded = interaction["request"]["body"]["value"]
    (item,) = recorded["series"]
    points = tuple(MetricPoint(p["timestamp"], p["value"]) for p in item["points"])
    ours = dd._series_json(MetricSeries(item["metric"], points, type=item["type"], host="dummyhost"))
    assert {"series": [ours]} == recorded == _typed(recorded)


def test_the_wire_body_is_the_typed_paths_json_with_the_clients_auth_and_gzip(
    gateway: DatadogGateway, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, dict[str, str], bytes]] = []
    pool = gateway._plain_client.rest_client.pool_manager
    real = pool.request

    def recording(method: str, url: str, **kwargs: Any) -> Any:
        sent.append((url, dict(kwargs.get("headers") or {}), kwargs.get("body") or b""))
        return real(method, url, **kwargs)

    monkeypatch.setattr(pool, "request", recording)
    series = _series(int(time.time()))
    gateway.submit(series)
    ((url, headers, body),) = sent
    assert url.endswith("/api/v2/series")
    assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == "application/json"
    assert settings.datadog_api_key is not None
    assert headers["DD-API-KEY"] == settings.datadog_api_key.get_secret_value()
    wire = json.loads(gzip.decompress(body))
    assert wire == {"series": [dd._series_json(s) for s in series]} == _typed(wire)
    assert wire["series"][1]["resources"] == [{"name": "gpu-node-01", "type": "host"}]


def test_no_model_of_the_client_is_built_on_the_way(gateway: DatadogGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real_new = OpenApiModel.__new__

    def counting(cls: type, *args: Any, **kwargs: Any) -> Any:
        built.append(cls.__name__)
        return real_new(cls, *args, **kwargs)

    monkeypatch.setattr(OpenApiModel, "__new__", counting)
    now = int(time.time())
    gateway.submit(
        [MetricSeries("gpufarm.quota.used", (MetricPoint(now, float(k)),), (f"team:t{k}",)) for k in range(50)]
    )
    assert built == []


def test_the_clients_retries_still_carry_a_submission_and_then_give_up(
    gateway: DatadogGateway, sandbox_url: str
) -> None:
    def faults(**spec: Any) -> int:
        status, answer = http(f"{sandbox_url}/_sandbox/faults", "POST" if spec else "GET", spec or None)
        assert status == 200
        return int(answer.get("injected", 0)) if isinstance(answer, dict) else 0

    now = int(time.time())
    faults(rate=1.0, statuses=[503], paths="^/api/v2/series$", max_faults=1)
    gateway.submit(_series(now))  # one 503, retried by the client (settings.max_retries = 1)
    assert faults() == 1
    faults(rate=1.0, statuses=[500], paths="^/api/v2/series$")
    with pytest.raises(UpstreamError, match="submit metrics"):
        gateway.submit(_series(now))
    assert faults() == 2  # one try + one retry
