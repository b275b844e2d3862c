"""The local view of the dashboards (sandbox `/dashboards/<id>`): pages built from the stored dashboard JSON and the
sandbox's own metrics, template variables from the query string, units from the metric metadata, plotly.js served
from the plotly package, and bad parameters answered with a 400 that says why."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import FARM_YAML
from werkzeug.test import Client

from gpufarm.core.config.farm import parse_farm
from gpufarm.setup.dashboards import desired_dashboards
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.dashboard_evaluate import substitute
from gpufarm_sandbox.emulator.dashboard_pages import PLOTLY_PATH

KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
UUID = "gpu-00000000-0000-0000-0000-00000000000{}"


@pytest.fixture(scope="module")
def bodies() -> dict[str, dict[str, Any]]:
    return {d.key: d.body for d in desired_dashboards(parse_farm(FARM_YAML))}


@pytest.fixture
def sandbox(bodies: dict[str, dict[str, Any]]) -> Iterator[tuple[Client, dict[str, str]]]:
    sb = Sandbox()
    client = Client(sb)
    now = int(sb.clock.now())
    series = []
    for minute in range(30):
        t = now - 60 * (30 - minute)
        for ir, host, gpus, util in (("ir-1", "hpc-1", 8, 90.0), ("ir-2", "hpc-2", 4, 10.0)):
            common = {"points": [{"timestamp": t, "value": gpus}], "resources": [{"type": "host", "name": host}]}
            tags = ["environment:hpc", f"gpu_ir:{ir}", f"ir:{ir}"]
            series.append({"metric": "gpufarm.ir.gpus", "type": 3, **common, "tags": tags})
            series.append(
                {
                    "metric": "gpufarm.ir.utilization",
                    "type": 3,
                    "points": [{"timestamp": t, "value": util}],
                    "resources": common["resources"],
                    "tags": tags,
                }
            )
        series.append(
            {
                "metric": "gpufarm.gpu.memory.used",
                "type": 3,
                "points": [{"timestamp": t, "value": 40 * 1024**3}],
                "resources": [{"type": "host", "name": "hpc-1"}],
                "tags": ["environment:hpc", "gpu_ir:ir-1", f"gpu_uuid:{UUID.format(1)}", "gpu_model:h100"],
            }
        )
        series.append(
            {
                "metric": "gpufarm.inventory.gpus.total",
                "type": 3,
                "points": [{"timestamp": t, "value": 32}],
                "tags": ["environment:hpc", "gpu_model:h100"],
            }
        )
    assert client.post("/api/v2/series", json={"series": series}, headers=KEYS).status_code == 202
    meta = {"type": "gauge", "unit": "byte", "description": "frame buffer memory in use"}
    assert client.put("/api/v1/metrics/gpufarm.gpu.memory.used", json=meta, headers=KEYS).status_code == 200
    meta = {"type": "gauge", "unit": "percent", "description": "mean activity of the IR's devices"}
    assert client.put("/api/v1/metrics/gpufarm.ir.utilization", json=meta, headers=KEYS).status_code == 200
    ids = {}
    for key, body in bodies.items():
        answer = client.post("/api/v1/dashboard", json=body, headers=KEYS)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        ids[key] = answer.json["id"]
    yield client, ids


def _page(client: Client, path: str) -> tuple[int, str]:
    answer = client.get(path)
    return answer.status_code, answer.get_data(as_text=True)


def _figures(text: str) -> dict[str, Any]:
    found = re.search(r'<script id="figures" type="application/json">(.*?)</script>', text, re.S)
    assert found
    figures: dict[str, Any] = json.loads(found.group(1).replace("<\\/", "</"))
    return figures


def _values(text: str) -> list[str]:
    return re.findall(r'<p class="value">([^<]*)</p>', text)


def test_every_dashboard_renders_with_its_widgets(sandbox: tuple[Client, dict[str, str]]) -> None:
    client, ids = sandbox
    status, index = _page(client, "/dashboards")
    assert status == 200 and all(f"/dashboards/{i}" in index for i in ids.values())
    for key, dashboard_id in ids.items():
        status, text = _page(client, f"/dashboards/{dashboard_id}")
        assert status == 200, key
        assert 'class="widget-error"' not in text, key
        assert f'src="{PLOTLY_PATH}"' in text and "[gpufarm-dashboard:" not in text
        assert 'data-type="note"' in text


def test_the_project_page_shows_the_sandbox_metrics_and_follows_template_variables(
    sandbox: tuple[Client, dict[str, str]],
) -> None:
    client, ids = sandbox
    _, everything = _page(client, f"/dashboards/{ids['project']}")
    # GPUs held by both leases, and the utilisation averaged over them.
    assert _values(everything)[0] == "12" and _values(everything)[3] == "50%"
    _, one = _page(client, f"/dashboards/{ids['project']}?ir=ir-2&span=4h")
    assert _values(one)[0] == "4" and _values(one)[3] == "10%"
    lines = next(f for f in _figures(one).values() if any("utilisation" in t["name"] for t in f["data"]))
    assert [t["name"] for t in lines["data"]] == ["utilisation % gpu_ir:ir-2"]
    assert len(lines["data"][0]["y"]) == 30 and set(lines["data"][0]["y"]) == {10.0}
    assert '<option value="4h" selected>' in one and 'value="ir-2"' in one


def test_a_dashboard_answers_at_its_key_and_to_datadogs_template_variable_names(
    sandbox: tuple[Client, dict[str, str]],
) -> None:
    client, ids = sandbox
    status, by_key = _page(client, "/dashboards/project?tpl_var_ir=ir-2")
    assert status == 200 and _values(by_key)[0] == "4"
    _, by_id = _page(client, f"/dashboards/{ids['project']}?ir=ir-2")
    assert _values(by_id) == _values(by_key)


def test_units_come_from_the_metric_metadata(sandbox: tuple[Client, dict[str, str]]) -> None:
    client, ids = sandbox
    _, text = _page(client, f"/dashboards/{ids['node']}")
    # gpufarm.gpu.memory.used is in bytes: the device table shows GiB.
    assert "40 GiB" in text
    _, overview = _page(client, f"/dashboards/{ids['farm-overview']}?environment=hpc")
    assert "32" in _values(overview)


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("?bogus=1", "unknown parameter 'bogus'"),
        ("?span=3y", "span must be one of"),
        ("?ir=ir-1%7Bx%7D", "is not a tag value"),
        ("?ir=ir-1&ir=ir-2", "given more than once"),
        ("?ir=ir-1&tpl_var_ir=ir-2", "given more than once"),
    ],
)
def test_bad_parameters_get_a_400_saying_why(sandbox: tuple[Client, dict[str, str]], query: str, why: str) -> None:
    client, ids = sandbox
    status, text = _page(client, f"/dashboards/{ids['project']}{query}")
    assert status == 400 and why in text.replace("&#x27;", "'")


def test_an_unknown_dashboard_is_a_404_and_plotly_is_served_offline(sandbox: tuple[Client, dict[str, str]]) -> None:
    client, _ = sandbox
    assert client.get("/dashboards/nop-e00-000").status_code == 404
    js = client.get(PLOTLY_PATH)
    assert js.status_code == 200 and js.mimetype == "application/javascript"
    assert b"plotly.js" in js.get_data()[:2000] and len(js.get_data()) > 1_000_000


def test_template_variables_are_substituted_inside_the_scope_only() -> None:
    variables = [{"name": "team", "prefix": "team"}, {"name": "ir", "prefix": "gpu_ir"}]
    query = "sum:gpufarm.ir.gpus{$team,$ir,!gpu_ir:none} by {gpu_ir}.rollup(avg, 3600)"
    assert substitute(query, variables, {"ir": "ir-7"}) == (
        "sum:gpufarm.ir.gpus{gpu_ir:ir-7,!gpu_ir:none} by {gpu_ir}.rollup(avg, 3600)"
    )
    assert substitute("avg:m{$team}", variables, {}) == "avg:m{*}"
    assert substitute("avg:m{environment IN (a, b),$team}", variables, {"team": "nlp"}) == (
        "avg:m{environment IN (a, b),team:nlp}"
    )


def test_the_project_page_embeds_each_teams_newest_profiler_run_as_datadog_does() -> None:
    link = "https://pages.example/runs/nlp/run-7?expires=1&sig=abc&x=<b>"
    bodies = desired_dashboards(parse_farm(FARM_YAML), latest_runs={"nlp": link, "bad": "javascript:alert(1)"})
    project = next(d.body for d in bodies if d.key == "project")
    client = Client(Sandbox())
    answer = client.post("/api/v1/dashboard", json=project, headers=KEYS)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    status, text = _page(client, f"/dashboards/{answer.json['id']}")
    assert status == 200
    frames = re.findall(r'<iframe src="([^"]*)"', text)
    # The signed link is embedded escaped; a link that is not http(s) is never embedded.
    assert frames == ["https://pages.example/runs/nlp/run-7?expires=1&amp;sig=abc&amp;x=&lt;b&gt;"]
    assert "javascript:" not in text and "no http(s) URL" in text
    assert "iframe widgets are not drawn locally" not in text
