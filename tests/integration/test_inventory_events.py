"""Skipped inventory sources as Datadog events through the real adapter, against the sandbox's event stream
(`POST /api/v1/events`): one per failing source, grouped by source, with no error text; bad bodies refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.inventory.source_events import post_source_events
from gpufarm.core.inventory.sources import merge
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.ports import Event, SourceError, SourceReading
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
def gateway(dd_env: str) -> Iterator[DatadogGateway]:
    gw = DatadogGateway(Settings(max_retries=1, http_timeout=5))
    yield gw
    gw.close()


def _call(url: str, body: Any | None = None, *, app_key: bool = True) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "DD-API-KEY": DEFAULT_DD_API_KEY}
    if app_key:
        headers["DD-APPLICATION-KEY"] = DEFAULT_DD_APP_KEY
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_each_failing_source_is_one_event_in_the_stream_grouped_by_source(
    sandbox: Sandbox, sandbox_url: str, gateway: DatadogGateway
) -> None:
    now = int(sandbox.clock.now())
    readings = [
        SourceReading(
            "aws", errors=(SourceError("aws", "us-east-1", "d: RequestLimitExceeded: wait", throttled=True),)
        ),
        SourceReading("azure", errors=(SourceError("azure", "s/eastus", "u: HttpResponseError 403: no"),)),
        SourceReading("static"),
    ]
    ledger = merge([], readings, now=float(now), down_after_minutes=None)
    assert post_source_events(gateway, ledger, now) == 2
    assert post_source_events(gateway, ledger, now) == 2  # the next sync: the same two groups
    status, body = _call(f"{sandbox_url}/api/v1/events?start={now - 60}&end={now + 60}&tags=gpufarm:inventory")
    assert status == 200
    events = body["events"]
    assert len(events) == 4
    assert sorted({e["aggregation_key"] for e in events}) == [
        "gpufarm-inventory-source-aws",
        "gpufarm-inventory-source-azure",
    ]
    aws = next(e for e in events if e["aggregation_key"].endswith("aws"))
    assert aws["title"] == "gpufarm inventory source aws skipped: RequestLimitExceeded"
    assert aws["alert_type"] == "warning" and aws["source_type_name"] == "gpufarm" and aws["date_happened"] == now
    assert "source:aws" in aws["tags"] and "error_class:requestlimitexceeded" in aws["tags"]
    assert "wait" not in aws["text"]
    status, one = _call(f"{sandbox_url}/api/v1/events/{aws['id']}")
    assert status == 200 and one["event"]["title"] == aws["title"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"text": "no title"}, "title"),
        ({"title": "t", "text": "x" * 4001}, "text"),
        ({"title": "t", "text": "x", "aggregation_key": "k" * 101}, "aggregation_key"),
        ({"title": "t", "text": "x", "alert_type": "panic"}, "alert_type"),
        ({"title": "t", "text": "x", "date_happened": 1}, "date_happened"),
        ({"title": "t", "text": "x", "tags": "source:aws"}, "tags"),
    ],
)
def test_the_stream_refuses_what_datadog_refuses(sandbox_url: str, body: dict[str, Any], error: str) -> None:
    status, answer = _call(f"{sandbox_url}/api/v1/events", body, app_key=False)
    assert status == 400 and error in json.dumps(answer)


def test_posting_needs_the_api_key_only_and_reading_needs_a_start_and_end(sandbox_url: str) -> None:
    status, answer = _call(f"{sandbox_url}/api/v1/events", {"title": "t", "text": "x"}, app_key=False)
    assert status == 202 and answer["status"] == "ok" and answer["event"]["id"] >= 1
    status, _ = _call(f"{sandbox_url}/api/v1/events")
    assert status == 400


def test_a_refused_event_is_a_gpufarm_error(gateway: DatadogGateway) -> None:
    with pytest.raises(GpufarmError):
        gateway.post_event(Event(title="t", text="x", alert_type="panic"))
