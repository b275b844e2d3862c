"""Environments whose nodes run the Datadog Agent's GPU check (`metrics_source: datadog-agent`): the farm YAML says
so per environment (validated, default gpufarm-node); their idle monitors query only the `gpu.*` series the Agent
sends, grouped by the host's `ir` tag and the host (and `gpu_uuid` on shared pools); the idle webhook reads those
scopes; and the sandbox evaluates them from Agent-shaped series so only the idle host alerts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from gpufarm.core.chat.links import Links
from gpufarm.core.config.farm import FarmConfigError, IdleKind, MetricsSource, parse_farm
from gpufarm.core.kernel.hosts import MANAGED_TAG
from gpufarm.handlers.idle_alert import IdleAlert
from gpufarm.setup import monitors as mon
from gpufarm.setup.webhooks import IDLE_HANDLE
from gpufarm_sandbox import agentcheck
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.monitor_messages import render_template
from gpufarm_sandbox.emulator.monitor_validation import parse_monitor_query

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "config" / "farm.example.yaml").read_text()
# The example farm with its AWS pool and its sliced pool on the Datadog Agent; the HPC pool keeps gpufarm-node.
AGENT = EXAMPLE.replace("metrics_source: gpufarm-node", "metrics_source: datadog-agent").replace(
    "    kind: shared\n", "    kind: shared\n    metrics_source: datadog-agent\n"
)
_QUERY = re.compile(r"^(?P<time>[a-z]+)\(last_(?P<window>\d+[mhd])\):(?P<space>[a-z]+):(?P<metric>[a-z_.]+)"
                    r"\{(?P<scope>[^}]*)\} by \{(?P<by>[^}]*)\} (?P<op>[<>=]+) (?P<threshold>[0-9.]+)$")  # fmt: skip
_KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY, "Content-Type": "application/json"}


def _agent_monitors() -> list[mon.IdleMonitor]:
    return [m for m in mon.desired_monitors(parse_farm(AGENT)) if "gpu.sm_active" in m.body["query"]]


def test_the_source_is_per_environment_defaults_to_the_node_agent_and_rejects_anything_else() -> None:
    farm = parse_farm(AGENT)
    sources = {name: env.metrics_source for name, env in farm.environments.items()}
    assert sources == {
        "cloud-aws": MetricsSource.DATADOG_AGENT,
        "onprem-hpc": MetricsSource.GPUFARM_NODE,
        "shared-slices": MetricsSource.DATADOG_AGENT,
    }
    with pytest.raises(FarmConfigError, match=r"environments\.cloud-aws\.metrics_source"):
        parse_farm(EXAMPLE.replace("metrics_source: gpufarm-node", "metrics_source: dcgm"))


def test_agent_pools_get_activity_monitors_grouped_by_the_host_ir_tag_and_node_pools_keep_theirs() -> None:
    monitors = mon.desired_monitors(parse_farm(AGENT))
    agent = [m for m in monitors if "gpu.sm_active" in m.body["query"]]
    node = [m for m in monitors if m not in agent]
    # On the Agent, "no activity" is idle and idle_held at once: no idle_held monitor while idle is enabled.
    assert sorted(m.kind.value for m in agent) == ["idle", "idle", "low_utilization", "low_utilization"]
    by = {m.body["query"].split(" by ")[1].split("}")[0] + "}" for m in agent}
    assert by == {"{ir,host}", "{ir,host,gpu_uuid}"}
    for monitor in agent:
        query = monitor.body["query"]
        assert "gpufarm." not in query and "gpu_ir" not in query
        assert f"{MANAGED_TAG} AND ir:ir-* AND environment:" in query
        assert "{{ir.name}}" in monitor.body["message"] and "gpu_ir" not in monitor.body["message"]
    shared_low = next(m for m in agent if m.kind is IdleKind.LOW_UTILIZATION and "gpu_uuid" in m.body["query"])
    assert shared_low.body["query"].startswith("avg(last_2h):avg:gpu.sm_active{")
    assert shared_low.body["query"].endswith("< 10")  # the sliced pool's override
    # The node agent's monitors now judge only the pool that runs it.
    assert {m.kind for m in node} == set(IdleKind)
    assert all("environment:onprem-hpc" in m.body["query"] for m in node)
    assert len({m.key for m in monitors}) == len(monitors)


def test_every_agent_monitor_queries_only_what_the_agent_check_sends() -> None:
    for monitor in _agent_monitors():
        m = _QUERY.match(monitor.body["query"])
        assert m, monitor.body["query"]
        metric = agentcheck.METRICS[m.group("metric")]
        keys = m.group("by").split(",") + re.findall(r"([a-z_]+)(?::| (?:NOT )?IN \()", m.group("scope"))
        for key in keys:
            # The lease, the environment, team and gpufarm:managed are host tags Datadog stamps on every point.
            assert key in metric.tags or key in mon.HOST_TAG_KEYS | {"ir"}, (key, monitor.body["query"])
        model = mon.validated(monitor.body)
        assert model.query == monitor.body["query"]
        assert parse_monitor_query(monitor.body["query"]).threshold == monitor.body["options"]["thresholds"]["critical"]


def test_idle_held_gets_the_activity_monitor_when_idle_is_disabled() -> None:
    farm = AGENT.replace("    idle: {window_minutes: 60}\n", "    idle: {enabled: false}\n")
    kinds = sorted(m.kind.value for m in mon.desired_monitors(parse_farm(farm)) if "gpu.sm_active" in m.body["query"])
    assert kinds == ["idle_held", "idle_held", "low_utilization", "low_utilization"]


@pytest.mark.parametrize("per_device", [False, True])
def test_the_idle_webhook_reads_an_agent_monitors_scope(per_device: bool) -> None:
    monitor = next(m for m in _agent_monitors() if ("gpu_uuid" in m.body["query"]) is per_device)
    uuid = agentcheck.device_uuid("k8s-a100-01", 3)
    variables = {"ir.name": "ir-12", "host.name": "gpu-a-01", "gpu_uuid.name": uuid, "value": "0.25"}
    alert = render_template(monitor.body["message"], {"is_alert": True}, variables)
    assert IDLE_HANDLE in alert and "ir-12" in alert
    scope_text = "host:gpu-a-01,ir:ir-12" + (f",gpu_uuid:{uuid}" if per_device else "")
    body = {"alert_transition": "Triggered", "alert_scope": scope_text, "tags": ",".join(monitor.body["tags"])}
    parsed = IdleAlert.model_validate({**body, "message": alert})
    scope = parsed.idle_scope()
    assert parsed.ir() == 12
    assert scope.hosts == ("gpu-a-01",) and scope.devices == ((uuid,) if per_device else ())
    assert (scope.kind, scope.value, scope.window_minutes) == ("idle", 0.25, 60)


def test_the_sandbox_alerts_only_the_idle_leased_host_from_agent_series() -> None:
    sb = Sandbox()
    fired: list[dict[str, str]] = []
    sb.webhooks.fire = lambda name, variables, *, origin: fired.append(dict(variables))  # type: ignore[method-assign]
    client = Client(sb)

    def post(path: str, body: Any) -> int:
        return client.open(path, method="POST", data=json.dumps(body).encode(), headers=_KEYS).status_code

    for monitor in _agent_monitors():
        assert post("/api/v1/monitor", dict(monitor.body)) == 200
    leased = [MANAGED_TAG, "environment:cloud-aws", "team:nlp", "ir:ir-7"]
    assert post("/api/v1/tags/hosts/aws-idle", {"tags": leased}) == 201
    assert post("/api/v1/tags/hosts/aws-busy", {"tags": leased}) == 201
    assert post("/api/v1/tags/hosts/aws-free", {"tags": [MANAGED_TAG, "environment:cloud-aws"]}) == 201
    checks = {h: agentcheck.AgentGpuCheck(h, "H100") for h in ("aws-idle", "aws-busy", "aws-free")}
    for minute in range(70):
        now = int(sb.clock.now())
        series = checks["aws-idle"].series(agentcheck.Activity.held() if minute < 30 else agentcheck.IDLE, [now])
        series += checks["aws-busy"].series({0: agentcheck.Activity.busy()}, [now])  # one busy GPU of eight
        series += checks["aws-free"].series(agentcheck.IDLE, [now])
        assert post("/api/v2/series", {"series": series}) == 202
        sb.clock.advance(60)
    triggered = {(v["ALERT_SCOPE"], v["ALERT_TRANSITION"]) for v in fired}
    # Held-but-inactive is no activity too; the free host has no lease, so no group; one busy GPU keeps its host.
    assert triggered == {("ir:ir-7,host:aws-idle", "Triggered")}


def test_the_warnings_metrics_link_shows_the_series_of_the_pools_source() -> None:
    farm = parse_farm(AGENT)
    links = Links("https://app.example")
    agent = links.for_environment(farm, "cloud-aws").dashboard(12)
    assert "exp_metric=gpu.sm_active" in agent and "exp_scope=ir:ir-12" in agent and "exp_group=host" in agent
    node = links.for_environment(farm, "onprem-hpc").dashboard(12)
    assert "exp_metric=gpufarm.gpu.utilization" in node and "exp_scope=gpu_ir:ir-12" in node
    assert links.for_environment(farm, None).dashboard(12) == links.dashboard(12) == node
    assert links.for_environment(farm, "cloud-aws").incident(12) == "https://app.example/incidents/12"
