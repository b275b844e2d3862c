"""Monitor evaluation rules of the sandbox, in process (no sockets): per-group states, transitions, options, templates,
validation and the webhook variables Datadog sends."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug.test import Client

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.monitor_messages import render_template, webhook_mentions

KEYS = {"DD-API-KEY": DEFAULT_DD_API_KEY, "DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY}
METRIC = "gpufarm.gpu.utilization"
WINDOW = 300


class Fired(list[tuple[str, dict[str, str]]]):
    """Webhook calls the monitors made: (name, variables)."""

    def transitions(self) -> list[tuple[str, str]]:
        return [(v["ALERT_TRANSITION"], v["ALERT_SCOPE"]) for _, v in self]


@pytest.fixture
def sb() -> Iterator[Sandbox]:
    sandbox = Sandbox()
    yield sandbox
    sandbox.monitors.stop_ticker()


@pytest.fixture
def fired(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Fired:
    calls = Fired()

    def fire(name: str, variables: Any, *, origin: str) -> None:
        assert origin == "monitor"
        calls.append((name, dict(variables)))

    monkeypatch.setattr(sb.webhooks, "fire", fire)
    return calls


def call(sb: Sandbox, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    response = Client(sb).open(path, method=method, data=data, headers=KEYS)
    text = response.get_data(as_text=True)
    return response.status_code, json.loads(text) if text else None


def create(sb: Sandbox, query: str, message: str = "", **options: Any) -> dict[str, Any]:
    body = {"type": "query alert", "name": "util {{ir.name}}", "query": query, "message": message, "options": options}
    status, monitor = call(sb, "POST", "/api/v1/monitor", body)
    assert status == 200, monitor
    return dict(monitor)


def feed(sb: Sandbox, values: dict[str, float], span: float = WINDOW - 10, every: float = 15) -> None:
    """Points for each host (host tag ir:<host's ir>) from `span` seconds ago up to now."""
    now = sb.clock.now()
    series = [
        {
            "metric": METRIC,
            "type": 3,
            "points": [{"timestamp": int(now - span + i * every), "value": v} for i in range(int(span // every) + 1)],
            "resources": [{"type": "host", "name": host}],
        }
        for host, v in values.items()
    ]
    status, body = call(sb, "POST", "/api/v2/series", {"series": series})
    assert status == 202 and body == {"errors": []}


def tag(sb: Sandbox, host: str, *tags: str) -> None:
    assert call(sb, "PUT", f"/api/v1/tags/hosts/{host}", {"tags": list(tags)})[0] == 201


def step(sb: Sandbox, values: dict[str, float], **kw: Any) -> None:
    """Let the previous data age out of the window, send fresh data, and let the clock tick once."""
    sb.clock.advance(WINDOW + 10)
    feed(sb, values, **kw)
    sb.clock.advance(1)


def group_states(sb: Sandbox, monitor_id: int) -> dict[str, str]:
    status, monitor = call(sb, "GET", f"/api/v1/monitor/{monitor_id}?group_states=all")
    assert status == 200
    return {name: g["status"] for name, g in monitor["state"]["groups"].items()}


# -- templates -------------------------------------------------------------------------------------------------------


def test_render_template_sections_variables_and_matches() -> None:
    text = (
        "{{#is_alert}}{{ir.name}} idle at {{value}} (< {{threshold}}){{/is_alert}}"
        "{{^is_alert}}not alert{{#is_recovery}} - recovered{{/is_recovery}}{{/is_alert}}"
        '{{#is_match "ir.name" "ir-1"}} first{{/is_match}}{{#is_exact_match "ir.name" "ir-1"}} exact{{/is_exact_match}}'
        "{{unknown}}!"
    )
    variables = {"ir.name": "ir-12", "value": "2.5", "threshold": "5"}
    assert render_template(text, {"is_alert": True}, variables) == "ir-12 idle at 2.5 (< 5) first!"
    assert render_template(text, {"is_recovery": True}, variables) == "not alert - recovered first!"
    assert render_template(text, {}, {"ir.name": "ir-1"}) == "not alert first exact!"


def test_webhook_mentions() -> None:
    assert webhook_mentions("go @webhook-gpufarm-idle, then @webhook-ops. and @webhook-gpufarm-idle") == [
        "gpufarm-idle",
        "ops",
    ]
    assert webhook_mentions("@slack-ops only") == []


# -- evaluation ------------------------------------------------------------------------------------------------------


def test_warn_alert_and_recovery_transitions_for_an_above_monitor(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-7")
    monitor = create(
        sb,
        f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} > 90",
        "{{#is_warning}}warm @webhook-w{{/is_warning}}{{#is_alert}}hot @webhook-a{{/is_alert}}"
        "{{#is_recovery}}cool @webhook-a{{/is_recovery}}",
        thresholds={"critical": 90, "warning": 70},
    )
    for value in (80.0, 95.0, 80.0, 95.0, 10.0):
        step(sb, {"gpu-a": value})
    assert fired.transitions() == [
        ("Warn", "ir:ir-7"),
        ("Triggered", "ir:ir-7"),
        ("Re-Warn", "ir:ir-7"),
        ("Re-Triggered", "ir:ir-7"),
        ("Recovered", "ir:ir-7"),
    ]
    assert [name for name, _ in fired] == ["w", "a", "w", "a", "a"]
    cycle = {v["ALERT_CYCLE_KEY"] for _, v in fired}
    assert len(cycle) == 1  # one alert cycle from the first warning to the recovery
    assert [v["ALERT_TYPE"] for _, v in fired] == ["warning", "error", "warning", "error", "success"]
    step(sb, {"gpu-a": 99.0})
    assert fired[-1][1]["ALERT_TRANSITION"] == "Triggered" and fired[-1][1]["ALERT_CYCLE_KEY"] not in cycle
    _, monitor = call(sb, "GET", f"/api/v1/monitor/{monitor['id']}")
    assert monitor["overall_state"] == "Alert" and monitor["overall_state_modified"]


def test_alert_variables(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-3", "team:nlp")
    body = {
        "type": "metric alert",
        "name": "[gpufarm] idle {{ir.name}}",
        "query": f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5",
        "message": "{{#is_alert}}{{ir.name}} idle ({{value}} < {{threshold}}) @webhook-idle{{/is_alert}}",
        "tags": ["service:gpufarm", "team:platform"],
        "priority": 2,
        "options": {"thresholds": {"critical": 5}},
    }
    status, monitor = call(sb, "POST", "/api/v1/monitor", body)
    assert status == 200 and monitor["type"] == "query alert"
    step(sb, {"gpu-a": 1.5})
    ((name, v),) = fired
    assert name == "idle"
    assert v["ALERT_ID"] == str(monitor["id"])
    assert v["ALERT_SCOPE"] == "ir:ir-3"
    assert v["ALERT_TRANSITION"] == "Triggered"
    assert v["ALERT_TITLE"] == v["EVENT_TITLE"] == "[Triggered on {ir:ir-3}] [gpufarm] idle ir-3"
    assert v["EVENT_MSG"] == "ir-3 idle (1.5 < 5) @webhook-idle"
    assert v["ALERT_METRIC"] == METRIC
    assert v["ALERT_QUERY"] == body["query"]
    assert v["ALERT_STATUS"] == f"{METRIC} over ir:ir-3 was < 5 on average during the last 5m."
    assert v["EVENT_TYPE"] == "query_alert_monitor"
    assert v["ALERT_PRIORITY"] == "P2"
    assert v["TAGS"] == "service:gpufarm,team:platform,ir:ir-3"
    assert (v["TAGS[ir]"], v["TAGS[team]"], v["TAGS[service]"]) == ("ir-3", "platform", "gpufarm")
    assert abs(int(v["DATE"]) - sb.clock.now_ms()) < 5000
    assert v["LINK"].endswith(f"/monitors/{monitor['id']}")
    assert v["ID"] and v["AGGREG_KEY"] and v["ALERT_CYCLE_KEY"]


def test_simple_monitor_has_no_scope(sb: Sandbox, fired: Fired) -> None:
    create(sb, f"max(last_5m):sum:{METRIC}{{*}} > 100", "@webhook-ops")
    step(sb, {"h1": 60.0, "h2": 60.0})
    assert fired.transitions() == [("Triggered", "")]
    assert fired[0][1]["EVENT_TITLE"] == "[Triggered] util "


def test_recovery_threshold_holds_the_alert(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    monitor = create(
        sb,
        f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5",
        "@webhook-x",
        thresholds={"critical": 5, "critical_recovery": 8},
    )
    step(sb, {"gpu-a": 1.0})
    step(sb, {"gpu-a": 6.0})  # above critical but below the recovery threshold: still alerting
    assert group_states(sb, monitor["id"]) == {"ir:ir-1": "Alert"}
    step(sb, {"gpu-a": 9.0})
    assert fired.transitions() == [("Triggered", "ir:ir-1"), ("Recovered", "ir:ir-1")]


def test_require_full_window(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    monitor = create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-x", require_full_window=True)
    step(sb, {"gpu-a": 1.0}, span=60)
    assert fired == [] and group_states(sb, monitor["id"]) == {}
    step(sb, {"gpu-a": 1.0})
    assert fired.transitions() == [("Triggered", "ir:ir-1")]


def test_new_group_delay_skips_young_groups(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-x", new_group_delay=600)
    step(sb, {"gpu-a": 1.0})  # data began ~5 minutes ago: too young
    assert fired == []
    sb.clock.advance(320)
    feed(sb, {"gpu-a": 1.0})
    sb.clock.advance(1)  # the group's first point is now more than 10 minutes old
    assert fired.transitions() == [("Triggered", "ir:ir-1")]


def test_new_host_delay_holds_back_young_groups_that_name_a_host(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    # new_group_delay 0 but the default new_host_delay (300 s) applies to groups keyed by host.
    create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir,host}} < 5", "@webhook-x", new_group_delay=0)
    step(sb, {"gpu-a": 1.0}, span=120)
    assert fired == []
    sb.clock.advance(200)
    feed(sb, {"gpu-a": 1.0})
    sb.clock.advance(1)
    assert fired.transitions() == [("Triggered", "ir:ir-1,host:gpu-a")]


def test_notify_no_data_and_recovery_from_it(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    monitor = create(
        sb,
        f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5",
        "{{#is_no_data}}silent{{/is_no_data}} @webhook-x",
        notify_no_data=True,
    )
    step(sb, {"gpu-a": 50.0})  # first seen healthy: nothing to say
    assert fired == []
    sb.clock.advance(WINDOW + 10)  # no points in the window any more
    assert fired.transitions() == [("No Data", "ir:ir-1")]
    assert fired[0][1]["EVENT_MSG"] == "silent @webhook-x"
    assert group_states(sb, monitor["id"]) == {"ir:ir-1": "No Data"}
    step(sb, {"gpu-a": 50.0})
    assert fired.transitions()[-1] == ("Recovered", "ir:ir-1")


def test_missing_data_without_notify_keeps_state_and_resolve_policy_recovers(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    keep = create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-keep")
    resolve = create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 6", "@webhook-resolve", on_missing_data="resolve")
    step(sb, {"gpu-a": 1.0})
    sb.clock.advance(WINDOW + 10)
    assert group_states(sb, keep["id"]) == {"ir:ir-1": "Alert"}
    assert group_states(sb, resolve["id"]) == {"ir:ir-1": "OK"}
    assert [(n, v["ALERT_TRANSITION"]) for n, v in fired] == [
        ("keep", "Triggered"),
        ("resolve", "Triggered"),
        ("resolve", "Recovered"),
    ]


def test_timeout_h_resolves_a_group_that_stopped_reporting(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-x", timeout_h=1)
    step(sb, {"gpu-a": 1.0})
    sb.clock.advance(1800)  # silent for half an hour: still alerting
    assert fired.transitions() == [("Triggered", "ir:ir-1")]
    sb.clock.advance(1800)
    assert fired.transitions() == [("Triggered", "ir:ir-1"), ("Recovered", "ir:ir-1")]


def test_renotify_while_still_alerting(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    create(
        sb,
        f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5",
        "{{#is_renotify}}again {{/is_renotify}}@webhook-x",
        renotify_interval=10,
    )
    step(sb, {"gpu-a": 1.0})
    step(sb, {"gpu-a": 1.0})  # ~5 minutes later: not yet
    step(sb, {"gpu-a": 1.0})  # ~10 minutes after the first notification
    assert fired.transitions() == [("Triggered", "ir:ir-1"), ("Renotify", "ir:ir-1")]
    assert fired[-1][1]["EVENT_MSG"] == "again @webhook-x"
    assert len({v["ALERT_CYCLE_KEY"] for _, v in fired}) == 1


def test_evaluation_delay_shifts_the_window(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-x", evaluation_delay=900)
    step(sb, {"gpu-a": 1.0})
    assert fired == []  # the window ends 15 minutes ago, before any data
    sb.clock.advance(900)
    assert fired.transitions() == [("Triggered", "ir:ir-1")]


def test_evaluate_and_events_endpoints(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    tag(sb, "gpu-b", "ir:ir-2")
    first = create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-x")
    second = create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} > 50", "@webhook-y")
    feed(sb, {"gpu-a": 1.0, "gpu-b": 90.0})
    status, answer = call(sb, "POST", "/_sandbox/monitors/evaluate", {"monitor_id": first["id"]})
    assert status == 200
    assert [(e["monitor_id"], e["group"], e["transition"], e["to"]) for e in answer["events"]] == [
        (first["id"], "ir:ir-1", "Triggered", "Alert")
    ]
    assert answer["events"][0]["webhooks"] == ["x"] and answer["events"][0]["value"] == 1.0
    status, answer = call(sb, "POST", "/_sandbox/monitors/evaluate")
    assert [(e["monitor_id"], e["group"]) for e in answer["events"]] == [(second["id"], "ir:ir-2")]
    _, log = call(sb, "GET", "/_sandbox/monitors/events")
    assert len(log["events"]) == 2
    _, only = call(sb, "GET", f"/_sandbox/monitors/events?monitor_id={second['id']}")
    assert [e["monitor_id"] for e in only["events"]] == [second["id"]]
    assert call(sb, "POST", "/_sandbox/monitors/evaluate", {"monitor_id": 1})[0] == 404
    assert call(sb, "POST", "/_sandbox/monitors/evaluate", {"monitor_id": "x"})[0] == 400
    dump = sb.dump()["monitors"]
    assert dump["events"] == 2 and {m["id"] for m in dump["monitors"]} == {first["id"], second["id"]}


def test_background_ticker_evaluates_and_stops(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-x")
    feed(sb, {"gpu-a": 1.0})
    sb.monitors.start_ticker(0.02)
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    sb.monitors.stop_ticker()
    assert fired.transitions() == [("Triggered", "ir:ir-1")]
    assert sb.monitors._ticker is None


def test_webhook_errors_do_not_stop_other_notifications(sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def fire(name: str, variables: Any, *, origin: str) -> None:
        seen.append(name)
        if name == "broken":
            raise RuntimeError("boom")

    monkeypatch.setattr(sb.webhooks, "fire", fire)
    tag(sb, "gpu-a", "ir:ir-1")
    create(sb, f"avg(last_5m):avg:{METRIC}{{*}} by {{ir}} < 5", "@webhook-broken @webhook-fine")
    step(sb, {"gpu-a": 1.0})
    assert seen == ["broken", "fine"]


# -- validation ------------------------------------------------------------------------------------------------------

Q = f"avg(last_1h):avg:{METRIC}{{*}} by {{ir}} < 5"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"type": "nope", "query": Q}, "'type' is invalid"),
        ({"type": "query alert"}, "query is required"),
        ({"type": "query alert", "query": "avg(last_1h):avg:m{*}"}, "invalid operator specified: "),
        ({"type": "query alert", "query": "avg(last_1h):avg:m{ < 5"}, "Error parsing query"),
        ({"type": "query alert", "query": "change(last_1h):avg:m{*} < 5"}, "not supported by the sandbox"),
        ({"type": "query alert", "query": "avg(last_0m):avg:m{*} < 5"}, "invalid time window"),
        ({"type": "query alert", "query": "avg(last_200h):avg:m{*} < 5"}, "invalid time window"),
        ({"type": "query alert", "query": Q, "options": {"thresholds": {"critical": 4}}}, "does not match"),
        ({"type": "query alert", "query": Q, "options": {"thresholds": {"warning": 4}}}, "must be greater"),
        (
            {"type": "query alert", "query": "avg(last_5m):avg:m{*} > 90", "options": {"thresholds": {"warning": 95}}},
            "must be less",
        ),
        ({"type": "query alert", "query": Q, "options": {"thresholds": {"critical_recovery": 3}}}, "recovery"),
        (
            {"type": "query alert", "query": Q, "options": {"thresholds": {"warning": 10, "warning_recovery": 9}}},
            "Warning recovery",
        ),
        ({"type": "query alert", "query": Q, "options": {"thresholds": {"critical": "5"}}}, "thresholds.critical"),
        ({"type": "query alert", "query": Q, "options": {"renotify_interval": -1}}, "renotify_interval"),
        ({"type": "query alert", "query": Q, "options": {"notify_no_data": "yes"}}, "notify_no_data"),
        ({"type": "query alert", "query": Q, "options": {"on_missing_data": "panic"}}, "on_missing_data"),
        ({"type": "query alert", "query": Q, "options": {"renotify_statuses": ["ok"]}}, "renotify_statuses"),
        ({"type": "query alert", "query": Q, "options": []}, "'options' is invalid"),
        ({"type": "query alert", "query": Q, "tags": "a:b"}, "'tags' is invalid"),
        ({"type": "query alert", "query": Q, "priority": 9}, "'priority' is invalid"),
        ({"type": "log alert", "query": "query"}, "invalid operator specified: "),
    ],
)
def test_invalid_monitors_are_400_on_create_and_validate(sb: Sandbox, body: dict[str, Any], fragment: str) -> None:
    for path in ("/api/v1/monitor", "/api/v1/monitor/validate"):
        status, answer = call(sb, "POST", path, body)
        assert status == 400, answer
        assert fragment in answer["errors"][0]
    assert sb.dump()["monitors"]["monitors"] == []


def test_valid_monitor_validates_to_empty_object(sb: Sandbox) -> None:
    body = {"type": "query alert", "query": Q, "options": {"thresholds": {"critical": 5, "warning": 10}}}
    assert call(sb, "POST", "/api/v1/monitor/validate", body) == (200, {})
    assert call(sb, "POST", "/api/v1/monitor/validate", {"type": "composite", "query": "1 && 2"}) == (200, {})


def test_update_rules(sb: Sandbox, fired: Fired) -> None:
    tag(sb, "gpu-a", "ir:ir-1")
    monitor = create(sb, Q, "@webhook-x", renotify_interval=30)
    step(sb, {"gpu-a": 1.0})
    assert group_states(sb, monitor["id"]) == {"ir:ir-1": "Alert"}
    status, updated = call(sb, "PUT", f"/api/v1/monitor/{monitor['id']}", {"name": "renamed"})
    assert status == 200 and updated["name"] == "renamed"
    assert updated["options"]["renotify_interval"] == 30  # options not sent are kept
    assert group_states(sb, monitor["id"]) == {"ir:ir-1": "Alert"}  # same query: states kept
    lower = Q.replace("< 5", "< 3")
    status, answer = call(sb, "PUT", f"/api/v1/monitor/{monitor['id']}", {"query": lower})
    assert status == 400 and "does not match" in answer["errors"][0]  # the kept threshold must follow the query
    status, updated = call(
        sb, "PUT", f"/api/v1/monitor/{monitor['id']}", {"query": lower, "options": {"thresholds": {"critical": 3}}}
    )
    assert status == 200 and updated["options"]["thresholds"] == {"critical": 3.0}
    assert "renotify_interval" not in updated["options"]  # options sent replace the old ones as a whole
    assert group_states(sb, monitor["id"]) == {}  # a new query starts over
    assert call(sb, "PUT", f"/api/v1/monitor/{monitor['id']}", {"type": "log alert"})[0] == 400
    assert call(sb, "PUT", f"/api/v1/monitor/{monitor['id']}", {"type": "metric alert"})[0] == 200
    assert call(sb, "PUT", f"/api/v1/monitor/{monitor['id']}", {"query": "avg(last_1h):avg:m{*}"})[0] == 400
