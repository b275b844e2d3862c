"""The secret scan really fails a test that logs or prints a secret, and names the secret without showing it.

A throwaway suite registers tests/secret_scan.py as the project's conftest does and runs in a subprocess (the scan
changes logging levels for its session).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import secret_scan


def pytest_configure(config):
    secret_scan.register(config)
"""

SUITE = """
import logging
import os
import threading

from gpufarm_sandbox.emulator.app import DEFAULT_SLACK_TOKEN

PROBE_TOKEN = "probe-constant-token-0123"
log = logging.getLogger("gpufarm.handlers.probe")


def test_clean():
    log.info("allocated IR-7 on node-1")
    print("nothing to hide")


def test_logs_a_sandbox_secret():
    log.info("calling Slack with %s", DEFAULT_SLACK_TOKEN)


def test_debug_of_gpufarm_is_scanned():
    log.debug("constant %s", PROBE_TOKEN)


def test_prints_a_monkeypatched_environment_secret(monkeypatch):
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", "hook-value-from-env-42")
    print("header", os.environ["GPUFARM_WEBHOOK_SECRET"])


def test_secret_in_a_logged_traceback():
    try:
        raise RuntimeError("bad key " + PROBE_TOKEN)
    except RuntimeError:
        log.exception("upstream failed")


def test_secret_logged_from_another_thread():
    worker = threading.Thread(target=lambda: logging.getLogger("urllib3").warning("auth %s", PROBE_TOKEN))
    worker.start()
    worker.join()


def test_third_party_debug_is_not_scanned():
    logging.getLogger("urllib3").debug("auth %s", PROBE_TOKEN)
"""


@pytest.fixture
def outcome(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_probe=SUITE)
    # --show-capture=no: the failure reports leave the leaked output out, so only the scan's own lines remain.
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "-q", "--show-capture=no")


def test_a_leaking_test_errors_and_a_clean_one_passes(outcome: pytest.RunResult) -> None:
    outcome.assert_outcomes(passed=7, errors=5)
    text = outcome.stdout.str()
    for name in ("test_clean", "test_third_party_debug_is_not_scanned"):
        assert f"PASSED test_probe.py::{name}" in text
    for name in (
        "test_logs_a_sandbox_secret",
        "test_debug_of_gpufarm_is_scanned",
        "test_prints_a_monkeypatched_environment_secret",
        "test_secret_in_a_logged_traceback",
        "test_secret_logged_from_another_thread",
    ):
        assert f"ERROR test_probe.py::{name}" in text


def test_the_report_names_the_secret_and_where_never_its_value(outcome: pytest.RunResult) -> None:
    scan_lines = [line.strip() for line in outcome.stdout.lines if " in log record " in line or " in captured " in line]
    assert "sandbox DEFAULT_SLACK_TOKEN in log record gpufarm.handlers.probe INFO" in scan_lines
    assert "test_probe.PROBE_TOKEN in log record gpufarm.handlers.probe DEBUG" in scan_lines
    assert "environment GPUFARM_WEBHOOK_SECRET in captured stdout call" in scan_lines
    assert "test_probe.PROBE_TOKEN in log record gpufarm.handlers.probe ERROR" in scan_lines
    assert "test_probe.PROBE_TOKEN in log record urllib3 WARNING" in scan_lines
    for value in ("probe-constant-token-0123", "xoxb-sandbox-token", "hook-value-from-env-42"):
        assert value not in outcome.stdout.str()
