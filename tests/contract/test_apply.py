"""`gpufarm datadog apply` against the sandbox: plan, create, converge, a second run changes nothing, and the
objects it makes really deliver incident changes to the webhook with the secret header."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import APPLY_ENV, Receiver, farm_file

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.cli import cli
from gpufarm.config import SecretStr, Settings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.setup import apply as setup
from gpufarm.setup import plan as planning
from gpufarm.setup.changes import Action
from gpufarm.setup.dashboards import desired_metadata
from gpufarm.setup.squatter_monitor import farm_monitors
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

SECRET = "hook-secret-for-tests-0123456789"
VALUES = {"team": ["nlp", "vision"], "gpu_model": ["A100", "H100"], "environment": ["cloud", "onprem-hpc"]}
FARM_YAML = """
gpu_models:
  H100: {}
  A100: {}
environments:
  onprem-hpc:
    gpu_models: [H100]
  cloud:
    gpu_models: [A100, H100]
teams:
  nlp:
    quotas: {onprem-hpc: {H100: {gpus: 8}}}
  vision: {}
"""
# With the farm configuration, apply also manages its idle monitors (one per kind for the two dedicated pools) and
# its squatter monitor, the five dashboards and the metric metadata.
MONITORS = len(farm_monitors(parse_farm(FARM_YAML))) + 5 + len(desired_metadata())


@pytest.fixture
def settings(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings aimed at the sandbox, with the webhook secret set."""
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    monkeypatch.delenv("GPUFARM_FARM_CONFIG", raising=False)
    monkeypatch.delenv("GPUFARM_FARM_CONFIG_PARAMETER", raising=False)
    return Settings(max_retries=1)


@pytest.fixture
def admin(settings: Settings) -> Iterator[DatadogAdmin]:
    """The adapter apply talks through."""
    adm = DatadogAdmin(settings)
    yield adm
    adm.close()


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    """The runtime adapter: what creates incidents once apply has run."""
    gw = DatadogGateway(settings)
    yield gw
    gw.close()


def _spec(url: str = "http://127.0.0.1:9", **overrides: Any) -> planning.SetupSpec:
    values: dict[str, Any] = {
        "incident_webhook_url": f"{url}/fn/incident_webhook/",
        "idle_webhook_url": f"{url}/fn/idle_alert/",
        "valid_values": VALUES,
        "has_secret": True,
    }
    values.update(overrides)
    return planning.SetupSpec(**values)


def _apply(admin: DatadogAdmin, spec: planning.SetupSpec, *, dry_run: bool = False) -> planning.Plan:
    return setup.apply_setup(admin, spec, secret=SecretStr(SECRET), dry_run=dry_run)


def test_dry_run_plans_everything_and_changes_nothing(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    plan = _apply(admin, _spec(), dry_run=True)
    counts = plan.counts()
    # gpufarm's incident type, 18 fields on it, 1 secret variable, 2 webhooks, 2 rules.
    assert counts == {"create": len(f.SCHEMA) + 6, "update": 0, "unchanged": 0, "delete": 0, "blocked": 0}
    assert (plan.changes[0].kind, plan.changes[0].name) == ("incident type", "GPU allocation")
    current = setup.read_current(admin)
    assert [t["attributes"]["name"] for t in current.incident_types] == ["Incident"]
    assert current.fields == []
    assert current.webhooks == {"gpufarm-incidents": None, "gpufarm-idle": None}
    assert current.variable is None
    assert current.rules == []


def test_apply_creates_what_gpufarm_needs_and_a_second_run_changes_nothing(
    admin: DatadogAdmin, sandbox: Sandbox
) -> None:
    first = _apply(admin, _spec())
    assert len(first.pending) == len(f.SCHEMA) + 6

    current = setup.read_current(admin)
    ours = [t for t in current.incident_types if t["attributes"]["name"] == "GPU allocation"]
    assert len(ours) == 1
    assert ours[0]["attributes"]["is_default"] is False
    assert "gpufarm" in ours[0]["attributes"]["description"]
    type_id = ours[0]["id"]
    # Fields and rules belong to gpufarm's type only; the org's default type gets none of them.
    assert {d["relationships"]["incident_type"]["data"]["id"] for d in admin.list_field_definitions()} == {type_id}
    assert {r["relationships"]["incident_type"]["data"]["id"] for r in current.rules} == {type_id}
    by_name = {d["attributes"]["name"]: d["attributes"] for d in current.fields}
    assert set(by_name) == {spec.name for spec in f.SCHEMA}
    assert by_name["gpu_model"]["type"] == 1
    assert [v["value"] for v in by_name["gpu_model"]["valid_values"]] == ["A100", "H100"]
    assert [v["value"] for v in by_name["phase"]["valid_values"]][:2] == ["requested", "approved"]
    assert by_name["hosts"]["type"] == 4
    assert by_name["gpu_count"]["type"] == 3

    hook = current.webhooks["gpufarm-incidents"]
    assert hook is not None
    assert hook["url"].endswith("/fn/incident_webhook/")
    assert json.loads(hook["custom_headers"]) == {"X-Gpufarm-Token": "$GPUFARM_WEBHOOK_SECRET"}
    assert "$INCIDENT_FIELDS" in hook["payload"]
    assert current.webhooks["gpufarm-idle"] is not None
    assert "$ALERT_SCOPE" in current.webhooks["gpufarm-idle"]["payload"]  # type: ignore[index]
    assert current.variable is not None
    assert current.variable["is_secret"] is True
    assert SECRET not in json.dumps(current.variable)
    rules = {r["attributes"]["trigger"]: r["attributes"] for r in current.rules}
    assert set(rules) == {"incident_created_trigger", "incident_modified_trigger"}
    assert rules["incident_modified_trigger"]["renotify_on"] == ["state", "phase"]
    assert rules["incident_created_trigger"]["handles"] == ["@webhook-gpufarm-incidents"]

    second = _apply(admin, _spec())
    assert second.pending == []
    assert {c.action for c in second.changes} == {Action.UNCHANGED}
    assert second.incident_type_id == type_id
    assert second.changes[0].line() == f"unchanged incident type GPU allocation: {type_id}"


def test_apply_converges_changed_values_urls_and_rules(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    _apply(admin, _spec())
    rule = next(r for r in admin.list_notification_rules() if r["attributes"]["trigger"] == "incident_modified_trigger")
    type_id = rule["relationships"]["incident_type"]["data"]["id"]
    admin.update_notification_rule(rule["id"], {**rule["attributes"], "renotify_on": ["state"]}, type_id)
    more = {**VALUES, "team": ["nlp", "speech", "vision"]}

    plan = _apply(admin, _spec("http://127.0.0.1:10", valid_values=more, rotate_secret=True))

    changed = {(c.kind, c.name): c for c in plan.pending}
    assert set(changed) == {
        ("field", "team"),
        ("custom variable", "GPUFARM_WEBHOOK_SECRET"),
        ("webhook", "gpufarm-incidents"),
        ("webhook", "gpufarm-idle"),
        ("notification rule", "incident_modified_trigger"),
    }
    assert changed[("field", "team")].detail == "choices +speech"
    assert changed[("webhook", "gpufarm-idle")].detail == "url"
    assert _apply(admin, _spec("http://127.0.0.1:10", valid_values=more)).pending == []


def test_blocked_plans_change_nothing(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    spec = _spec(valid_values={}, has_secret=False, incident_webhook_url="")
    plan = _apply(admin, spec, dry_run=True)
    blocked = {(c.kind, c.name) for c in plan.blocked}
    assert blocked == {
        ("field", "team"),
        ("field", "gpu_model"),
        ("field", "environment"),
        ("custom variable", "GPUFARM_WEBHOOK_SECRET"),
        ("webhook", "gpufarm-incidents"),
    }
    with pytest.raises(ValidationFailed, match="farm configuration"):
        _apply(admin, spec)
    assert setup.read_current(admin).fields == []

    # Once the fields exist, a run without the farm configuration keeps their choices instead of blocking.
    _apply(admin, _spec())
    kept = _apply(admin, _spec(valid_values={}), dry_run=True)
    assert kept.blocked == []
    assert next(c for c in kept.changes if c.name == "team").detail == "choices kept (no farm configuration given)"


def test_a_field_of_the_wrong_type_blocks_with_advice(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    type_id = str(admin.create_incident_type("GPU allocation", planning.INCIDENT_TYPE_DESCRIPTION)["id"])
    admin.create_field_definition({"name": "team", "display_name": "Team", "type": 3}, type_id)
    plan = _apply(admin, _spec(), dry_run=True)
    team = next(c for c in plan.changes if c.name == "team")
    assert team.action is Action.BLOCKED
    assert "cannot change a field's type" in team.detail


def test_applied_objects_deliver_incident_changes_with_the_secret_header(
    admin: DatadogAdmin, gateway: DatadogGateway, sandbox: Sandbox, receiver: tuple[Receiver, str]
) -> None:
    app, url = receiver
    _apply(admin, _spec(url))
    incident = gateway.create(
        "GPU request: nlp/llm-ko 8xH100 (onprem-hpc)",
        {f.STATE: "active", f.PHASE: "requested", f.TEAM: "nlp", f.GPU_MODEL: "H100", f.REQUEST_ID: "req-apply-1"},
    )
    gateway.update(incident.id, {f.PURPOSE: "fine-tuning"})  # not a state/phase change: no call
    gateway.update(incident.id, {f.PHASE: "approved"})
    assert sandbox.webhooks.drain(10)

    assert [c[0] for c in app.calls] == ["/fn/incident_webhook/", "/fn/incident_webhook/"]
    for _, headers, body in app.calls:
        assert headers["X-Gpufarm-Token"] == SECRET
        assert body["incident_uuid"] == incident.id
        assert body["incident_public_id"] == str(incident.public_id)
        assert isinstance(body["incident_fields"], dict)
    assert app.calls[0][2]["incident_fields"]["phase"] == "requested"
    assert app.calls[1][2]["incident_fields"]["phase"] == "approved"
    assert app.calls[1][2]["incident_status"] == "active"
    deliveries = json.dumps(sandbox.webhooks.deliveries)
    assert SECRET not in deliveries


def test_apply_moves_a_rule_an_older_gpufarm_left_on_another_type(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    """Before incident types, apply put its rules on the org's default type: they move to gpufarm's, not double."""
    default = next(t["id"] for t in admin.list_incident_types() if t["attributes"]["is_default"])
    old = admin.create_notification_rule(planning.desired_rules()[1], default)
    other = admin.create_notification_rule({**planning.desired_rules()[1], "handles": ["@oncall-sre"]}, default)

    plan = _apply(admin, _spec())
    moved = next(c for c in plan.changes if c.name == "incident_modified_trigger")
    assert (moved.action, moved.target_id, moved.differences) == (Action.UPDATE, old["id"], ("incident type",))
    assert "moves it to incident type 'GPU allocation'" in moved.detail

    rules = {r["id"]: r for r in admin.list_notification_rules()}
    assert len(rules) == 3  # the moved one, the new created-trigger rule, and the org's own rule
    ours = next(t["id"] for t in admin.list_incident_types() if t["attributes"]["name"] == "GPU allocation")
    assert rules[old["id"]]["relationships"]["incident_type"]["data"]["id"] == ours
    assert rules[other["id"]]["relationships"]["incident_type"]["data"]["id"] == default  # not gpufarm's: untouched
    assert _apply(admin, _spec()).pending == []


def test_apply_refuses_the_default_type_and_ambiguous_names(admin: DatadogAdmin, sandbox: Sandbox) -> None:
    on_default = _apply(admin, _spec(incident_type="Incident"), dry_run=True)
    assert (on_default.blocked[0].kind, on_default.blocked[0].name) == ("incident type", "Incident")
    assert "default type" in on_default.blocked[0].detail
    assert {c.detail for c in on_default.blocked[1:]} == {"needs gpufarm's incident type"}
    with pytest.raises(ValidationFailed, match="default type"):
        _apply(admin, _spec(incident_type="Incident"))
    assert admin.list_field_definitions() == []

    admin.create_incident_type("GPU allocation", "one")
    admin.create_incident_type("GPU allocation", "two")
    twice = _apply(admin, _spec(), dry_run=True)
    assert (twice.blocked[0].kind, twice.blocked[0].name) == ("incident type", "GPU allocation")
    assert "2 incident types have this name" in twice.blocked[0].detail


def test_an_operator_may_name_gpufarm_s_type(admin: DatadogAdmin, settings: Settings, sandbox: Sandbox) -> None:
    plan = _apply(admin, _spec(incident_type="ML leases"))
    names = [t["attributes"]["name"] for t in admin.list_incident_types()]
    assert sorted(names) == ["Incident", "ML leases"]
    type_id = next(t["id"] for t in admin.list_incident_types() if t["attributes"]["name"] == "ML leases")
    assert plan.changes[0].action is Action.CREATE
    # The runtime finds the same type by the same setting, and creates its incidents there.
    gateway = DatadogGateway(settings.replace(incident_type="ML leases"))
    record = gateway.create("GPU request", {f.STATE: "active", f.PHASE: "requested", f.REQUEST_ID: "req-named-1"})
    gateway.close()
    assert gateway.incident_type_id == type_id
    stored = next(i for i in sandbox.incidents.dump()["incidents"] if i["id"] == record.id)
    assert stored["incident_type_id"] == type_id


# -- the command line --------------------------------------------------------------------------------------------


def test_cli_dry_run_then_apply_then_nothing_to_change(settings: Settings, sandbox: Sandbox, tmp_path: Path) -> None:
    farm = farm_file(tmp_path, FARM_YAML)
    runner = CliRunner()
    args = ["datadog", "apply", "--farm-config", str(farm)]

    dry = runner.invoke(cli, [*args, "--dry-run"], env=APPLY_ENV)
    assert dry.exit_code == 3, dry.output  # changes pending
    assert "create    field team" in dry.output
    assert "dry run: nothing was changed" in dry.output
    assert "create    incident type GPU allocation" in dry.output

    real = runner.invoke(cli, args, env=APPLY_ENV)
    assert real.exit_code == 0, real.output
    assert f"applied {len(f.SCHEMA) + 6 + MONITORS} change(s)" in real.output

    again = runner.invoke(cli, args, env=APPLY_ENV)
    assert again.exit_code == 0, again.output
    assert "nothing to change" in again.output
    assert f"plan: {len(f.SCHEMA) + 6 + MONITORS} unchanged\n" in again.output
    for output in (dry.output, real.output, again.output):
        assert SECRET not in output

    gpu_models = next(
        d["attributes"]
        for d in DatadogAdmin(settings).list_field_definitions()
        if d["attributes"]["name"] == "gpu_model"
    )
    assert [v["value"] for v in gpu_models["valid_values"]] == ["A100", "H100"]


def test_cli_blocked_plan_exits_non_zero_without_a_traceback(settings: Settings, sandbox: Sandbox) -> None:
    result = CliRunner().invoke(cli, ["datadog", "apply"], env={"GPUFARM_INCIDENT_WEBHOOK_URL": "not a url"})
    assert result.exit_code == 1
    assert "blocked" in result.output
    assert "GPUFARM_IDLE_WEBHOOK_URL" in result.output
    assert "Traceback" not in result.output
    assert setup.read_current(DatadogAdmin(settings)).webhooks["gpufarm-incidents"] is None


def test_cli_reports_a_broken_farm_file(settings: Settings, sandbox: Sandbox, tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text("gpu_models: [oops")
    result = CliRunner().invoke(cli, ["datadog", "apply", "--dry-run", "--farm-config", str(farm)])
    assert result.exit_code == 2  # bad input
    assert "not valid YAML" in result.output


def test_cli_reports_a_farm_file_number_too_long_without_a_traceback(settings: Settings, tmp_path: Path) -> None:
    farm = farm_file(tmp_path, FARM_YAML.replace("gpus: 8", "gpus: " + "9" * 5000))
    result = CliRunner().invoke(cli, ["datadog", "apply", "--dry-run", "--farm-config", str(farm)])
    assert result.exit_code == 2  # bad input
    assert "line 12, column 40: a number of 5,000 characters is too long" in result.output
    assert "Traceback" not in result.output


def test_cli_dry_run_exit_status_and_json_plan_gate_a_pipeline(
    settings: Settings, sandbox: Sandbox, tmp_path: Path
) -> None:
    farm = farm_file(tmp_path, FARM_YAML)
    runner = CliRunner()
    dry_json = ["datadog", "apply", "--dry-run", "--json"]

    # Without the farm configuration the dropdown fields are blocked: exit 1, and the JSON says which and why.
    blocked = runner.invoke(cli, dry_json, env=APPLY_ENV)
    assert blocked.exit_code == 1
    document = json.loads(blocked.stdout)
    assert document["blocked"] == 3
    assert {c["name"] for c in document["changes"] if c["action"] == "blocked"} == {"team", "gpu_model", "environment"}

    pending = runner.invoke(cli, [*dry_json, "--farm-config", str(farm)], env=APPLY_ENV)
    assert pending.exit_code == 3, pending.output
    plan = json.loads(pending.stdout)  # stdout holds the JSON document and nothing else
    assert (plan["dry_run"], plan["applied"], plan["pending"], plan["blocked"]) == (
        True,
        None,
        len(f.SCHEMA) + 6 + MONITORS,
        0,
    )
    assert plan["incident_type"] == {"name": "GPU allocation", "id": None}
    assert plan["changes"][0] == {
        "kind": "incident type",
        "name": "GPU allocation",
        "action": "create",
        "differences": [],
        "detail": "gpufarm's incidents, fields and rules",
        "id": None,
    }
    assert SECRET not in pending.stdout

    applied = runner.invoke(cli, ["datadog", "apply", "--json", "--farm-config", str(farm)], env=APPLY_ENV)
    assert applied.exit_code == 0, applied.output
    applied_plan = json.loads(applied.stdout)
    assert applied_plan["applied"] == len(f.SCHEMA) + 6 + MONITORS
    type_id = applied_plan["incident_type"]["id"]  # what GPUFARM_INCIDENT_TYPE_ID may be set to
    assert [
        t["id"] for t in DatadogAdmin(settings).list_incident_types() if t["attributes"]["name"] == "GPU allocation"
    ] == [type_id]
    clean = runner.invoke(cli, [*dry_json, "--farm-config", str(farm)], env=APPLY_ENV)
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.stdout)["counts"] == {
        "create": 0,
        "update": 0,
        "unchanged": len(f.SCHEMA) + 6 + MONITORS,
        "delete": 0,
        "blocked": 0,
    }

    # A moved function URL: pending again, the difference named.
    moved = {**APPLY_ENV, "GPUFARM_IDLE_WEBHOOK_URL": "http://127.0.0.1:10/fn/idle_alert/"}
    diff = runner.invoke(cli, [*dry_json, "--farm-config", str(farm)], env=moved)
    assert diff.exit_code == 3, diff.output
    updates = [c for c in json.loads(diff.stdout)["changes"] if c["action"] == "update"]
    assert [(c["kind"], c["name"], c["differences"]) for c in updates] == [("webhook", "gpufarm-idle", ["url"])]
    text = runner.invoke(cli, ["datadog", "apply", "--dry-run", "--farm-config", str(farm)], env=APPLY_ENV)
    assert text.exit_code == 0
    assert "dry run: nothing was changed (0 change(s) pending)" in text.output


@pytest.mark.parametrize("args", [["datadog", "-h"], ["datadog", "apply", "-h"], ["-h"]])
def test_short_help_works_on_every_level(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ")
    if args[-2:] == ["apply", "-h"]:
        assert "--dry-run" in result.output
        assert "3  --dry-run only: changes are pending" in result.output


def test_cli_usage_errors_exit_2(settings: Settings, sandbox: Sandbox) -> None:
    result = CliRunner().invoke(cli, ["datadog", "apply", "--no-such-option"])
    assert result.exit_code == 2
    empty = CliRunner().invoke(cli, ["datadog", "apply", "--incident-type", " "])
    assert empty.exit_code == 2
