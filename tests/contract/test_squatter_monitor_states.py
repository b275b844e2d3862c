"""The idle webhook's question "is the lease still idle anywhere?" leaves the squatter monitor's groups out: they name
the lease a squatter hurts, which may be busy (through the runtime's gateway against the sandbox)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from werkzeug.test import Client

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.hosts import MANAGED_TAG, SQUATTER_MONITOR_TAG
from gpufarm.setup.squatter_monitor import squatter_monitors
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

_KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY, "Content-Type": "application/json"}
UUID = "gpu-00000000-0000-4000-8000-000000000001"
FARM_YAML = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text()


def test_alerting_groups_can_leave_the_squatter_monitor_out(sandbox: Sandbox, dd_env: str) -> None:
    client = Client(sandbox)

    def post(path: str, body: Any) -> Any:
        answer = client.open(path, method="POST", data=json.dumps(body).encode(), headers=_KEYS)
        assert answer.status_code < 300, answer.get_data(as_text=True)
        return answer.get_json()

    (squatter,) = squatter_monitors(parse_farm(FARM_YAML))
    post("/api/v1/monitor", dict(squatter.body))
    # Another of gpufarm's monitors over the same groups (as an idle monitor of the lease would be).
    other = {**squatter.body, "name": "[gpufarm] other", "tags": [MANAGED_TAG, "gpufarm_monitor:other"]}
    other_id = post("/api/v1/monitor", other)["id"]
    post("/api/v1/tags/hosts/gpu-a-01", {"tags": [MANAGED_TAG, "environment:onprem-hpc"]})
    tags = ["environment:onprem-hpc", f"gpu_uuid:{UUID}", "gpu_ir:ir-7"]
    # The agent writes every device's count each cycle, 0 while clean: the group exists before a squatter comes
    # (past Datadog's delay for new groups keyed by host), which then alerts at the next evaluation.
    for minute in range(8):
        now = int(sandbox.clock.now())
        point = {"timestamp": now, "value": 1.0 if minute >= 6 else 0.0}
        series = {"metric": "gpufarm.gpu.squatters", "type": 3, "points": [point], "tags": tags}
        post("/api/v2/series", {"series": [{**series, "resources": [{"name": "gpu-a-01", "type": "host"}]}]})
        sandbox.clock.advance(60)
    gateway = DatadogGateway(Settings(max_retries=1))
    try:
        every = gateway.alerting_groups(MANAGED_TAG)
        idle_only = gateway.alerting_groups(MANAGED_TAG, excluding=SQUATTER_MONITOR_TAG)
    finally:
        gateway.close()
    assert len(every) == 2
    assert [(mid, sorted(tags)) for mid, tags in idle_only] == [
        (other_id, sorted([f"gpu_uuid:{UUID}", "gpu_ir:ir-7", "host:gpu-a-01"]))
    ]
