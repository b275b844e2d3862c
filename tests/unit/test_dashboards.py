"""gpufarm's dashboards as code: every widget reads through datadog-api-client's models; every metric a widget
queries is declared (the node agent's spec/metrics.yaml, or a gauge the sync publishes) with the tags the query
filters, groups and templates by; the shipped spec copy matches spec/metrics.yaml; plans create, keep, restore drift
and prune only what carries gpufarm's marker; metric metadata is planned from the spec."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents, FakeMetrics

from gpufarm.core.config.farm import parse_farm
from gpufarm.core.inventory.ledger_gauges import LEDGER_GAUGES
from gpufarm.core.kernel import hosts as host_tags
from gpufarm.core.service import GpuFarm
from gpufarm.core.sync.gauges import publish_gauges
from gpufarm.setup import dashboards as dash
from gpufarm.setup.changes import Action
from gpufarm.setup.dashboards_widgets import walk
from gpufarm_sandbox.emulator.metric_metadata import METRIC_TYPES, UNITS
from gpufarm_sandbox.emulator.query import parse_query

ROOT = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "spec" / "metrics.yaml").read_text())
EXAMPLE = (ROOT / "config" / "farm.example.yaml").read_text()
FARMS = {"unit": FARM_YAML, "example": EXAMPLE}
# Tags Datadog stamps on every point from the host: its name, gpufarm's host tags and a lease's allocation tags.
# (The tests' secret scan takes module constants named *_KEY for secrets: these key names stay in `inventory`.)
HOST_TAG_KEYS = frozenset(
    {"host", host_tags.MANAGED_TAG.split(":")[0], host_tags.ENVIRONMENT_KEY, host_tags.TEAM_KEY}
    | {host_tags.PROJECT_KEY, host_tags.IR_KEY}
)
_TERM = re.compile(r"!?([a-z_]+):[A-Za-z0-9_.\-*]+|([a-z_]+) (?:NOT )?IN \(")


@pytest.fixture(scope="module")
def wanted() -> dict[str, list[dash.DashboardSpec]]:
    return {name: dash.desired_dashboards(parse_farm(text)) for name, text in FARMS.items()}


def _runtime_gauges() -> dict[str, set[str]]:
    """Every gauge the scheduled sync publishes, with its tag keys: what it sends for an in-memory farm, and the
    ledger gauges gpufarm.core.inventory.sources declares."""
    clock = FakeClock()
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc", "a")
    hosts.seed("slice-1", "A100", 8, "slices", "k8s")
    metrics = FakeMetrics()
    svc = GpuFarm(
        incidents=FakeIncidents(clock),
        hosts=hosts,
        chat=FakeChat(operators=frozenset()),
        clock=clock,
        farm=parse_farm(FARM_YAML),
        metrics=metrics,
    )
    assert publish_gauges(svc.context) > 0
    out: dict[str, set[str]] = {}
    for series in metrics.series:
        out.setdefault(series.metric, set()).update(t.split(":", 1)[0] for t in series.tags)
    # The ledger's gauges, as their declarations name them (a farm without cloud sources publishes only some).
    for gauge in LEDGER_GAUGES:
        out.setdefault(gauge.name, set()).update(gauge.tags)
    return out


def _declared_tags(metric: str) -> set[str]:
    tags = {**SPEC["metrics"], **SPEC["profile_metrics"], **SPEC["lifecycle_metrics"]}[metric]["tags"]
    out: set[str] = set()
    for name in [*tags.get("required", []), *tags.get("optional", [])]:
        out.update(SPEC["tagsets"].get(name, [name]))
    return out


def _prefixes(body: dict[str, Any]) -> dict[str, str]:
    return {f"${v['name']}": str(v["prefix"]) for v in body.get("template_variables") or []}


def test_the_farm_gets_five_dashboards_each_marked_as_gpufarms(wanted: dict[str, list[dash.DashboardSpec]]) -> None:
    for specs in wanted.values():
        assert [s.key for s in specs] == ["farm-overview", "project", "node", "slicing", "quota-ledger"]
        for spec in specs:
            assert dash.dashboard_key(spec.body) == spec.key
            assert spec.body["layout_type"] == "ordered" and spec.body["title"].startswith("gpufarm: ")
        assert len({s.body["title"] for s in specs}) == 5


def test_every_widget_reads_through_the_client_models_with_nothing_unparsed(
    wanted: dict[str, list[dash.DashboardSpec]],
) -> None:
    types = set()
    for specs in wanted.values():
        for spec in specs:
            # desired_dashboards validated them already; this reads its (cached) answer for the same JSON.
            assert dash.model_problem(json.dumps(spec.body, sort_keys=True)) is None
            types |= {w["definition"]["type"] for w in walk(spec.body["widgets"])}
    assert types == {"note", "group", "timeseries", "query_value", "toplist", "query_table"}


def test_a_widget_the_models_refuse_is_refused_before_anything_is_sent(
    wanted: dict[str, list[dash.DashboardSpec]],
) -> None:
    body = copy.deepcopy(wanted["unit"][0].body)
    body["widgets"][1]["definition"]["type"] = "sparkle_chart"
    with pytest.raises(dash.ValidationFailed, match="is not valid"):
        dash.validated(body)


@pytest.mark.parametrize("farm", sorted(FARMS))
def test_every_queried_metric_is_declared_with_the_tags_the_query_uses(
    farm: str, wanted: dict[str, list[dash.DashboardSpec]]
) -> None:
    gauges = _runtime_gauges()
    assert {"gpufarm.quota.entitled", "gpufarm.inventory.gpus.free"} <= set(gauges)
    checked = 0
    for spec in wanted[farm]:
        prefixes = _prefixes(spec.body)
        for text in dash.widget_queries(spec.body):
            used = {prefixes[v] for v in re.findall(r"\$[a-z_]+", text)}
            concrete = re.sub(r",?\$[a-z_]+", "", text).replace("{,", "{").replace("{}", "{*}")
            query = parse_query(concrete)  # the sandbox's parser, as the local pages run it
            used |= {a or b for a, b in _TERM.findall(query.scope)} | set(query.group_by)
            if query.metric in {**SPEC["metrics"], **SPEC["profile_metrics"], **SPEC["lifecycle_metrics"]}:
                declared = _declared_tags(query.metric)
            else:
                assert query.metric in gauges, f"{query.metric} is neither in spec/metrics.yaml nor published"
                declared = gauges[query.metric]
            missing = used - declared - (HOST_TAG_KEYS if query.metric in SPEC["metrics"] else set())
            assert not missing, f"{spec.key}: {query.metric} carries no {sorted(missing)} ({text})"
            checked += 1
    assert checked > 60


def test_template_variables_use_tag_keys_and_the_lease_one_is_exact_per_device(
    wanted: dict[str, list[dash.DashboardSpec]],
) -> None:
    by_key = {s.key: s.body for s in wanted["unit"]}
    project = {v["name"]: v for v in by_key["project"]["template_variables"]}
    assert set(project) == {"team", "project", "ir"}
    assert project["ir"]["prefix"] == "gpu_ir" and project["team"]["available_values"] == ["nlp", "vision"]
    overview = {v["name"]: v for v in by_key["farm-overview"]["template_variables"]}
    assert overview["environment"]["available_values"] == ["cloud", "hpc", "slices"]
    assert overview["gpu_model"]["available_values"] == ["a100", "h100", "l4"]
    # One group per environment of the farm.
    groups = [
        w["definition"]["title"] for w in by_key["farm-overview"]["widgets"] if w["definition"]["type"] == "group"
    ]
    assert [g.split()[0] for g in groups] == ["cloud", "hpc", "slices"]
    assert "slices" in str(by_key["slicing"]["widgets"][0]["definition"]["content"])


def test_the_shipped_metric_spec_is_spec_metrics_yaml() -> None:
    shipped = ROOT / "layers" / "gpufarm" / "gpufarm" / "setup" / dash.SPEC_RESOURCE
    assert shipped.read_text() == (ROOT / "spec" / "metrics.yaml").read_text(), "copy spec/metrics.yaml over it"


def test_metadata_covers_every_declared_metric_in_datadog_units() -> None:
    metadata = dash.desired_metadata()
    sections = ("metrics", "lifecycle_metrics", "profile_metrics", "enforce_metrics")
    assert set(metadata) == {name for section in sections for name in SPEC[section]}
    for name, body in metadata.items():
        assert body["type"] in METRIC_TYPES and body["description"]
        assert body.get("unit") is None or body["unit"] in UNITS, name
        assert body.get("per_unit") is None or body["per_unit"] in UNITS, name
    assert metadata["gpufarm.gpu.pcie.tx_throughput"] == {
        "type": "gauge",
        "unit": "kibibyte",
        "per_unit": "second",
        "description": "PCIe transmit throughput, a rate (only with --pcie)",
    }
    assert "unit" not in metadata["gpufarm.gpu.unhealthy"]
    # Profiler runs' summaries get their units too (the project dashboard's table of runs shows them).
    assert metadata["gpufarm.profile.step_time.mean"]["unit"] == "millisecond"


# -- planning ---------------------------------------------------------------------------------------------------


def _stored(spec: dash.DashboardSpec, dashboard_id: str) -> dict[str, Any]:
    """The dashboard as Datadog answers it: server keys added, every widget with an id, defaults filled in."""
    body = copy.deepcopy(spec.body)
    for i, widget in enumerate(walk(body["widgets"])):
        widget["id"] = 1000 + i
    body.update(id=dashboard_id, url=f"/dashboard/{dashboard_id}", created_at=dashboard_id, is_read_only=False)
    body["notify_list"] = None
    return body


def test_a_fresh_org_gets_five_creates_and_a_second_plan_is_unchanged(
    wanted: dict[str, list[dash.DashboardSpec]],
) -> None:
    specs = wanted["unit"]
    fresh = dash.plan_dashboards([], specs, prune=False)
    assert [c.action for c in fresh] == [Action.CREATE] * 5
    stored = [_stored(s, f"abc-def-{i:03d}") for i, s in enumerate(specs)]
    again = dash.plan_dashboards(stored, specs, prune=False)
    assert [c.action for c in again] == [Action.UNCHANGED] * 5
    assert [c.target_id for c in again] == [d["id"] for d in stored]


def test_a_hand_edit_is_drift_that_apply_restores(wanted: dict[str, list[dash.DashboardSpec]]) -> None:
    specs = wanted["unit"]
    stored = [_stored(s, f"abc-def-{i:03d}") for i, s in enumerate(specs)]
    stored[1]["widgets"][5]["definition"]["requests"][0]["queries"][0]["query"] = "avg:system.load.1{*}"
    stored[2]["title"] = "my node board"
    stored[3]["widgets"].pop()
    changes = {c.name: c for c in dash.plan_dashboards(stored, specs, prune=False)}
    project = changes["gpufarm: project"]
    assert project.action is Action.UPDATE
    assert project.differences == ("widget 6 (GPUs and MIG slices held, busy and idle)",)
    assert "drift" in project.detail and project.body == specs[1].body
    assert changes["gpufarm: node, device, process"].differences == ("title",)
    assert changes["gpufarm: GPU slicing"].differences[0].startswith("widgets (5 there, 6 defined)")
    assert changes["gpufarm: farm overview"].action is Action.UNCHANGED


def test_only_marked_dashboards_are_pruned_and_only_with_prune(wanted: dict[str, list[dash.DashboardSpec]]) -> None:
    specs = wanted["unit"]
    stored = [_stored(s, f"abc-def-{i:03d}") for i, s in enumerate(specs)]
    old = copy.deepcopy(stored[0])
    old.update(id="old-das-hbd", title="gpufarm: old board", description=f"gone {dash.marker('old-board')}")
    twin = copy.deepcopy(stored[1])
    twin.update(id="twi-nnn-000", created_at="zzz")
    foreign = {"id": "not-our-s00", "title": "gpufarm: project", "description": "someone's own", "widgets": []}
    current = [*stored, old, twin, foreign]
    kept = dash.plan_dashboards(current, specs, prune=False)
    assert [c.action for c in kept].count(Action.DELETE) == 0
    assert any("--prune deletes it" in c.detail for c in kept if c.target_id == "old-das-hbd")
    pruned = dash.plan_dashboards(current, specs, prune=True)
    deleted = {c.target_id for c in pruned if c.action is Action.DELETE}
    assert deleted == {"old-das-hbd", "twi-nnn-000"}
    assert all(c.target_id != "not-our-s00" for c in pruned)


def test_metadata_plan_creates_updates_and_keeps() -> None:
    wanted = {
        "gpufarm.gpu.temperature": {"type": "gauge", "unit": "degree celsius", "description": "GPU core temperature"},
        "gpufarm.gpu.energy": {"type": "count", "unit": "joule", "description": "energy"},
        "gpufarm.node.gpus": {"type": "gauge", "unit": "device", "description": "physical GPUs"},
    }
    current = {
        "gpufarm.gpu.temperature": None,
        "gpufarm.gpu.energy": {"type": "gauge", "unit": None, "per_unit": None, "description": None},
        "gpufarm.node.gpus": {**wanted["gpufarm.node.gpus"], "per_unit": None, "integration": None},
    }
    changes = {c.name: c for c in dash.plan_metadata(current, wanted)}
    assert changes["gpufarm.gpu.temperature"].action is Action.CREATE
    assert changes["gpufarm.gpu.temperature"].detail == "gauge, degree celsius"
    assert changes["gpufarm.gpu.energy"].differences == ("type", "unit", "description")
    assert changes["gpufarm.node.gpus"].action is Action.UNCHANGED


def test_the_project_dashboard_embeds_each_teams_newest_profiler_run_when_pages_are_configured() -> None:
    farm = parse_farm(EXAMPLE)
    links = {team: f"https://pages.example.test/profiles/latest/{team}?expires=1&sig=ab" for team in farm.teams}
    plain = {d.key: d.body for d in dash.desired_dashboards(farm)}
    embedded = {d.key: d.body for d in dash.desired_dashboards(farm, links)}
    frames = [w for w in walk(embedded["project"]["widgets"]) if w["definition"]["type"] == "iframe"]
    assert sorted(w["definition"]["url"] for w in frames) == sorted(links.values())
    assert not [w for w in walk(plain["project"]["widgets"]) if w["definition"]["type"] == "iframe"]
    assert {k: v for k, v in embedded.items() if k != "project"} == {k: v for k, v in plain.items() if k != "project"}
