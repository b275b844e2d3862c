"""A pytest plugin that fails a test whose log records or captured output hold a known secret value.

Secrets never appear in logs (docs/design.md). The plugin sees every log record of the session at INFO and above
(and gpufarm's own loggers from DEBUG), from any thread, plus each test's captured stdout and stderr, and compares
them with every secret value it knows:
- the sandbox's and the local host's fixed credentials (Datadog keys, Slack bot token and signing secret, webhook
  secret);
- module-level string constants of the test modules whose names end in KEY, TOKEN, SECRET or PASSWORD;
- the values of environment variables with such names, read while each test runs (monkeypatched ones included).
A leak turns the test's teardown into an error naming the secret and where it appeared, never the value. A leak
outside any test (a background thread between tests) fails the session at the end.

Register it from a conftest: `secret_scan.register(config)` in `pytest_configure`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

# Names whose values are secrets, in the environment and among test module constants.
SECRET_NAME = re.compile(r"(?:^|_)(?:KEY|TOKEN|SECRET|PASSWORD)$")
# Shorter values are not worth matching (and would match ordinary words).
MIN_LENGTH = 8
# Loggers scanned from DEBUG: gpufarm's own code. Everything else from INFO, the level the functions run at.
OWN_LOGGERS = ("gpufarm", "gpufarm_node", "gpufarm_sandbox")
OUTSIDE_TESTS = "(between tests)"


def _fixed_secrets() -> dict[str, str]:
    from gpufarm_sandbox.emulator import app
    from gpufarm_sandbox.localhost import env

    names = ("DEFAULT_DD_API_KEY", "DEFAULT_DD_APP_KEY", "DEFAULT_SLACK_TOKEN", "DEFAULT_SLACK_SIGNING_SECRET")
    found = {f"sandbox {name}": str(getattr(app, name)) for name in names}
    found["local host LOCAL_WEBHOOK_SECRET"] = env.LOCAL_WEBHOOK_SECRET
    found["local host LOCAL_UPLOAD_TOKEN_SECRET"] = env.LOCAL_UPLOAD_TOKEN_SECRET
    return found


class _Recorder(logging.Handler):
    """Keeps the text of every record, filed under the test running when it was emitted."""

    def __init__(self) -> None:
        super().__init__(level=logging.NOTSET)
        self.current = OUTSIDE_TESTS
        self.texts: dict[str, list[tuple[str, str]]] = {}
        self._texts_lock = threading.Lock()
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.INFO and not record.name.startswith(OWN_LOGGERS):
            return
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is the logging module's problem, not a leak
            text = str(record.msg)
        if record.exc_info:
            text += "\n" + self._formatter.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + record.stack_info
        where = f"log record {record.name} {record.levelname}"
        with self._texts_lock:
            self.texts.setdefault(self.current, []).append((where, text))

    def take(self, nodeid: str) -> list[tuple[str, str]]:
        """The texts filed under nodeid, forgotten once taken."""
        with self._texts_lock:
            return self.texts.pop(nodeid, [])


class SecretScan:
    """The plugin object (one per session)."""

    def __init__(self) -> None:
        self.secrets: dict[str, str] = {}
        self.recorder = _Recorder()
        self.outside: list[str] = []
        self._saved_levels: dict[str, int] = {}

    # -- what counts as a secret -----------------------------------------------------------------------------------

    def learn(self, label: str, value: object) -> None:
        """Remember a secret value under a label that is safe to print."""
        if isinstance(value, str) and len(value) >= MIN_LENGTH and "*" not in value:
            self.secrets.setdefault(value, label)

    def learn_environment(self) -> None:
        """Secret-named environment variables as they are now."""
        for name, value in os.environ.items():
            if SECRET_NAME.search(name):
                self.learn(f"environment {name}", value)

    def leaks(self, texts: list[tuple[str, str]]) -> list[str]:
        """A line per (secret, place) found in texts, naming the secret, never showing it."""
        found: list[str] = []
        for where, text in texts:
            for value, label in self.secrets.items():
                if value in text and f"{label} in {where}" not in found:
                    found.append(f"{label} in {where}")
        return found

    # -- hooks -----------------------------------------------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        for label, value in _fixed_secrets().items():
            self.learn(label, value)
        self.learn_environment()
        root = logging.getLogger()
        self._saved_levels[""] = root.level
        if root.level > logging.INFO:
            root.setLevel(logging.INFO)
        for name in OWN_LOGGERS:
            own = logging.getLogger(name)
            self._saved_levels[name] = own.level
            own.setLevel(logging.DEBUG)
        root.addHandler(self.recorder)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        seen: set[int] = set()
        for item in items:
            module = getattr(item, "module", None)
            if module is None or id(module) in seen:
                continue
            seen.add(id(module))
            for name, value in vars(module).items():
                if SECRET_NAME.search(name):
                    self.learn(f"{module.__name__}.{name}", value)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._flush_outside()
        self.recorder.current = item.nodeid

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self.learn_environment()  # after the fixtures (monkeypatch) set the test's environment

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.learn_environment()  # before the fixtures put the environment back

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
        report: pytest.TestReport = yield
        if call.when != "teardown":
            return report
        self.recorder.current = OUTSIDE_TESTS
        texts = self.recorder.take(item.nodeid)
        texts += [(title.lower(), content) for title, content in report.sections if "Captured std" in title]
        found = self.leaks(texts)
        if found:
            report.outcome = "failed"
            report.longrepr = "secret scan: a secret value appeared in the test's output:\n  " + "\n  ".join(found)
        return report

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        logging.getLogger().removeHandler(self.recorder)
        for name, level in self._saved_levels.items():
            logging.getLogger(name or None).setLevel(level)
        self._flush_outside()
        if self.outside:
            reporter: Any = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line("secret scan: a secret value appeared outside any test:", red=True)
                for line in self.outside:
                    reporter.write_line(f"  {line}", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _flush_outside(self) -> None:
        self.outside += [line for line in self.leaks(self.recorder.take(OUTSIDE_TESTS)) if line not in self.outside]


def register(config: pytest.Config) -> SecretScan:
    """Install the plugin into this session (once)."""
    existing = config.pluginmanager.get_plugin("secret_scan")
    if isinstance(existing, SecretScan):
        return existing
    plugin = SecretScan()
    config.pluginmanager.register(plugin, "secret_scan")
    return plugin
