"""An idle kind's window: the farm configuration admits only the windows Datadog's monitor reference documents,
refusing any other at load with the allowed values, and the monitors write each in its documented form."""

from __future__ import annotations

import pytest
from fakes import FARM_YAML

from gpufarm.core.config.farm import MONITOR_WINDOW_MINUTES, FarmConfigError, IdleKind, parse_farm
from gpufarm.setup import monitors as mon
from gpufarm_sandbox.emulator.monitor_validation import FIXED_WINDOWS, WindowGrammar, parse_monitor_query

DOCUMENTED = {
    5: "last_5m",
    10: "last_10m",
    15: "last_15m",
    30: "last_30m",
    60: "last_1h",
    120: "last_2h",
    240: "last_4h",
    1440: "last_1d",
}
ALLOWED = "use 5, 10, 15, 30, 60, 120, 240, 1440"


def farm_with(idle_yaml: str) -> str:
    return FARM_YAML.replace("idle: {grace_minutes: 60}\n", idle_yaml)


def test_every_allowed_window_maps_to_its_documented_form_and_back() -> None:
    assert tuple(DOCUMENTED) == MONITOR_WINDOW_MINUTES
    for minutes, text in DOCUMENTED.items():
        assert mon.window_text(minutes) == text
        assert text.removeprefix("last_") in FIXED_WINDOWS
        query = f"avg({text}):avg:gpufarm.gpu.utilization{{*}} by {{gpu_ir,host}} < 5"
        for grammar in WindowGrammar:
            assert parse_monitor_query(query, grammar).window_s == minutes * 60


@pytest.mark.parametrize("minutes", [0, 1, 7, 45, 59, 90, 180, 480, 2880, 10080])
def test_a_window_without_a_documented_form_has_no_text(minutes: int) -> None:
    with pytest.raises(ValueError, match=f"{minutes} minutes is not one of Datadog's documented monitor windows"):
        mon.window_text(minutes)


@pytest.mark.parametrize(
    ("idle_yaml", "path"),
    [
        ("idle: {kinds: {idle: {window_minutes: 45}}}\n", "idle.kinds.idle.window_minutes"),
        ("idle: {kinds: {low_utilization: {window_minutes: 90}}}\n", "idle.kinds.low_utilization.window_minutes"),
        (
            "idle: {environments: {hpc: {kinds: {idle_held: {window_minutes: 7}}}}}\n",
            "idle.environments.hpc.kinds.idle_held.window_minutes",
        ),
        (
            "idle: {teams: {nlp: {kinds: {idle: {window_minutes: 2880}}}}}\n",
            "idle.teams.nlp.kinds.idle.window_minutes",
        ),
        ("idle: {kinds: {idle: {window_minutes: 1}}}\n", "idle.kinds.idle.window_minutes"),
    ],
)
def test_an_undocumented_window_is_refused_at_load_with_the_allowed_values(idle_yaml: str, path: str) -> None:
    with pytest.raises(FarmConfigError) as err:
        parse_farm(farm_with(idle_yaml))
    message = str(err.value)
    assert path in message and "is not one of Datadog's documented monitor windows" in message
    assert ALLOWED in message


def test_documented_windows_load_and_reach_the_queries_in_their_documented_form() -> None:
    farm = parse_farm(
        farm_with(
            "idle:\n"
            "  kinds: {idle: {window_minutes: 30}, idle_held: {window_minutes: 240}, low_utilization: "
            "{window_minutes: 1440, threshold_percent: 5}}\n"
            "  teams: {nlp: {kinds: {idle: {window_minutes: 15}}}}\n"
        )
    )
    windows = {(m.kind, m.body["query"].split("(", 2)[1].split(")")[0]) for m in mon.desired_monitors(farm)}
    assert windows == {
        (IdleKind.IDLE, "last_30m"),
        (IdleKind.IDLE, "last_15m"),
        (IdleKind.IDLE_HELD, "last_4h"),
        (IdleKind.LOW_UTILIZATION, "last_1d"),
    }
    # The window tag and the message still say minutes: the idle webhook reads them (gpufarm.handlers.idle_alert).
    low = next(m for m in mon.desired_monitors(farm) if m.kind is IdleKind.LOW_UTILIZATION)
    assert f"{mon.WINDOW_TAG_KEY}:1440m" in low.body["tags"] and "over the last 1440 minutes" in low.body["message"]
