"""Headless Chromium driven by playwright: load a page, wait for it to draw, report what it shows.

Used by the dashboard browser test and by `benchmarks/dashboard_screenshots.py` and `benchmarks/report.py`:
Debian's `chromium` (or the one GPUFARM_CHROMIUM names) is launched through playwright's `executable_path`, so no
browser build of playwright's own is needed. A page is loaded in one tab (later loads reuse its cache, as a user's
next look does), the console's errors and uncaught exceptions are collected, the page's `data-rendered` mark is
awaited, and a full-page PNG screenshot is taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Page
    from playwright.sync_api import Error as PlaywrightError

CHROMIUM_ENV = "GPUFARM_CHROMIUM"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless, and quiet: no sandbox (CI runs as root, where Chromium's sandbox cannot start), no GPU, and none of the
# background traffic (QUIC probes, component and sync updates) a test machine has no network for.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# The page marks itself drawn on <body data-rendered="true"> once its charts are in.
_RENDERED_JS = "document.readyState === 'complete' && !!document.body && document.body.dataset.rendered === 'true'"
# What the page reports once loaded: its title, the widgets' titles, and how many charts and SVG roots drew.
_SUMMARY_JS = """() => JSON.stringify({
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


@contextlib.contextmanager
def chromium(binary: str | None = None, *, width: int = 1400, height: int = 1000) -> Iterator[Browser]:
    """A headless Chromium for the block's duration (playwright removes its throw-away profile afterwards)."""
    from playwright.sync_api import Error, sync_playwright

    path = binary or find_chromium()
    if path is None:
        raise BrowserError("no Chromium found (install Debian's chromium, or set GPUFARM_CHROMIUM)")
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=path, headless=True, args=list(FLAGS))
        except Error as exc:
            raise BrowserError(f"Chromium did not start: {exc.message}") from None
        try:
            page = launched.new_page(viewport={"width": width, "height": height})
            yield Browser(page)
        finally:
            launched.close()


class Browser:
    """A started Chromium with one tab; `load` opens a page in it."""

    def __init__(self, page: Page) -> None:
        self._page = page
        self._errors: list[str] = []
        page.on("console", self._on_console)
        page.on("pageerror", self._on_page_error)

    @property
    def page(self) -> Page:
        """The tab, for a caller that drives a page itself (clicks, typing) rather than only loading it."""
        return self._page

    @property
    def console_errors(self) -> list[str]:
        """The console's errors and uncaught exceptions since the last `load` (or since the start)."""
        return list(self._errors)

    def _on_console(self, message: ConsoleMessage) -> None:
        # Failed resource loads arrive here as errors too, as they do in the DevTools console.
        if message.type in ("error", "assert"):
            self._errors.append(message.text)

    def _on_page_error(self, error: PlaywrightError) -> None:
        self._errors.append(error.stack or f"{error.name}: {error.message}")

    def load(self, url: str, *, timeout_s: float = 30.0, screenshot: bool = True) -> PageReport:
        """Open url, wait until the page marks itself rendered (or timeout_s), and report what it shows."""
        from playwright.sync_api import Error
        from playwright.sync_api import TimeoutError as PageTimeout

        self._errors = []
        started = time.perf_counter()
        try:
            self._page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
            left_ms = max(1.0, timeout_s * 1000 - (time.perf_counter() - started) * 1000)
            self._page.wait_for_function(_RENDERED_JS, timeout=left_ms, polling=50)
        except PageTimeout:
            pass  # reported as rendered: false, with whatever the page did draw
        except Error as exc:
            raise BrowserError(f"{url}: {exc.message}") from None
        load_ms = (time.perf_counter() - started) * 1000
        summary = json.loads(self._page.evaluate(_SUMMARY_JS) or "{}")
        report = PageReport(url, summary, list(self._errors), load_ms)
        if screenshot:
            report.screenshot = self._page.screenshot(full_page=True, type="png")
        return report
