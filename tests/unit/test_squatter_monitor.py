"""gpufarm's squatter monitor: made by apply over the gpufarm-node environments, valid, and alerting on the device a
squatter runs on (the real agent on a fake host, its series evaluated by the sandbox) and recovering after it left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from fakes import FARM_YAML
from werkzeug.test import Client

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.hosts import MANAGED_TAG
from gpufarm.setup import monitors as mon
from gpufarm.setup.squatter_monitor import RENOTIFY_MINUTES, farm_monitors, squatter_monitors
from gpufarm.setup.webhooks import IDLE_HANDLE
from gpufarm_node.fakenode import fake_node
from gpufarm_node.hosttags import HostTagWatch
from gpufarm_node.sender import DatadogSender, series_json
from gpufarm_node.topology import topology_from_dict
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.monitor_validation import parse_monitor_query

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "config" / "farm.example.yaml").read_text()
_KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY, "Content-Type": "application/json"}
HOST = "gpu-sq-01"


def test_one_monitor_over_the_node_agent_environments_grouped_per_device_and_lease() -> None:
    farm = parse_farm(EXAMPLE)
    (monitor,) = squatter_monitors(farm)
    envs = sorted(name for name, env in farm.environments.items() if env.metrics_source.value == "gpufarm-node")
    scope = f"environment:{envs[0]}" if len(envs) == 1 else f"environment IN ({', '.join(envs)})"
    assert monitor.body["query"] == (
        f"max(last_5m):max:gpufarm.gpu.squatters{{{MANAGED_TAG} AND {scope}}} by {{host,gpu_uuid,gpu_ir}} >= 1"
    )
    assert mon.is_managed(monitor.body) and mon.monitor_key(monitor.body) == "squatter" and monitor.kind is None
    mon.validated(monitor.body)  # datadog-api-client reads all of it
    parse_monitor_query(monitor.body["query"])
    # Made with the idle monitors, after them; a farm whose pools all run the Datadog Agent gets none.
    assert farm_monitors(farm)[-1] == monitor and farm_monitors(farm)[:-1] == mon.desired_monitors(farm)
    doc = yaml.safe_load(EXAMPLE)
    for env in doc["environments"].values():
        env["metrics_source"] = "datadog-agent"
    assert squatter_monitors(parse_farm(yaml.safe_dump(doc))) == []


class _Tags:
    def __init__(self, tags: list[str]) -> None:
        self.body = json.dumps({"tags": tags}).encode()

    def get(self) -> tuple[int, bytes, dict[str, str]]:
        return 200, self.body, {}


class _Drop:
    encoding = "gzip"

    def post(self, compressed: bytes) -> None:
        return None


def test_the_sandbox_alerts_the_squatted_device_of_the_lease_and_recovers_after_it_left(tmp_path: Path) -> None:
    sb = Sandbox()
    client = Client(sb)

    def call(method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        answer = client.open(path, method=method, data=data, headers=_KEYS)
        assert answer.status_code < 300, answer.get_data(as_text=True)
        return answer.get_json()

    (monitor,) = squatter_monitors(parse_farm(EXAMPLE))
    monitor_id = call("POST", "/api/v1/monitor", dict(monitor.body))["id"]
    host_tags = [MANAGED_TAG, "environment:onprem-hpc", "ir:ir-5"]
    call("POST", f"/api/v1/tags/hosts/{HOST}", {"tags": host_tags})
    clock = sb.clock.now
    doc = {
        "name": "squat",
        "gpus": [{"model": "H100", "count": 2}],
        "processes": [
            {"pid": 5001, "gpu": 0, "env": {"GPUFARM_IR": "IR-5"}, "workload": "busy"},
            # Claims another lease on GPU 1 of IR-5's host from minute 7.5 (between two cycles) to minute 12.
            {"pid": 5002, "gpu": 1, "env": {"GPUFARM_IR": "IR-9"}, "workload": "busy", "start": 450.0, "end": 720.0},
        ],
    }
    node = fake_node(
        topology_from_dict(doc, seed="sq"),
        tmp_path,
        DatadogSender(_Drop(), HOST, clock=clock),
        hostname=HOST,
        environment="onprem-hpc",
        cluster="hpc-a",
        clock=clock,
        host_tags=HostTagWatch(_Tags(host_tags), HOST, clock=clock),
    )
    squatted = node.fake.topology.gpus[1].uuid.lower()
    statuses: list[tuple[int, dict[str, str]]] = []
    node.agent.start()
    try:
        for minute in range(24):
            node.agent.cycle()
            now = int(clock())
            series = [series_json(row, now, HOST, 15) for row in node.agent.last_rows if "squatter" in row[0]]
            call("POST", "/api/v2/series", {"series": series})
            sb.clock.advance(60)
            groups = call("GET", f"/api/v1/monitor/{monitor_id}?group_states=all")["state"]["groups"]
            statuses.append((minute, {name: g["status"] for name, g in groups.items()}))
    finally:
        node.agent.close()
    group = f"host:{HOST},gpu_uuid:{squatted},gpu_ir:ir-5"
    alerting = [minute for minute, groups in statuses if groups.get(group) == "Alert"]
    # The device's group exists from the agent's first cycles (its count is written while clean): the squatter's
    # first cycle after it started (minute 8) alerts at the next evaluation, and the group recovers five minutes
    # after its last point (minute 11).
    assert statuses[7][1][group] == "OK"
    assert alerting == list(range(8, 15)), alerting
    assert all(status != "Alert" for _, groups in statuses for name, status in groups.items() if name != group)
    assert statuses[-1][1][group] == "OK"


def test_the_squatter_monitor_calls_the_idle_webhook_and_re_notifies_only_where_a_pool_stops_squatters() -> None:
    (report,) = squatter_monitors(parse_farm(FARM_YAML))
    assert report.body["message"].count(IDLE_HANDLE) == 2  # its alert and its recovery
    assert "renotify_interval" not in report.body["options"]
    stopping = FARM_YAML.replace("gpu_models: [H100]}", "gpu_models: [H100], squatters: stop-after}", 1)
    (stops,) = squatter_monitors(parse_farm(stopping))
    assert stops.body["options"]["renotify_interval"] == RENOTIFY_MINUTES
    assert stops.body["options"]["renotify_statuses"] == ["alert"]
