"""`gpufarm datadog apply` manages the idle monitors against the sandbox: created from the farm's idle policy, a
second run changes nothing, a changed threshold updates in place, `--prune` deletes a dropped one; and the sandbox,
fed node-agent-shaped series, evaluates them per lease and host and calls the idle webhook for the idle host only."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from datadog_api_client import ApiClient
from datadog_api_client.v2.api.metrics_api import MetricsApi
from datadog_api_client.v2.model.metric_intake_type import MetricIntakeType
from datadog_api_client.v2.model.metric_payload import MetricPayload
from datadog_api_client.v2.model.metric_point import MetricPoint
from datadog_api_client.v2.model.metric_resource import MetricResource
from datadog_api_client.v2.model.metric_series import MetricSeries
from helpers import APPLY_ENV, Receiver, farm_file, http

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.cli import cli
from gpufarm.config import SecretStr, Settings
from gpufarm.core.config.farm import IdleKind, parse_farm
from gpufarm.handlers.idle_alert import IdleAlert
from gpufarm.setup import apply as setup
from gpufarm.setup import monitors as mon
from gpufarm.setup import plan as planning
from gpufarm.setup.changes import Action, Change
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

SECRET = "hook-secret-for-monitor-tests-0123"
FARM_YAML = """
gpu_models:
  H100: {}
  L4: {}
environments:
  onprem-hpc: {gpu_models: [H100]}
  shared-slices: {kind: shared, gpu_models: [L4]}
teams:
  nlp: {}
idle:
  grace_minutes: 60
  startup_grace_minutes: 30
  kinds:
    low_utilization: {threshold_percent: 5, window_minutes: 60}
"""
HOSTS = ("gpu-a-01", "gpu-a-02")
IR = 12


@pytest.fixture
def admin(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[DatadogAdmin]:
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    adm = DatadogAdmin(Settings(max_retries=1))
    yield adm
    adm.close()


def _spec(yaml_text: str, url: str = "http://127.0.0.1:9", *, prune: bool = False) -> planning.SetupSpec:
    farm = parse_farm(yaml_text)
    return planning.SetupSpec(
        incident_webhook_url=f"{url}/fn/incident_webhook/",
        idle_webhook_url=f"{url}/fn/idle_alert/",
        valid_values=farm.valid_values(),
        has_secret=True,
        monitors=mon.desired_monitors(farm),
        prune=prune,
    )


def _apply(admin: DatadogAdmin, spec: planning.SetupSpec, *, dry_run: bool = False) -> planning.Plan:
    return setup.apply_setup(admin, spec, secret=SecretStr(SECRET), dry_run=dry_run)


def _monitors(plan: planning.Plan) -> list[Change]:
    return [c for c in plan.changes if c.kind == mon.KIND]


def _ours(admin: DatadogAdmin) -> dict[str, dict[str, Any]]:
    return {str(mon.monitor_key(m)): m for m in admin.list_monitors(monitor_tags="gpufarm:managed")}


def test_apply_creates_the_policy_monitors_and_a_second_run_changes_nothing(
    admin: DatadogAdmin, sandbox: Sandbox
) -> None:
    spec = _spec(FARM_YAML)
    wanted = {m.key: m for m in spec.monitors or ()}
    # One per kind for the dedicated pool (per host) and one per kind for the shared pool (per device).
    assert len(wanted) == 6
    first = _apply(admin, spec)
    assert [c.action for c in _monitors(first)] == [Action.CREATE] * 6
    stored = _ours(admin)
    assert set(stored) == set(wanted)
    for key, monitor in stored.items():
        assert monitor["query"] == wanted[key].body["query"]
        # The start-up grace (30 min) is shorter than the windows (60 min): a fresh lease waits one whole window.
        assert monitor["options"]["new_group_delay"] == 60 * 60
        assert "@webhook-gpufarm-idle" in monitor["message"]
        assert mon.validated(monitor)  # Datadog's answer reads back through the client's models, nothing unparsed
    again = _apply(admin, spec)
    assert again.pending == []
    assert {c.action for c in _monitors(again)} == {Action.UNCHANGED}


def test_a_changed_threshold_updates_in_place_and_prune_deletes_a_dropped_kind(
    admin: DatadogAdmin, sandbox: Sandbox
) -> None:
    _apply(admin, _spec(FARM_YAML))
    before = _ours(admin)
    tuned = FARM_YAML.replace("threshold_percent: 5", "threshold_percent: 8")
    dry = _apply(admin, _spec(tuned), dry_run=True)
    updates = [c for c in _monitors(dry) if c.action is Action.UPDATE]
    assert len(updates) == 2 and all(set(c.differences) == {"query", "options.thresholds"} for c in updates)
    assert _ours(admin) == before  # a dry run changes nothing
    _apply(admin, _spec(tuned))
    after = _ours(admin)
    assert {k: m["id"] for k, m in after.items()} == {k: m["id"] for k, m in before.items()}  # same monitors
    assert all(m["options"]["thresholds"]["critical"] == 8 for k, m in after.items() if k.startswith("low-"))

    dropped = tuned + "    idle_held: {enabled: false}\n"
    kept = _apply(admin, _spec(dropped))
    stale = [c for c in _monitors(kept) if "--prune deletes it" in c.detail]
    assert len(stale) == 2 and len(_ours(admin)) == 6  # reported, not deleted, without --prune
    pruned = _apply(admin, _spec(dropped, prune=True))
    assert [c.action for c in _monitors(pruned)].count(Action.DELETE) == 2
    assert not any(k.startswith("idle-held-") for k in _ours(admin))
    assert _apply(admin, _spec(dropped, prune=True)).pending == []


def test_cli_apply_with_the_farm_config_dry_run_diff_and_prune(
    admin: DatadogAdmin, sandbox: Sandbox, tmp_path: Path
) -> None:
    farm = farm_file(tmp_path, FARM_YAML)
    runner = CliRunner()
    base = ["datadog", "apply", "--farm-config", str(farm)]
    pending = runner.invoke(cli, [*base, "--dry-run", "--json"], env=APPLY_ENV)
    assert pending.exit_code == 3, pending.output
    planned = [c for c in json.loads(pending.stdout)["changes"] if c["kind"] == "monitor"]
    # The six idle monitors and the squatter monitor (gpufarm.setup.squatter_monitor).
    assert len(planned) == 7 and {c["action"] for c in planned} == {"create"}
    assert runner.invoke(cli, base, env=APPLY_ENV).exit_code == 0
    assert len(_ours(admin)) == 7
    clean = runner.invoke(cli, [*base, "--dry-run"], env=APPLY_ENV)
    assert clean.exit_code == 0 and "(0 change(s) pending)" in clean.output
    farm.write_text(FARM_YAML + "    idle: {enabled: false}\n")
    assert runner.invoke(cli, [*base, "--prune"], env=APPLY_ENV).exit_code == 0
    assert len(_ours(admin)) == 5 and "squatter" in _ours(admin)
    no_farm = runner.invoke(cli, ["datadog", "apply", "--prune"], env={**APPLY_ENV, "GPUFARM_FARM_CONFIG": ""})
    assert no_farm.exit_code != 0


# -- evaluation on the sandbox -----------------------------------------------------------------------------------


def _uuid(host: int, index: int) -> str:
    return f"gpu-{host:08x}-0000-4000-8000-{index:012x}"


def _device_series(host: str, host_no: int, index: int, busy: bool, start: int, end: int) -> list[MetricSeries]:
    """The node agent's per-device series for one GPU (spec/metrics.yaml tags), one point a minute."""
    tags = [
        "environment:onprem-hpc",
        "cluster:hpc-a",
        f"gpu_uuid:{_uuid(host_no, index)}",
        f"gpu_index:{index}",
        "gpu_model:h100",
        "gpu_slicing_mode:none",
        f"gpu_ir:ir-{IR}",
        f"ir:ir-{IR}",
    ]
    stamps = range(start, end + 1, 60)

    def gauge(metric: str, value: float, extra: tuple[str, ...] = ()) -> MetricSeries:
        return MetricSeries(
            metric=metric,
            type=MetricIntakeType.GAUGE,
            points=[MetricPoint(timestamp=t, value=value) for t in stamps],
            resources=[MetricResource(name=host, type="host")],
            tags=[*tags, *extra],
        )

    return [
        gauge("gpufarm.gpu.utilization", 93.0 if busy else 0.0),
        gauge("gpufarm.gpu.processes", 1.0 if busy else 0.0),
        gauge("gpufarm.gpu.memory.used", float(60 << 30) if busy else 0.0),
        *(
            gauge("gpufarm.gpu.idle_state", 1.0 if (state == "busy") == busy else 0.0, (f"state:{state}",))
            for state in ("busy", "idle")
        ),
        gauge("gpufarm.gpu.idle_state", 0.0, ("state:idle_held",)),
    ]


def _feed(client: ApiClient, sandbox: Sandbox, busy_hosts: set[str], span: int) -> None:
    now = int(sandbox.clock.now())
    for host_no, host in enumerate(HOSTS, start=1):
        series = [s for i in range(8) for s in _device_series(host, host_no, i, host in busy_hosts, now - span, now)]
        assert MetricsApi(client).submit_metrics(MetricPayload(series=series)).errors == []


def _lease_hosts(sandbox_url: str) -> None:
    for host in HOSTS:
        tags = ["gpufarm:managed", "environment:onprem-hpc", "gpu_model:h100", "team:nlp", f"ir:ir-{IR}"]
        assert http(f"{sandbox_url}/api/v1/tags/hosts/{host}", "POST", {"tags": tags})[0] == 201


JudgeLease = Callable[[set[str], int], Receiver]


@pytest.fixture
def judge_lease(
    admin: DatadogAdmin, client: ApiClient, sandbox: Sandbox, sandbox_url: str, receiver: tuple[Receiver, str]
) -> JudgeLease:
    """judge(busy_hosts, span): apply the farm's monitors, lease HOSTS as IR, feed `span` seconds of series
    (the hosts in busy_hosts working), let three evaluations run; the receiver of the idle webhook's calls."""
    app, url = receiver

    def judge(busy_hosts: set[str], span: int) -> Receiver:
        _apply(admin, _spec(FARM_YAML, url))
        _lease_hosts(sandbox_url)
        _feed(client, sandbox, busy_hosts=busy_hosts, span=span)
        for _ in range(3):  # the group is first seen, then judged once it has had a whole window
            assert http(f"{sandbox_url}/_sandbox/clock", "POST", {"advance": 60})[0] == 200
        assert sandbox.webhooks.drain(10)
        return app

    return judge


def test_a_lease_half_idle_on_two_hosts_alerts_for_the_idle_host_only(judge_lease: JudgeLease) -> None:
    # 16 H100 on two hosts: the first host's 8 sat idle for the hour, the second's 8 worked (avg by {ir}: 46 %).
    app = judge_lease({HOSTS[1]}, 59 * 60)
    fired = [(b["alert_scope"], b["alert_transition"], IdleAlert.model_validate(b).idle_scope()) for b in app.bodies]
    scopes = {scope for scope, _, _ in fired}
    assert scopes == {f"gpu_ir:ir-{IR},host:{HOSTS[0]}"}, fired
    kinds = {s.kind for _, _, s in fired}
    # No process for the window, and utilisation under 5 %; the idle_held monitor stays quiet (no memory held).
    assert kinds == {IdleKind.IDLE.value, IdleKind.LOW_UTILIZATION.value}
    for _, transition, scope in fired:
        assert transition == "Triggered"
        assert scope.hosts == (HOSTS[0],) and scope.value == 0.0 and scope.window_minutes == 60
    assert all(h.get("X-Gpufarm-Token") == SECRET for h in app.headers)
    alert = IdleAlert.model_validate(app.bodies[0])
    assert alert.ir() == IR
    # What the idle webhook asks before acting: the group's status now, through the runtime gateway.
    gateway = DatadogGateway(Settings(max_retries=1))
    try:
        monitor_id = int(str(alert.alert_id))
        assert gateway.group_status(monitor_id, [f"host:{HOSTS[0]}", f"gpu_ir:ir-{IR}"]) == "Alert"
        assert gateway.group_status(monitor_id, [f"gpu_ir:ir-{IR}", f"host:{HOSTS[1]}"]) == "OK"
        assert gateway.group_status(monitor_id, [f"gpu_ir:ir-{IR}", "host:elsewhere"]) is None
        assert gateway.group_status(999_999_999, [f"gpu_ir:ir-{IR}"]) is None
        alerting = gateway.alerting_groups("gpufarm:managed")
        assert sorted(tags for _, tags in alerting) == [(f"gpu_ir:ir-{IR}", f"host:{HOSTS[0]}")] * 2
        assert len({mid for mid, _ in alerting}) == 2  # the no-process and the low-utilisation monitors
    finally:
        gateway.close()


def test_a_fresh_lease_is_not_judged_during_the_startup_grace(judge_lease: JudgeLease) -> None:
    # Allocated ten minutes ago, nothing running yet: inside the 30-minute start-up grace.
    assert judge_lease(set(), 10 * 60).bodies == []
