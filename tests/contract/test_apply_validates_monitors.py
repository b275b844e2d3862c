"""`gpufarm datadog apply` has Datadog validate every monitor it creates or updates before it changes anything:
counted at the sandbox's validate endpoints, on a dry run too; a monitor Datadog refuses blocks the plan, apply
changes nothing (no monitor, no field, no webhook) and says which monitor and Datadog's reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import APPLY_ENV, farm_file, http

from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.cli import cli
from gpufarm.cli import datadog as datadog_cli
from gpufarm.config import SecretStr, Settings
from gpufarm.core.config.farm import FarmConfig, parse_farm
from gpufarm.core.kernel.errors import UpstreamError, ValidationFailed
from gpufarm.setup import apply as setup
from gpufarm.setup import monitors as mon
from gpufarm.setup import plan as planning
from gpufarm.setup.changes import Action
from gpufarm.setup.squatter_monitor import farm_monitors
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

SECRET = "hook-secret-for-validation-tests-01"
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
  kinds:
    low_utilization: {threshold_percent: 5, window_minutes: 120}
"""
VALIDATE = "POST /api/v1/monitor/validate"
VALIDATE_EXISTING = "POST /api/v1/monitor/<int(signed=True):monitor_id>/validate"
CREATE = "POST /api/v1/monitor"
UPDATE = "PUT /api/v1/monitor/<int(signed=True):monitor_id>"
EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml"


@pytest.fixture
def admin(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[DatadogAdmin]:
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    adm = DatadogAdmin(Settings(max_retries=1))
    yield adm
    adm.close()


def _spec(monitors: list[mon.IdleMonitor], farm: FarmConfig) -> planning.SetupSpec:
    return planning.SetupSpec(
        incident_webhook_url="http://127.0.0.1:9/fn/incident_webhook/",
        idle_webhook_url="http://127.0.0.1:9/fn/idle_alert/",
        valid_values=farm.valid_values(),
        has_secret=True,
        monitors=monitors,
    )


def _apply(admin: DatadogAdmin, spec: planning.SetupSpec, *, dry_run: bool = False) -> planning.Plan:
    return setup.apply_setup(admin, spec, secret=SecretStr(SECRET), dry_run=dry_run)


def _calls(sandbox_url: str) -> dict[str, int]:
    """The API calls the sandbox has served since the last reset, per endpoint; then starts again from zero."""
    status, counts = http(f"{sandbox_url}/_sandbox/requests")
    assert status == 200
    assert http(f"{sandbox_url}/_sandbox/requests", "DELETE")[0] == 200
    return dict(counts["by_endpoint"])


def _with_query(monitor: mon.IdleMonitor, window: str) -> mon.IdleMonitor:
    """The monitor with the window an earlier gpufarm wrote (`last_120m`), which Datadog's fixed list refuses."""
    body: dict[str, Any] = {**monitor.body, "query": monitor.body["query"].replace("last_2h", window, 1)}
    return replace(monitor, body=body)


def test_apply_validates_each_monitor_once_before_creating_and_each_update_before_updating(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str
) -> None:
    farm = parse_farm(FARM_YAML)
    wanted = mon.desired_monitors(farm)
    assert len(wanted) == 6
    _calls(sandbox_url)
    plan = _apply(admin, _spec(wanted, farm))
    calls = _calls(sandbox_url)
    assert calls[VALIDATE] == 6 and calls[CREATE] == 6 and VALIDATE_EXISTING not in calls
    assert sorted(plan.validated_monitors) == sorted(str(m.body["name"]) for m in wanted)
    # The windows as Datadog's reference writes them: an hour and two hours, never 60 or 120 minutes.
    windows = sorted(m["query"].split(":", 1)[0] for m in admin.list_monitors())
    assert windows == ["avg(last_2h)"] * 2 + ["max(last_1h)"] * 2 + ["min(last_1h)"] * 2

    # Nothing to create or update: nothing to validate.
    again = _apply(admin, _spec(wanted, farm))
    assert again.pending == [] and again.validated_monitors == ()
    assert VALIDATE not in _calls(sandbox_url)

    # A changed threshold updates two monitors in place, each validated as an update of its own monitor first.
    tuned = parse_farm(FARM_YAML.replace("threshold_percent: 5", "threshold_percent: 8"))
    updated = _apply(admin, _spec(mon.desired_monitors(tuned), tuned))
    calls = _calls(sandbox_url)
    assert calls[VALIDATE_EXISTING] == 2 and calls[UPDATE] == 2 and VALIDATE not in calls
    assert len(updated.validated_monitors) == 2


def test_a_refused_monitor_stops_apply_before_anything_is_changed(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str
) -> None:
    farm = parse_farm(FARM_YAML)
    wanted = mon.desired_monitors(farm)
    low = [i for i, m in enumerate(wanted) if m.kind.value == "low_utilization"]
    stale = list(wanted)
    stale[low[0]] = _with_query(wanted[low[0]], "last_120m")
    refused_name = str(stale[low[0]].body["name"])
    _calls(sandbox_url)

    dry = _apply(admin, _spec(stale, farm), dry_run=True)
    [blocked] = dry.blocked
    assert (blocked.kind, blocked.name) == (mon.KIND, refused_name)
    assert "HTTP 400" in blocked.detail and "invalid time window last_120m" in blocked.detail
    assert len(dry.validated_monitors) == 5 and refused_name not in dry.validated_monitors

    with pytest.raises(ValidationFailed, match="invalid time window last_120m"):
        _apply(admin, _spec(stale, farm))
    calls = _calls(sandbox_url)
    # Every monitor was validated (all six, both runs), and nothing at all was written.
    assert calls[VALIDATE] == 12
    writes = {endpoint for endpoint in calls if not endpoint.startswith("GET ") and "validate" not in endpoint}
    assert writes == set(), writes
    assert admin.list_monitors() == []
    assert planning.DEFAULT_INCIDENT_TYPE not in [t["attributes"]["name"] for t in admin.list_incident_types()]


def test_a_refused_update_leaves_every_monitor_as_it_was(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str
) -> None:
    farm = parse_farm(FARM_YAML)
    _apply(admin, _spec(mon.desired_monitors(farm), farm))
    before = {m["id"]: m["query"] for m in admin.list_monitors()}
    tuned = parse_farm(FARM_YAML.replace("threshold_percent: 5", "threshold_percent: 8"))
    wanted = mon.desired_monitors(tuned)
    low = [i for i, m in enumerate(wanted) if m.kind.value == "low_utilization"]
    wanted[low[1]] = _with_query(wanted[low[1]], "last_7m")
    _calls(sandbox_url)
    with pytest.raises(ValidationFailed, match="invalid time window last_7m"):
        _apply(admin, _spec(wanted, tuned))
    calls = _calls(sandbox_url)
    assert calls[VALIDATE_EXISTING] == 2 and UPDATE not in calls
    assert {m["id"]: m["query"] for m in admin.list_monitors()} == before


def test_a_validate_endpoint_that_fails_stops_apply_as_an_error_changing_nothing(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str
) -> None:
    farm = parse_farm(FARM_YAML)
    fault = {"rate": 1.0, "statuses": [503], "paths": "^/api/v1/monitor/validate$"}
    assert http(f"{sandbox_url}/_sandbox/faults", "POST", fault)[0] == 200
    with pytest.raises(UpstreamError, match="validate monitor"):
        _apply(admin, _spec(mon.desired_monitors(farm), farm))
    assert admin.list_monitors() == []
    assert planning.DEFAULT_INCIDENT_TYPE not in [t["attributes"]["name"] for t in admin.list_incident_types()]


def test_cli_names_the_refused_monitor_and_datadogs_reason_and_exits_1(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    farm = farm_file(tmp_path, FARM_YAML)

    def stale_monitors(config: FarmConfig) -> list[mon.IdleMonitor]:
        return [_with_query(m, "last_120m") for m in farm_monitors(config)]

    monkeypatch.setattr(datadog_cli, "farm_monitors", stale_monitors)
    runner = CliRunner()
    base = ["datadog", "apply", "--farm-config", str(farm)]
    for args in ([*base], [*base, "--dry-run"]):
        result = runner.invoke(cli, args, env=APPLY_ENV)
        assert result.exit_code == 1, result.output
        blocked = [line for line in result.output.splitlines() if line.strip().startswith("blocked")]
        assert len(blocked) == 2 and all("monitor [gpufarm] low GPU utilisation" in line for line in blocked)
        assert all("invalid time window last_120m" in line for line in blocked)
        assert "2 object(s) blocked; nothing was changed" in result.output
        assert "Traceback" not in result.output and SECRET not in result.output
    document = json.loads(runner.invoke(cli, [*base, "--dry-run", "--json"], env=APPLY_ENV).stdout)
    # The four other idle monitors and the squatter monitor are valid.
    assert document["blocked"] == 2 and len(document["validated_monitors"]) == 5
    assert admin.list_monitors() == []


def test_cli_dry_run_says_which_monitors_datadog_validated(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str, tmp_path: Path
) -> None:
    farm = farm_file(tmp_path, FARM_YAML)
    names = sorted(str(m.body["name"]) for m in farm_monitors(parse_farm(FARM_YAML)))
    runner = CliRunner()
    text = runner.invoke(cli, ["datadog", "apply", "--dry-run", "--farm-config", str(farm)], env=APPLY_ENV)
    assert text.exit_code == 3, text.output
    said = sorted(
        line.strip().removeprefix("validated monitor ").removesuffix(": Datadog accepts it")
        for line in text.output.splitlines()
        if line.strip().startswith("validated monitor ")
    )
    assert said == names
    _calls(sandbox_url)
    dry_json = runner.invoke(
        cli, ["datadog", "apply", "--dry-run", "--json", "--farm-config", str(farm)], env=APPLY_ENV
    )
    assert dry_json.exit_code == 3, dry_json.output
    assert sorted(json.loads(dry_json.stdout)["validated_monitors"]) == names
    calls = _calls(sandbox_url)
    assert calls[VALIDATE] == len(names) and CREATE not in calls


def test_the_example_farm_dry_runs_with_every_monitor_validated(
    admin: DatadogAdmin, sandbox: Sandbox, sandbox_url: str
) -> None:
    args = ["datadog", "apply", "--dry-run", "--json", "--farm-config", str(EXAMPLE)]
    result = CliRunner().invoke(cli, args, env=APPLY_ENV)
    assert result.exit_code == 3, result.output
    document = json.loads(result.stdout)
    monitors = [c for c in document["changes"] if c["kind"] == mon.KIND]
    assert monitors and {c["action"] for c in monitors} == {Action.CREATE.value}
    assert document["blocked"] == 0 and len(document["validated_monitors"]) == len(monitors)
    assert admin.list_monitors() == []
