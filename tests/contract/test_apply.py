"""`gpufarm datadog apply` against the sandbox: plan, create, converge, a second run changes nothing, and the
objects it makes really deliver incident changes to the webhook with the secret header."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import SecretStr
from werkzeug.wrappers import Request, Response

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.cli import cli
from gpufarm.config import Settings
from gpufarm.core import fields as f
from gpufarm.core.errors import ValidationFailed
from gpufarm.setup import apply as setup
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

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


class Receiver:
    """A webhook target on loopback that records what Datadog (the sandbox) sends it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], Any]] = []
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        with self._lock:
            self.calls.append((request.path, dict(request.headers), json.loads(request.get_data() or b"null")))
        return Response("{}", status=200, content_type="application/json")(environ, start_response)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A recording webhook receiver and its base URL."""
    app = Receiver()
    with ServerThread(app) as server:
        yield app, server.url


@pytest.fixture
def settings(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings aimed at the sandbox, with the webhook secret set."""
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    monkeypatch.delenv("GPUFARM_FARM_CONFIG", raising=False)
    monkeypatch.delenv("GPUFARM_FARM_CONFIG_PARAMETER", raising=False)
    return Settings(max_retries=1)


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    """The adapter apply talks through."""
    gw = DatadogGateway(settings)
    yield gw
    gw.close()


def _spec(url: str = "http://127.0.0.1:9", **overrides: Any) -> setup.SetupSpec:
    values: dict[str, Any] = {
        "incident_webhook_url": f"{url}/fn/incident_webhook/",
        "idle_webhook_url": f"{url}/fn/idle_alert/",
        "valid_values": VALUES,
        "has_secret": True,
    }
    values.update(overrides)
    return setup.SetupSpec(**values)


def _apply(gateway: DatadogGateway, spec: setup.SetupSpec, *, dry_run: bool = False) -> setup.Plan:
    return setup.apply_setup(gateway, spec, secret=SecretStr(SECRET), dry_run=dry_run)


def test_dry_run_plans_everything_and_changes_nothing(gateway: DatadogGateway, sandbox: Sandbox) -> None:
    plan = _apply(gateway, _spec(), dry_run=True)
    counts = plan.counts()
    # 18 fields, 1 secret variable, 2 webhooks, 2 rules; the incident type is only looked up.
    assert counts == {"create": len(f.SCHEMA) + 5, "update": 0, "unchanged": 1, "blocked": 0}
    current = setup.read_current(gateway)
    assert current.fields == []
    assert current.webhooks == {"gpufarm-incidents": None, "gpufarm-idle": None}
    assert current.variable is None
    assert current.rules == []


def test_apply_creates_what_gpufarm_needs_and_a_second_run_changes_nothing(
    gateway: DatadogGateway, sandbox: Sandbox
) -> None:
    first = _apply(gateway, _spec())
    assert len(first.pending) == len(f.SCHEMA) + 5

    current = setup.read_current(gateway)
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

    second = _apply(gateway, _spec())
    assert second.pending == []
    assert {c.action for c in second.changes} == {setup.Action.UNCHANGED}


def test_apply_converges_changed_values_urls_and_rules(gateway: DatadogGateway, sandbox: Sandbox) -> None:
    _apply(gateway, _spec())
    rule = next(
        r for r in gateway.list_notification_rules() if r["attributes"]["trigger"] == "incident_modified_trigger"
    )
    gateway.update_notification_rule(rule["id"], {**rule["attributes"], "renotify_on": ["state"]})
    more = {**VALUES, "team": ["nlp", "speech", "vision"]}

    plan = _apply(gateway, _spec("http://127.0.0.1:10", valid_values=more, rotate_secret=True))

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
    assert _apply(gateway, _spec("http://127.0.0.1:10", valid_values=more)).pending == []


def test_blocked_plans_change_nothing(gateway: DatadogGateway, sandbox: Sandbox) -> None:
    spec = _spec(valid_values={}, has_secret=False, incident_webhook_url="")
    plan = _apply(gateway, spec, dry_run=True)
    blocked = {(c.kind, c.name) for c in plan.blocked}
    assert blocked == {
        ("field", "team"),
        ("field", "gpu_model"),
        ("field", "environment"),
        ("custom variable", "GPUFARM_WEBHOOK_SECRET"),
        ("webhook", "gpufarm-incidents"),
    }
    with pytest.raises(ValidationFailed, match="farm configuration"):
        _apply(gateway, spec)
    assert setup.read_current(gateway).fields == []

    # Once the fields exist, a run without the farm configuration keeps their choices instead of blocking.
    _apply(gateway, _spec())
    kept = _apply(gateway, _spec(valid_values={}), dry_run=True)
    assert kept.blocked == []
    assert next(c for c in kept.changes if c.name == "team").detail == "choices kept (no farm configuration given)"


def test_a_field_of_the_wrong_type_blocks_with_advice(gateway: DatadogGateway, sandbox: Sandbox) -> None:
    type_id = setup.plan_setup(setup.read_current(gateway), _spec()).incident_type_id
    assert type_id is not None
    gateway.create_field_definition({"name": "team", "display_name": "Team", "type": 3}, type_id)
    plan = _apply(gateway, _spec(), dry_run=True)
    team = next(c for c in plan.changes if c.name == "team")
    assert team.action is setup.Action.BLOCKED
    assert "cannot change a field's type" in team.detail


def test_applied_objects_deliver_incident_changes_with_the_secret_header(
    gateway: DatadogGateway, sandbox: Sandbox, receiver: tuple[Receiver, str]
) -> None:
    app, url = receiver
    _apply(gateway, _spec(url))
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


# -- the command line --------------------------------------------------------------------------------------------


def test_cli_dry_run_then_apply_then_nothing_to_change(settings: Settings, sandbox: Sandbox, tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text(FARM_YAML)
    env = {
        "GPUFARM_INCIDENT_WEBHOOK_URL": "http://127.0.0.1:9/fn/incident_webhook/",
        "GPUFARM_IDLE_WEBHOOK_URL": "http://127.0.0.1:9/fn/idle_alert/",
    }
    runner = CliRunner()
    args = ["datadog", "apply", "--farm-config", str(farm)]

    dry = runner.invoke(cli, [*args, "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "create    field team" in dry.output
    assert "dry run: nothing was changed" in dry.output

    real = runner.invoke(cli, args, env=env)
    assert real.exit_code == 0, real.output
    assert f"applied {len(f.SCHEMA) + 5} change(s)" in real.output

    again = runner.invoke(cli, args, env=env)
    assert again.exit_code == 0, again.output
    assert "nothing to change" in again.output
    assert f"plan: {len(f.SCHEMA) + 6} unchanged\n" in again.output
    for output in (dry.output, real.output, again.output):
        assert SECRET not in output

    gpu_models = next(
        d["attributes"]
        for d in DatadogGateway(settings).list_field_definitions()
        if d["attributes"]["name"] == "gpu_model"
    )
    assert [v["value"] for v in gpu_models["valid_values"]] == ["A100", "H100"]


def test_cli_blocked_plan_exits_non_zero_without_a_traceback(settings: Settings, sandbox: Sandbox) -> None:
    result = CliRunner().invoke(cli, ["datadog", "apply"], env={"GPUFARM_INCIDENT_WEBHOOK_URL": "not a url"})
    assert result.exit_code == 1
    assert "blocked" in result.output
    assert "GPUFARM_IDLE_WEBHOOK_URL" in result.output
    assert "Traceback" not in result.output
    assert setup.read_current(DatadogGateway(settings)).webhooks["gpufarm-incidents"] is None


def test_cli_reports_a_broken_farm_file(settings: Settings, sandbox: Sandbox, tmp_path: Path) -> None:
    farm = tmp_path / "farm.yaml"
    farm.write_text("gpu_models: [oops")
    result = CliRunner().invoke(cli, ["datadog", "apply", "--dry-run", "--farm-config", str(farm)])
    assert result.exit_code == 1
    assert "not valid YAML" in result.output
