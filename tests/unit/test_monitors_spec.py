"""The idle monitors generated from the policy: every metric they query is one the node agent declares in
spec/metrics.yaml with the tags the query filters and groups by; they read through datadog-api-client's models;
their messages notify the idle webhook with what it parses; groups follow the overrides; plans are idempotent."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes import FARM_YAML
from werkzeug.test import Client

from gpufarm.core.config.farm import IdleKind, parse_farm
from gpufarm.core.kernel.hosts import MANAGED_TAG
from gpufarm.handlers.idle_alert import IdleAlert
from gpufarm.setup import monitors as mon
from gpufarm.setup.changes import Action
from gpufarm.setup.webhooks import IDLE_HANDLE
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.monitor_messages import render_template
from gpufarm_sandbox.emulator.monitor_validation import parse_monitor_query

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "spec" / "metrics.yaml").read_text())
EXAMPLE = (ROOT / "config" / "farm.example.yaml").read_text()
OVERRIDES = FARM_YAML.replace(
    "idle: {grace_minutes: 60}\n",
    """idle:
  environments:
    slices: {kinds: {low_utilization: {threshold_percent: 12}}}
  teams:
    vision: {startup_grace_minutes: 5, kinds: {idle_held: {enabled: false}}}
""",
)
FARMS = {"unit": FARM_YAML, "example": EXAMPLE, "overrides": OVERRIDES}
_QUERY = re.compile(r"^(?P<time>[a-z]+)\(last_(?P<window>\d+[mhd])\):(?P<space>[a-z]+):(?P<metric>[a-z_.]+)"
                    r"\{(?P<scope>[^}]*)\} by \{(?P<by>[^}]*)\} (?P<op>[<>=]+) (?P<threshold>[0-9.]+)$")  # fmt: skip


def _monitors(name: str) -> list[mon.IdleMonitor]:
    return mon.desired_monitors(parse_farm(FARMS[name]))


def _declared_tags(metric: str) -> set[str]:
    tags = SPEC["metrics"][metric]["tags"]
    out: set[str] = set()
    for name in [*tags.get("required", []), *tags.get("optional", [])]:
        out.update(SPEC["tagsets"].get(name, [name]))
    return out


def _scope_terms(scope: str) -> list[tuple[str, str | None]]:
    """(key, value) of every tag term in a scope; value None for `key IN (...)` terms."""
    terms: list[tuple[str, str | None]] = []
    for match in re.finditer(r"!?([a-z_]+):([a-z0-9_.\-]+)|([a-z_]+) (?:NOT )?IN \(", scope):
        if match.group(1):
            terms.append((match.group(1), match.group(2)))
        else:
            terms.append((match.group(3), None))
    return terms


@pytest.mark.parametrize("farm", sorted(FARMS))
def test_every_queried_metric_and_tag_is_declared_in_the_agent_spec(farm: str) -> None:
    for monitor in _monitors(farm):
        m = _QUERY.match(monitor.body["query"])
        assert m, monitor.body["query"]
        metric = m.group("metric")
        assert metric in SPEC["metrics"], f"{metric} is not in spec/metrics.yaml"
        assert metric == mon.METRICS[monitor.kind]
        declared = _declared_tags(metric)
        keys = [k for k, _ in _scope_terms(m.group("scope"))] + m.group("by").split(",")
        for key in keys:
            if key in mon.HOST_TAG_KEYS:
                continue  # host tags Datadog stamps on every point of the host
            assert key in declared, f"{metric} carries no {key} tag (spec/metrics.yaml)"
        for key, value in _scope_terms(m.group("scope")):
            if value is not None and key in SPEC["tags"] and value != "none":
                assert re.match(SPEC["tags"][key]["value"], value), (key, value)
        # Grouped by the exact per-device lease tag and the host, so one idle host of a lease alerts alone.
        assert m.group("by").split(",")[:2] == [mon.LEASE_KEY, mon.HOST_KEY]
        assert "mig" not in SPEC["metrics"][metric]["device_modes"] or metric != "gpufarm.gpu.utilization"


@pytest.mark.parametrize("farm", sorted(FARMS))
def test_every_monitor_reads_through_the_client_models_and_the_sandbox_parser(farm: str) -> None:
    for monitor in _monitors(farm):
        model = mon.validated(monitor.body)
        assert model.query == monitor.body["query"] and model.options.new_group_delay is not None
        parsed = parse_monitor_query(monitor.body["query"])
        assert parsed.threshold == monitor.body["options"]["thresholds"]["critical"]
        assert MANAGED_TAG in monitor.body["tags"] and len(monitor.body["name"]) <= 200
        assert all(len(t) <= 200 for t in monitor.body["tags"])


def test_the_unit_farm_gets_one_monitor_per_kind_per_pool_kind() -> None:
    monitors = _monitors("unit")
    assert [m.kind for m in monitors] == [k for k in IdleKind for _ in range(2)]
    by = {m.body["query"].split(" by ")[1].split("}")[0] + "}" for m in monitors}
    assert by == {"{gpu_ir,host}", "{gpu_ir,host,gpu_uuid}"}
    dedicated = next(m for m in monitors if m.kind is IdleKind.IDLE and "gpu_uuid" not in m.body["query"])
    assert "environment IN (cloud, hpc)" in dedicated.body["query"] and "team" not in dedicated.body["query"]
    low = next(m for m in monitors if m.kind is IdleKind.LOW_UTILIZATION)
    assert low.body["query"].startswith("avg(last_2h):avg:gpufarm.gpu.utilization{")
    assert low.body["query"].endswith("< 5") and low.body["options"]["thresholds"] == {"critical": 5.0}
    # The start-up grace (30 min) is shorter than the two-hour window: a fresh lease waits one whole window.
    assert low.body["options"]["new_group_delay"] == 7200 and low.body["options"]["renotify_interval"] == 60
    idle = next(m for m in monitors if m.kind is IdleKind.IDLE)
    assert idle.body["options"]["new_group_delay"] == 3600 and not idle.body["options"]["require_full_window"]


def test_overrides_split_the_groups_and_every_series_lands_in_exactly_one() -> None:
    monitors = _monitors("overrides")
    parsed = {m.key: (m, parse_monitor_query(m.body["query"])) for m in monitors}
    for env in ("hpc", "cloud", "slices"):
        for team in ("nlp", "vision", "speech"):
            tags = frozenset({MANAGED_TAG, "gpu_ir:ir-1", f"environment:{env}", f"team:{team}", "state:idle_held"})
            for kind in IdleKind:
                hits = [m for m, q in parsed.values() if m.kind is kind and q.metric.matches(tags)]
                enabled = kind is not IdleKind.IDLE_HELD or team != "vision"
                assert len(hits) == (1 if enabled else 0), (env, team, kind, [m.body["name"] for m in hits])
    slices_low = [m for m in monitors if m.kind is IdleKind.LOW_UTILIZATION and "< 12" in m.body["query"]]
    # vision's start-up grace (5 min) differs, but both are shorter than the two-hour window, which decides: one
    # monitor, judged only once a fresh lease has a whole window of data.
    assert len(slices_low) == 1
    assert {m.body["options"]["new_group_delay"] for m in slices_low} == {7200}
    # Nothing unattributed, nothing off gpufarm's hosts.
    stray = frozenset({"gpu_ir:none", "environment:hpc", MANAGED_TAG, "team:nlp"})
    assert not any(q.metric.matches(stray) for _, q in parsed.values())


def test_the_message_notifies_the_idle_webhook_with_what_the_handler_reads() -> None:
    for monitor in _monitors("unit"):
        message = str(monitor.body["message"])
        variables = {"gpu_ir.name": "ir-12", "host.name": "gpu-a-01", "gpu_uuid.name": "gpu-x", "value": "0.25"}
        alert = render_template(message, {"is_alert": True}, variables)
        recovery = render_template(message, {"is_recovery": True}, variables)
        assert IDLE_HANDLE in alert and IDLE_HANDLE in recovery and "busy again" in recovery
        body = {
            "alert_transition": "Triggered",
            "alert_scope": "gpu_ir:ir-12,host:gpu-a-01",
            "tags": ",".join(monitor.body["tags"]),
            "message": alert,
        }
        scope = IdleAlert.model_validate(body).idle_scope()
        window = parse_monitor_query(monitor.body["query"]).window_s // 60
        assert (scope.kind, scope.value, scope.window_minutes) == (monitor.kind.value, 0.25, window)


def test_keys_are_stable_and_a_threshold_change_keeps_the_key() -> None:
    first = {m.key: m for m in _monitors("unit")}
    assert {m.key for m in _monitors("unit")} == set(first)
    tuned = mon.desired_monitors(
        parse_farm(
            FARM_YAML.replace("idle: {grace_minutes: 60}", "idle: {kinds: {low_utilization: {threshold_percent: 9}}}")
        )
    )
    assert {m.key for m in tuned} == set(first)
    assert len({m.key for m in tuned}) == len(tuned)


def _stored(monitor: mon.IdleMonitor, mid: int) -> dict[str, Any]:
    """The monitor as Datadog answers it: an id, `metric alert` read back as query alert, defaults added."""
    body = dict(monitor.body)
    options = {**body["options"], "new_host_delay": 300, "silenced": {}, "notify_audit": False}
    return {**body, "id": mid, "options": options, "overall_state": "No Data", "tags": list(reversed(body["tags"]))}


def test_plan_is_idempotent_updates_in_place_and_prunes_only_when_asked() -> None:
    wanted = _monitors("unit")
    assert {c.action for c in mon.plan_monitors([], wanted, prune=False)} == {Action.CREATE}
    stored = [_stored(m, 100 + i) for i, m in enumerate(wanted)]
    foreign = {"id": 5, "name": "someone's", "tags": ["team:x"], "query": "q", "options": {}}
    assert {c.action for c in mon.plan_monitors([*stored, foreign], wanted, prune=True)} == {Action.UNCHANGED}
    changed = [*stored]
    changed[0] = {**changed[0], "options": {**changed[0]["options"], "new_group_delay": 60}}
    plan = mon.plan_monitors(changed, wanted, prune=False)
    update = next(c for c in plan if c.action is Action.UPDATE)
    assert update.differences == ("options.new_group_delay",) and update.target_id == "100"
    dropped = wanted[1:]
    kept = mon.plan_monitors(stored, dropped, prune=False)
    assert [c.action for c in kept if c.target_id == "100"] == [Action.UNCHANGED]
    pruned = mon.plan_monitors(stored, dropped, prune=True)
    assert [(c.action, c.target_id) for c in pruned if c.action is Action.DELETE] == [(Action.DELETE, "100")]
    twins = mon.plan_monitors([*stored, {**stored[0], "id": 999}], wanted, prune=True)
    assert [(c.action, c.target_id) for c in twins if c.action is Action.DELETE] == [(Action.DELETE, "999")]


# -- evaluated on the sandbox clock: idle onset to Triggered, per kind ----------------------------------------

_KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY, "Content-Type": "application/json"}
# Each host's GPU after the onset: no process; memory held with no activity; a process at 3 %; still working.
_AFTER = {"h-idle": (0.0, 0.0, "idle"), "h-held": (0.0, 1.0, "idle_held"), "h-low": (3.0, 1.0, "busy")}
_AFTER["h-busy"] = (90.0, 1.0, "busy")


def _points(sb: Sandbox, host: str, idle: bool) -> list[dict[str, Any]]:
    util, processes, state = _AFTER[host] if idle else (90.0, 1.0, "busy")
    uuid = f"gpu-{sorted(_AFTER).index(host):08x}-0000-4000-8000-000000000000"
    tags = ["environment:hpc", "gpu_ir:ir-5", "ir:ir-5", f"gpu_uuid:{uuid}", "gpu_index:0", "gpu_model:h100"]
    values = [("gpufarm.gpu.utilization", util, []), ("gpufarm.gpu.processes", processes, [])]
    values += [("gpufarm.gpu.idle_state", float(s == state), [f"state:{s}"]) for s in ("busy", "idle", "idle_held")]
    now = int(sb.clock.now())
    resources = [{"type": "host", "name": host}]
    return [
        {"metric": m, "type": 3, "points": [{"timestamp": now, "value": v}], "resources": resources,
         "tags": [*tags, "gpu_slicing_mode:none", *extra]}
        for m, v, extra in values
    ]  # fmt: skip


@pytest.mark.slow
def test_each_kind_triggers_within_its_window_and_one_evaluation_of_the_onset() -> None:
    sb = Sandbox()
    fired: list[tuple[float, dict[str, str]]] = []
    sb.webhooks.fire = lambda name, variables, *, origin: fired.append((sb.clock.now(), dict(variables)))  # type: ignore[method-assign]
    client = Client(sb)

    def post(path: str, body: Any) -> int:
        return client.open(path, method="POST", data=json.dumps(body).encode(), headers=_KEYS).status_code

    for monitor in _monitors("unit"):
        assert post("/api/v1/monitor", dict(monitor.body)) == 200
    for host in _AFTER:
        assert post(f"/api/v1/tags/hosts/{host}", {"tags": [MANAGED_TAG, "environment:hpc", "ir:ir-5"]}) == 201
    busy_minutes, idle_minutes = 120, 122
    start = sb.clock.now()
    for minute in range(busy_minutes + idle_minutes):
        assert post("/api/v2/series", {"series": [p for h in _AFTER for p in _points(sb, h, minute >= busy_minutes)]})
        sb.clock.advance(60)
    onset = start + busy_minutes * 60
    first: dict[tuple[str, str], int] = {}
    for at, variables in fired:
        kind = next(t.split(":", 1)[1] for t in variables["TAGS"].split(",") if t.startswith("gpufarm_idle_kind:"))
        host = variables["ALERT_SCOPE"].split("host:")[1]
        if variables["ALERT_TRANSITION"] == "Triggered":
            first.setdefault((host, kind), round((at - onset) / 60))  # the sandbox clock also runs in real time
    # No process: the last busy point leaves the 60-minute window; idle-held likewise; the 2-hour mean of a GPU
    # that was at 90 % falls under 5 % after 113 minutes (at 3 % after 117). The busy host never alerts.
    assert first == {
        ("h-idle", "idle"): 59,
        ("h-held", "idle_held"): 59,
        ("h-idle", "low_utilization"): 113,
        ("h-held", "low_utilization"): 113,
        ("h-low", "low_utilization"): 117,
    }
    windows = {"idle": 60, "idle_held": 60, "low_utilization": 120}
    assert all(minutes <= windows[kind] + 1 for (_, kind), minutes in first.items())
