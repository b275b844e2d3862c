"""Headless Chromium through the DevTools protocol: load a page, wait for it to draw, report what it shows.

Used by the dashboard browser test and by `benchmarks/dashboard_screenshots.py`: Debian's `chromium` (or the one
GPUFARM_CHROMIUM names) is started with a throw-away profile and `--remote-debugging-port=0`, and driven over its
page's WebSocket (websocket-client). A page is loaded, the console's errors and uncaught exceptions are collected,
the page's `data-rendered` mark is awaited, and a full-page PNG screenshot is taken.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_ENV = "GPUFARM_CHROMIUM"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")

# What the page reports once loaded: its title, the widgets' titles, and how many charts and SVG roots drew.
_SUMMARY_JS = """JSON.stringify({
  title: document.title,
  rendered: document.body.dataset.rendered === 'true',
  renderMs: Number(document.body.dataset.renderMs || 'NaN'),
  charts: document.querySelectorAll('.chart').length,
  svgCharts: document.querySelectorAll('.chart .main-svg').length,
  headings: Array.from(document.querySelectorAll('h1, h2, h3')).map(function (e) { return e.textContent; }),
  tables: document.querySelectorAll('table.query-table').length,
  values: Array.from(document.querySelectorAll('.value')).map(function (e) { return e.textContent; }),
  errors: Array.from(document.querySelectorAll('.widget-error')).map(function (e) { return e.textContent; }),
  height: document.documentElement.scrollHeight
})"""


class BrowserError(RuntimeError):
    """Chromium could not be started or driven."""


def find_chromium() -> str | None:
    """The Chromium binary to use: GPUFARM_CHROMIUM, else the first of the usual names on PATH."""
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return named if Path(named).exists() else shutil.which(named)
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


@dataclass
class PageReport:
    """What one loaded page showed."""

    url: str
    summary: dict[str, Any]
    console_errors: list[str] = field(default_factory=list)
    load_ms: float = 0.0
    screenshot: bytes = b""


class _Session:
    """One DevTools WebSocket: numbered commands, events kept as they arrive."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self._ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._ws.close()

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result") or {}
                return result
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        answer = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return (answer.get("result") or {}).get("value")

    def console_errors(self) -> list[str]:
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params") or {}
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails") or {}
                out.append(str((details.get("exception") or {}).get("description") or details.get("text")))
            elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
                out.append(str(params["entry"].get("text")))
        return out


@contextlib.contextmanager
def chromium(binary: str | None = None, *, width: int = 1400, height: int = 1000) -> Iterator[Browser]:
    """A headless Chromium for the block's duration (its profile is removed afterwards)."""
    path = binary or find_chromium()
    if path is None:
        raise BrowserError("no Chromium found (install Debian's chromium, or set GPUFARM_CHROMIUM)")
    # Chromium's helpers may still write to the profile while it is removed: what they leave is a temp folder.
    with tempfile.TemporaryDirectory(prefix="gpufarm-chromium-", ignore_cleanup_errors=True) as profile:
        args = [
            path,
            "--headless=new",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # noqa: S603
        try:
            yield Browser(_devtools_port(process), width)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _devtools_port(process: subprocess.Popen[str]) -> int:
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line.strip())
        found = _LISTENING.search(line)
        if found:
            return int(found.group(1).split(":")[2].split("/")[0])
    raise BrowserError("Chromium did not start: " + " | ".join(seen[-5:]))


class Browser:
    """A started Chromium; `load` opens a page in its first tab."""

    def __init__(self, port: int, width: int) -> None:
        self.port = port
        self.width = width

    def _page_socket(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as answer:
            targets = json.loads(answer.read())
        pages = [t for t in targets if t.get("type") == "page"]
        if not pages:
            raise BrowserError("Chromium has no page open")
        return str(pages[0]["webSocketDebuggerUrl"])

    def load(self, url: str, *, timeout_s: float = 30.0, screenshot: bool = True) -> PageReport:
        """Open url, wait until the page marks itself rendered (or timeout_s), and report what it shows."""
        session = _Session(self._page_socket())
        try:
            for domain in ("Page", "Runtime", "Log"):
                session.send(f"{domain}.enable")
            started = time.perf_counter()
            session.send("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                state = session.evaluate(
                    "document.readyState + ':' + (document.body && document.body.dataset.rendered)"
                )
                if state == "complete:true":
                    break
                time.sleep(0.05)
            load_ms = (time.perf_counter() - started) * 1000
            summary = json.loads(session.evaluate(_SUMMARY_JS) or "{}")
            report = PageReport(url, summary, session.console_errors(), load_ms)
            if screenshot:
                height = max(int(summary.get("height") or 1000), 400)
                session.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=self.width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                shot = session.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                report.screenshot = base64.b64decode(shot["data"])
            return report
        finally:
            session.close()
