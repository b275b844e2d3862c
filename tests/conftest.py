"""Shared fixtures: a sandbox on a free loopback port, and clients pointed at it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import secret_scan

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, DEFAULT_SLACK_TOKEN, Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

FIXTURES = Path(__file__).parent / "fixtures"
EVENTS = Path(__file__).resolve().parent.parent / "events"


def load_fixture(relative: str) -> Any:
    """A JSON fixture under tests/fixtures."""
    return json.loads((FIXTURES / relative).read_text())


def load_event(name: str) -> Any:
    """A sample event under events/ (the same files `sam local invoke -e` takes)."""
    return json.loads((EVENTS / name).read_text())


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[ServerThread]:
    """One sandbox per test session on a free loopback port."""
    app = Sandbox()
    server = ServerThread(app, "127.0.0.1", 0)
    app.base_url = server.url
    with server:
        yield server


@pytest.fixture
def sandbox(sandbox_server: ServerThread) -> Iterator[Sandbox]:
    """The session sandbox, reset before each test."""
    app = sandbox_server._server.app  # the WSGI app we passed in
    assert isinstance(app, Sandbox)
    app.reset()
    yield app
    app.reset()


# What the functions and clients read from the environment: a test that changes one must put it back.
WATCHED_ENV = ("GPUFARM_", "DD_", "SLACK_", "AWS_", "AZURE_")


@pytest.fixture(autouse=True)
def environment_put_back() -> Iterator[None]:
    """Fail the test that leaves gpufarm's variables changed, not the later test that happens to read them.

    Runs around the test's own fixtures (it is set up first and torn down last), so a fixture that sets a variable
    for a wider scope than it restores it in is caught where it is written.
    """
    before = _watched()
    yield
    after = _watched()
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"the test left these environment variables changed: {', '.join(changed)}"


def _watched() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name.startswith(WATCHED_ENV)}


@pytest.fixture
def sandbox_url(sandbox: Sandbox, sandbox_server: ServerThread) -> str:
    """Base URL of the reset sandbox."""
    return sandbox_server.url


@pytest.fixture
def dd_env(sandbox_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Environment pointing gpufarm's Datadog and Slack clients at the sandbox."""
    monkeypatch.setenv("GPUFARM_DATADOG_HOST", sandbox_url)
    monkeypatch.setenv("GPUFARM_SLACK_API_URL", f"{sandbox_url}/slack/api/")
    monkeypatch.setenv("DD_API_KEY", DEFAULT_DD_API_KEY)
    monkeypatch.setenv("DD_APP_KEY", DEFAULT_DD_APP_KEY)
    monkeypatch.setenv("SLACK_BOT_TOKEN", DEFAULT_SLACK_TOKEN)
    return sandbox_url


@pytest.fixture
def dd_configuration(sandbox_url: str) -> Any:
    """A datadog-api-client Configuration aimed at the sandbox, every incident operation enabled, type checks on."""
    from datadog_api_client import Configuration

    cfg = Configuration(host=sandbox_url, check_return_type=True)
    cfg.api_key["apiKeyAuth"] = DEFAULT_DD_API_KEY
    cfg.api_key["appKeyAuth"] = DEFAULT_DD_APP_KEY
    # Every incident operation, not a fixed list: contract tests also drive incident types, user-defined fields
    # and notification rules. `_UnstableOperations` keeps its flags in `.values` ("v2.create_incident"); set
    # them by operation name.
    for name in list(cfg.unstable_operations.values):
        if "incident" in name:
            cfg.unstable_operations[name.split(".", 1)[1]] = True
    return cfg


def pytest_configure(config: pytest.Config) -> None:
    """Scan every log record and captured output of the session for secret values (tests/secret_scan.py); keep
    what commands cache (the farm's validated dump: gpufarm.adapters.farm_dump) in the session's own directory."""
    import os
    import tempfile

    secret_scan.register(config)
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="gpufarm-test-cache-")


COST_MARKERS = ("unit", "contract", "integration", "hardening", "security")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the cost of its folder, so `-m unit|contract|integration|hardening` split the suite.

    A test outside those folders, or one whose module claims another folder's cost, fails collection: each test
    carries exactly one cost marker.
    """
    tests_root = Path(__file__).parent
    wrong: list[str] = []
    for item in items:
        parts = item.path.relative_to(tests_root).parts if item.path.is_relative_to(tests_root) else ()
        folder = parts[0] if len(parts) > 1 and parts[0] in COST_MARKERS else None
        if folder is not None and item.get_closest_marker(folder) is None:
            item.add_marker(folder)
        costs = sorted(name for name in COST_MARKERS if item.get_closest_marker(name) is not None)
        if folder is None:
            wrong.append(f"{item.nodeid}: not under tests/{', tests/'.join(COST_MARKERS)}")
        elif costs != [folder]:
            wrong.append(f"{item.nodeid}: cost markers {costs}, expected only {folder!r}")
    if wrong:
        raise pytest.UsageError("tests must carry exactly one cost marker:\n" + "\n".join(wrong))
