"""SnapStart hooks: handed to the Lambda runtime's snapshot_restore_py when present, run in order either way."""

from __future__ import annotations

import random
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpufarm.adapters import aws
from gpufarm.config import Settings
from gpufarm.handlers import runtime, snapstart


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Callable[[], None]]]]:
    """An empty hook registry and a stand-in for the runtime's snapshot_restore_py."""
    handed: dict[str, list[Callable[[], None]]] = {"before": [], "after": []}
    library = types.ModuleType("snapshot_restore_py")
    library.register_before_snapshot = handed["before"].append  # type: ignore[attr-defined]
    library.register_after_restore = handed["after"].append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", library)
    monkeypatch.setattr(snapstart, "_before", [])
    monkeypatch.setattr(snapstart, "_after", [])
    monkeypatch.setattr(snapstart, "_registered_with_runtime", False)
    yield handed


def test_hooks_are_handed_to_the_runtime_once_and_run_in_registration_order(
    fresh: dict[str, list[Callable[[], None]]],
) -> None:
    ran: list[str] = []
    first, second = (lambda: ran.append("first")), (lambda: ran.append("second"))
    snapstart.register(before_snapshot=first, after_restore=second)
    snapstart.register(before_snapshot=second, after_restore=first)
    snapstart.register(before_snapshot=first)
    assert fresh == {"before": [snapstart.run_before_snapshot], "after": [snapstart.run_after_restore]}
    fresh["before"][0]()
    fresh["after"][0]()
    assert ran == ["first", "second", "second", "first"]


def test_without_the_library_the_hooks_still_run_on_demand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)
    monkeypatch.setattr(snapstart, "_before", [])
    monkeypatch.setattr(snapstart, "_after", [])
    monkeypatch.setattr(snapstart, "_registered_with_runtime", False)
    ran: list[str] = []
    snapstart.register(before_snapshot=lambda: ran.append("before"))
    snapstart.run_before_snapshot()
    assert ran == ["before"]


def test_after_restore_forgets_configuration_runtime_and_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    runtime.reset()
    aws._cache["/gpufarm/farm"] = ("gpu_models: {}", 0.0)
    built = runtime.current()
    client = aws.aws_client("ssm", Settings())
    closed: list[bool] = []
    monkeypatch.setattr(client._endpoint.http_session, "close", lambda: closed.append(True))
    random.seed(7)
    drawn_before = random.random()
    random.seed(7)

    runtime.after_restore()

    assert aws._cache == {}
    assert closed
    assert runtime.current() is not built
    assert random.random() != drawn_before, "every restored container must not draw the same jitter"
    runtime.reset()


FARM = (Path(__file__).resolve().parents[2] / "config" / "farm.example.yaml").read_text(encoding="utf-8")


def test_a_farm_whose_text_is_unchanged_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufarm.core.config.farm import FarmConfigError

    monkeypatch.setattr(runtime, "_last_farm", None)
    first = runtime.parsed_farm(FARM)
    assert runtime.parsed_farm(FARM) is first, "the same text: the farm parsed before (in the snapshot) serves"
    edited = FARM.replace("duration_days: 7", "duration_days: 6", 1)
    assert edited != FARM
    changed = runtime.parsed_farm(edited)
    assert changed is not first and changed.defaults.duration_days == 6
    with pytest.raises(FarmConfigError):
        runtime.parsed_farm("gpu_models: [")
    assert runtime.parsed_farm(edited) is changed, "an invalid text replaces nothing"


def test_before_the_snapshot_an_unreadable_farm_is_left_to_the_first_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufarm.config import ConfigurationMissing

    def unreadable(settings: Settings) -> str:
        aws._cache["/gpufarm/farm"] = ("read", 0.0)
        raise ConfigurationMissing("SSM parameter /gpufarm/farm does not exist or this function may not read it")

    monkeypatch.setattr(runtime, "_last_farm", None)
    monkeypatch.setattr(aws, "load_farm_text", unreadable)
    runtime._parse_farm_before_snapshot(Settings())
    assert runtime._last_farm is None
    assert aws._cache == {}, "no parameter value stays in the snapshot"
