"""`gpufarm local` applies the Datadog setup itself before it accepts requests, so the first `/gpu request` works.

Started the way the command starts it (run_local, with a `wait` that does the test's work and returns), nothing else
done on the Datadog side: no `gpufarm datadog apply` by hand. (The simulated Slack workspace gets its members and
the GPU hosts register their tags, as a real workspace and the node agents would.) `--no-setup` keeps the bare
start.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import secret_scan
from click.testing import CliRunner

from gpufarm.config import Settings
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.setup.webhooks import IDLE_WEBHOOK, INCIDENT_WEBHOOK
from gpufarm_sandbox.demo.lifecycle_stage import INGRESS_PATH, LocalFarm, ir_in
from gpufarm_sandbox.example_farm import ALICE
from gpufarm_sandbox.localhost import LocalEnv, setup, start_local
from gpufarm_sandbox.localhost.cli import NO_SETUP, local, run_local

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OTHER_TEMPLATE = REPO / "tests" / "fixtures" / "functions" / "template.yaml"
REQUEST = 'request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="first request"'


def _run(setup_first: bool, work: Callable[[LocalEnv, LocalFarm], None]) -> None:
    """run_local as `gpufarm local [--no-setup]` runs it; work(env, farm) runs once it printed "ready".

    The farm driver is opened on the running host with the settings a function would read, and closed after.
    """
    started: list[LocalEnv] = []

    def remember(env: LocalEnv) -> None:
        started.append(env)

    def with_farm(env: LocalEnv) -> None:
        farm = LocalFarm(env.url, env.host, Settings())
        try:
            work(env, farm)
        finally:
            farm.close()

    run_local("127.0.0.1", 0, hooks=[remember], wait=lambda stop: with_farm(started[0]), setup=setup_first)


def _printed_secrets(env: LocalEnv, out: str) -> list[str]:
    """The secret values of the local environment (sandbox keys, Slack secrets, webhook secret) found in out."""
    scan = secret_scan.SecretScan()
    for name, value in env.env.items():
        if secret_scan.SECRET_NAME.search(name):
            scan.learn(f"environment {name}", value)
    assert len(scan.secrets) >= 5  # Datadog API and app keys, Slack token and signing secret, webhook secret
    return scan.leaks([("stdout", out)])


def test_first_request_gets_an_ir_with_nothing_else_done(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    seen: dict[str, Any] = {}

    def first_request(env: LocalEnv, farm: LocalFarm) -> None:
        farm.seed_workspace()  # Slack's members and channels
        farm.seed_hosts()  # what the node agents register: host tags only
        sent = farm.slash(ALICE, REQUEST)
        assert sent["status"] == 200, sent
        assert farm.settle(timeout=15)
        answers = farm.messages(user=ALICE.id, kind="response")
        seen["answer"] = answers[-1]["text"] if answers else ""
        ir = ir_in(seen["answer"])
        assert ir is not None, seen["answer"]
        seen["record"] = farm.gateway.get_by_ir(ir)
        seen["again"] = setup.apply_local_setup(env)
        seen["hooks"] = {name: farm.admin.get_webhook(name) for name in (INCIDENT_WEBHOOK, IDLE_WEBHOOK)}
        seen["dead"] = list(env.host.dead_letters)
        seen["out"] = capsys.readouterr().out
        seen["leaks"] = _printed_secrets(env, seen["out"])

    _run(True, first_request)
    assert seen["again"].plan is not None

    record = seen["record"]
    lease = Allocation.from_record(record)
    assert (lease.team, lease.project, lease.requester) == ("nlp", "llm-ko", ALICE.id)
    # The notification rules called the incident webhook with the secret header: the lease got its host.
    assert lease.phase is Phase.ALLOCATED and lease.approved_by == "policy" and len(lease.hosts) == 1, lease
    assert {"team", "project", "phase", "requester", "request_id"} <= set(record.fields)
    assert seen["dead"] == []
    hooks = seen["hooks"]
    assert hooks[INCIDENT_WEBHOOK]["url"].endswith("/fn/incident_webhook/")
    assert hooks[IDLE_WEBHOOK]["url"].endswith("/fn/idle_alert/")
    # Applying again (a restart against the same sandbox) changes nothing.
    assert seen["again"].plan.pending == [] and seen["again"].counts()["created"] == 0
    out = seen["out"]
    summary = out[out.index("datadog setup") : out.index("ready in")]
    for label in ("incident type       1 created", "webhooks            2 created", "secret variable     1 created"):
        assert label in summary, summary
    assert "fields" in summary and "notification rules" in summary
    assert "monitors" in summary and "none (no farm" not in summary
    assert seen["leaks"] == [], seen["leaks"]


def test_function_urls_refuse_requests_until_the_setup_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    real = setup.apply_local_setup
    during: list[int] = []

    def probing(env: LocalEnv) -> setup.LocalSetup:
        during.append(_post_status(env.url + INGRESS_PATH))
        done = real(env)
        during.append(_post_status(env.url + INGRESS_PATH))  # still held: start_local opens after the setup
        return done

    monkeypatch.setattr(setup, "apply_local_setup", probing)
    with start_local(port=0, setup=True) as env:
        assert env.setup is not None and not env.setup.plan.blocked
        after = _post_status(env.url + INGRESS_PATH)
        state = env.host.state()
    assert during == [503, 503]
    # Open now: the ingress itself ran and refused the unsigned request (the held ones never reached it).
    assert after in (400, 401)
    assert [e["trigger"] for e in state["invocations"]] == ["url"]
    assert state["held"] is False


def test_no_setup_leaves_the_sandbox_without_webhooks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    seen: dict[str, Any] = {}

    def look(env: LocalEnv, farm: LocalFarm) -> None:
        seen["hooks"] = [farm.admin.get_webhook(name) for name in (INCIDENT_WEBHOOK, IDLE_WEBHOOK)]
        seen["types"] = [t["attributes"]["name"] for t in farm.admin.list_incident_types()]
        seen["rules"] = farm.admin.list_notification_rules()
        seen["setup"] = env.setup

    _run(False, look)
    out = capsys.readouterr().out
    assert seen["hooks"] == [None, None]
    assert "GPU allocation" not in seen["types"] and seen["rules"] == []
    assert seen["setup"] is None
    assert NO_SETUP in out and "created" not in out


def test_without_a_farm_configuration_the_setup_is_skipped_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # A template outside this repository: no config/farm.example.yaml beside it, so no choices for the fields.
    seen: list[LocalEnv] = []
    run_local("127.0.0.1", 0, template=OTHER_TEMPLATE, hooks=[seen.append], wait=lambda stop: None)
    out = capsys.readouterr().out
    assert setup.SKIPPED in out
    assert seen[0].setup is not None and seen[0].setup.plan is None


def test_gpufarm_local_help_names_no_setup() -> None:
    result = CliRunner().invoke(local, ["--help"])
    assert result.exit_code == 0 and "--no-setup" in result.output


def _post_status(url: str) -> int:
    request = urllib.request.Request(
        url, data=json.dumps({}).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
