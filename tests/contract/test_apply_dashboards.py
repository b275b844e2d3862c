"""`gpufarm datadog apply` manages gpufarm's dashboards and the metric metadata against the sandbox, through the real
datadog-api-client: a fresh sandbox gets the five dashboards and every metric's metadata, a second run changes
nothing, a dashboard edited by hand is drift in `--dry-run` that apply restores, `--prune` deletes only marked
dashboards gpufarm no longer defines, and nobody else's dashboard is read or touched."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from datadog_api_client import ApiClient
from datadog_api_client.v1.api.metrics_api import MetricsApi
from helpers import APPLY_ENV, farm_file

from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.cli import cli
from gpufarm.config import SecretStr, Settings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.setup import apply as setup
from gpufarm.setup import dashboards as dash
from gpufarm.setup import plan as planning
from gpufarm.setup.changes import Action, Change
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

SECRET = "hook-secret-for-dashboard-tests-01"
FARM_YAML = """
gpu_models:
  H100: {}
  A100: {}
environments:
  onprem-hpc: {gpu_models: [H100]}
  shared-slices: {kind: shared, gpu_models: [A100]}
teams:
  nlp:
    quotas: {onprem-hpc: {H100: {gpus: 8}}}
"""


@pytest.fixture
def admin(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[DatadogAdmin]:
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    adm = DatadogAdmin(Settings(max_retries=1))
    yield adm
    adm.close()


def _spec(yaml_text: str = FARM_YAML, *, prune: bool = False) -> planning.SetupSpec:
    farm = parse_farm(yaml_text)
    return planning.SetupSpec(
        incident_webhook_url="http://127.0.0.1:9/fn/incident_webhook/",
        idle_webhook_url="http://127.0.0.1:9/fn/idle_alert/",
        valid_values=farm.valid_values(),
        has_secret=True,
        prune=prune,
        dashboards=dash.desired_dashboards(farm),
        metric_metadata=dash.desired_metadata(),
    )


def _apply(admin: DatadogAdmin, spec: planning.SetupSpec, *, dry_run: bool = False) -> planning.Plan:
    return setup.apply_setup(admin, spec, secret=SecretStr(SECRET), dry_run=dry_run)


def _kind(plan: planning.Plan, kind: str) -> list[Change]:
    return [c for c in plan.changes if c.kind == kind]


def _editable(dashboard: dict[str, Any]) -> dict[str, Any]:
    """A dashboard as read, less what the server sets (as someone editing it by hand would send it)."""
    server = ("id", "url", "created_at", "modified_at", "author_handle", "author_name", "deleted_at")
    return {k: v for k, v in dashboard.items() if k not in server}


def _ours(admin: DatadogAdmin) -> dict[str, dict[str, Any]]:
    out = {}
    for summary in admin.list_dashboards():
        found = admin.get_dashboard(str(summary["id"]))
        assert found is not None
        key = dash.dashboard_key(found)
        if key:
            out[key] = found
    return out


def test_a_fresh_sandbox_gets_five_dashboards_and_every_metrics_metadata(
    admin: DatadogAdmin, sandbox: Sandbox, dd_configuration: Any
) -> None:
    first = _apply(admin, _spec())
    assert [c.action for c in _kind(first, dash.KIND)] == [Action.CREATE] * 5
    metadata = _kind(first, dash.METADATA_KIND)
    assert len(metadata) == len(dash.desired_metadata()) and {c.action for c in metadata} == {Action.CREATE}
    stored = _ours(admin)
    assert sorted(stored) == sorted(["farm-overview", "project", "node", "slicing", "quota-ledger"])
    assert sandbox.dump()["dashboards"]["dashboards"][0]["widgets"] > 3
    # What the real client reads back: the metadata apply sent, units included.
    with ApiClient(dd_configuration) as client:
        pcie = MetricsApi(client).get_metric_metadata(metric_name="gpufarm.gpu.pcie.rx_throughput")
    assert (pcie.type, pcie.unit, pcie.per_unit) == ("gauge", "kibibyte", "second")
    again = _apply(admin, _spec())
    assert again.pending == []
    assert {c.action for c in _kind(again, dash.KIND) + _kind(again, dash.METADATA_KIND)} == {Action.UNCHANGED}


def test_a_hand_edit_shows_as_drift_and_apply_restores_it(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    _apply(admin, _spec())
    stored = _ours(admin)
    edited = copy.deepcopy(stored["project"])
    edited["title"] = "my own project board"
    edited["widgets"] = edited["widgets"][:3]
    admin.update_dashboard(str(edited["id"]), _editable(edited))
    dry = _apply(admin, _spec(), dry_run=True)
    [drift] = [c for c in _kind(dry, dash.KIND) if c.action is Action.UPDATE]
    assert drift.target_id == stored["project"]["id"]
    assert drift.differences[0] == "title" and drift.differences[1].startswith("widgets (3 there")
    assert _ours(admin)["project"]["title"] == "my own project board"  # a dry run changes nothing
    _apply(admin, _spec())
    restored = _ours(admin)["project"]
    assert restored["id"] == stored["project"]["id"] and restored["title"] == "gpufarm: project"
    assert len(restored["widgets"]) == len(stored["project"]["widgets"])
    assert _apply(admin, _spec()).pending == []


def test_prune_deletes_only_marked_dashboards_gpufarm_no_longer_defines(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    _apply(admin, _spec())
    note = {"definition": {"type": "note", "content": "x"}}
    foreign = admin.create_dashboard(
        {"title": "gpufarm: project", "layout_type": "ordered", "widgets": [note], "description": "the team's own"}
    )
    retired = admin.create_dashboard(
        {
            "title": "gpufarm: retired board",
            "layout_type": "ordered",
            "widgets": [note],
            "description": f"an older gpufarm's {dash.marker('retired')}",
        }
    )
    kept = _apply(admin, _spec())
    assert any("--prune deletes it" in c.detail for c in _kind(kept, dash.KIND) if c.target_id == retired["id"])
    assert all(c.target_id != foreign["id"] for c in kept.changes)
    pruned = _apply(admin, _spec(prune=True))
    assert [c.target_id for c in _kind(pruned, dash.KIND) if c.action is Action.DELETE] == [retired["id"]]
    assert admin.get_dashboard(str(retired["id"])) is None
    assert admin.get_dashboard(str(foreign["id"])) is not None


def test_the_sandbox_refuses_bad_metadata_as_datadog_does(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    assert admin.get_metric_metadata("gpufarm.never.seen") is None
    with pytest.raises(ValidationFailed, match="not a Datadog unit"):
        admin.update_metric_metadata("gpufarm.gpu.temperature", {"type": "gauge", "unit": "kelvinish"})
    with pytest.raises(ValidationFailed, match="metric type"):
        admin.update_metric_metadata("gpufarm.gpu.temperature", {"type": "histogram"})
    with pytest.raises(ValidationFailed, match="read-only"):
        admin.update_metric_metadata("gpufarm.gpu.temperature", {"integration": "nvml"})
    answer = admin.update_metric_metadata("gpufarm.gpu.temperature", {"type": "gauge", "unit": "degree celsius"})
    assert answer["unit"] == "degree celsius"
    # A later edit of one key keeps the others.
    admin.update_metric_metadata("gpufarm.gpu.temperature", {"description": "GPU core temperature"})
    assert admin.get_metric_metadata("gpufarm.gpu.temperature") == {
        "description": "GPU core temperature",
        "integration": None,
        "per_unit": None,
        "short_name": None,
        "statsd_interval": None,
        "type": "gauge",
        "unit": "degree celsius",
    }


def test_cli_dry_run_json_lists_dashboard_drift(admin: DatadogAdmin, sandbox: Sandbox, tmp_path: Path) -> None:
    farm = farm_file(tmp_path, FARM_YAML)
    runner = CliRunner()
    base = ["datadog", "apply", "--farm-config", str(farm)]
    assert runner.invoke(cli, base, env=APPLY_ENV).exit_code == 0
    stored = _ours(admin)["node"]
    stored["widgets"][1]["definition"]["title"] = "renamed by hand"
    admin.update_dashboard(str(stored["id"]), _editable(stored))
    dry = runner.invoke(cli, [*base, "--dry-run", "--json"], env=APPLY_ENV)
    assert dry.exit_code == 3, dry.output
    document = json.loads(dry.output)
    [change] = [c for c in document["changes"] if c["action"] == "update"]
    assert change["kind"] == "dashboard" and change["differences"] == ["widget 2 (Hosts)"]
    assert runner.invoke(cli, base, env=APPLY_ENV).exit_code == 0
    assert _ours(admin)["node"]["widgets"][1]["definition"]["title"] == "Hosts"
