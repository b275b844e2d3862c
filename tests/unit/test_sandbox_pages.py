"""The sandbox's pages for gpufarm's links (gpufarm_sandbox.emulator.pages): the metrics explorer draws the link's
query from stored series, the incident pages answer 404 for what does not exist, and bad query strings are refused
with a 400 that names the input, never run; everything shown is escaped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from werkzeug.test import Client

from gpufarm.core.chat.links import Links
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.pages import PageError, explorer_inputs

_KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY, "Content-Type": "application/json"}


def _series(sb: Sandbox, host: str, ir: str, value: float) -> dict[str, Any]:
    now = int(sb.clock.now())
    points = [{"timestamp": now - 60 * i, "value": value} for i in range(30)]
    return {
        "metric": "gpufarm.gpu.utilization",
        "type": 3,
        "points": points,
        "tags": [f"gpu_ir:{ir}", "gpu_uuid:gpu-00000000-0000-4000-8000-000000000000"],
        "resources": [{"type": "host", "name": host}],
    }


def test_the_lease_metrics_link_opens_a_chart_of_its_hosts_only() -> None:
    sb = Sandbox()
    client = Client(sb)
    series = [_series(sb, "gpu-a", "ir-7", 80.0), _series(sb, "gpu-b", "ir-7", 5.0), _series(sb, "gpu-c", "ir-8", 1.0)]
    answer = client.post("/api/v2/series", data=json.dumps({"series": series}), headers=_KEYS)
    assert answer.status_code == 202
    link = Links("http://sandbox.local").dashboard(7)
    page = client.get(link.removeprefix("http://sandbox.local"))
    assert page.status_code == 200 and page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert "<svg" in text and text.count("<polyline") == 2
    assert "host:gpu-a" in text and "host:gpu-b" in text and "gpu-c" not in text
    assert "<script" not in text


def test_no_data_and_unknown_incidents_are_said_plainly() -> None:
    client = Client(Sandbox())
    empty = client.get("/metric/explorer?exp_metric=gpu.sm_active&exp_scope=ir:ir-1&exp_group=host")
    assert empty.status_code == 200 and "No data" in empty.get_data(as_text=True)
    assert client.get("/incidents/99").status_code == 404
    assert client.get("/incidents/IR-1").status_code == 404
    listing = client.get("/incidents")
    assert listing.status_code == 200 and "No incidents" in listing.get_data(as_text=True)


@pytest.mark.parametrize(
    ("query", "word"),
    [
        ("exp_metric=", "exp_metric"),
        ("exp_metric=a%20b", "exp_metric"),
        ("exp_metric=m&exp_scope=" + "x" * 501, "exp_scope"),
        ("exp_metric=m&exp_scope=a}b", "exp_scope"),
        ("exp_metric=m&exp_group=a,b,c,d,e", "exp_group"),
        ("exp_metric=m&exp_group=%3Cb%3E", "exp_group"),
        ("exp_metric=m&hours=0", "hours"),
        ("exp_metric=m&hours=%C2%B2", "hours"),
        ("exp_metric=m&exp_scope=(((", "Error parsing query"),
    ],
)
def test_bad_explorer_input_is_refused_with_what_was_wrong(query: str, word: str) -> None:
    page = Client(Sandbox()).get(f"/metric/explorer?{query}")
    text = page.get_data(as_text=True)
    assert page.status_code == 400 and word in text
    assert "<b>" not in text.split("<body>")[1].split("</h1>")[1]  # nothing the caller sent is rendered as HTML


def test_explorer_inputs_defaults() -> None:
    assert explorer_inputs({"exp_metric": "gpu.sm_active"}) == ("gpu.sm_active", "*", [], 4)
    with pytest.raises(PageError):
        explorer_inputs({"exp_metric": "m", "exp_scope": "tab\there"})
