"""Hand-edited incident fields render as data (docs/security.md, "Threat model", "Hand-edited incident fields").

Anyone with edit rights on the incidents in Datadog's UI can set a lease's team, project, environment, hosts,
purpose, requester or history lines to anything. Leases carrying hostile values in every free-text field are
stored through the fake incident store and read back the way production reads them; every output a person opens
is then checked inert: the terminal table (`gpufarm report`), the CSV (a spreadsheet), the HTML page (a browser),
the JSON, `/gpu report`'s Slack summary and the operators' daily digest.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from click.testing import CliRunner
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.cli.report import report as report_command
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.config.farm_view import FarmView
from gpufarm.core.digest import run as digest_run
from gpufarm.core.digest.build import MAX_LINE_CHARS
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.display import MAX_SHOWN
from gpufarm.core.kernel.model import isoformat
from gpufarm.core.service import GpuFarm
from gpufarm.handlers import runtime as rt
from gpufarm.reporting import render_html as html_module
from gpufarm.reporting.cells import FORMULA_START, NOTE_CHARS
from gpufarm.reporting.make import make_report
from gpufarm.reporting.model import Report
from gpufarm.reporting.render_csv import render_csv
from gpufarm.reporting.render_json import render_json
from gpufarm.reporting.render_table import render_table
from gpufarm.reporting.slack import report_answer

pytestmark = pytest.mark.security

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
OPS = "U0000000OPS"
FARM = parse_farm(FARM_YAML)
VIEW = FarmView.of(FARM)

# What a hand edit can put in a field: spreadsheet formulas, terminal escapes (clear screen, colour, an OSC 8
# hyperlink, a C1 CSI), bidirectional overrides and isolates, markup for the HTML page and for plotly's labels,
# a NUL, a line break, and a value of 20,000 characters.
HOSTILE = (
    '=HYPERLINK("http://evil.example/x","invoice")',
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
    "  =1+1",
    "\uff1d1+1",
    "\x1b[2J\x1b[31mowned",
    "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07",
    "\x9b31mc1",
    "exe.\u202etxt",
    "\u2066isolated\u2069\u202a\u202b\u202c\u202d",
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "</script><!--<script>alert(2)</script>",
    "<b>bold</b><a href='javascript:alert(3)'>x</a>",
    "nul\x00byte",
    "two\nlines",
    "x" * 20_000,
)
# Controls and bidi characters no output may carry raw (a line break only where the format puts one).
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _lease(incidents: FakeIncidents, value: str, n: int) -> None:
    """A lease of last week with `value` in every free-text field a hand edit can reach."""
    start = NOW - timedelta(days=3, hours=n)
    incidents.create(
        f"GPU request: {value[:40]}",
        {
            f.STATE: "resolved",
            f.PHASE: "reclaimed",
            f.TEAM: value,
            f.PROJECT: value,
            f.ENVIRONMENT: value,
            f.PURPOSE: value,
            f.REQUESTER: value,
            f.GPU_MODEL: "H100",
            f.GPU_COUNT: "8",
            f.HOSTS: [value],
            f.HOST_GPUS: [f"{value}=8"],
            f.ALLOCATED_AT: isoformat(start),
            f.GPU_HOURS_UNTIL: isoformat(start + timedelta(hours=2)),
            f.GPU_HOURS_HELD: "16.000",
            f.GPU_HOURS_BUSY: "4.000",
            f.GPU_HOURS_IDLE: "8.000",
            f.GPU_HOURS_UNMEASURED: "4.000",
            f.GPU_HOURS_BY_MONTH: ["2026-12=16.000"],
            f.GPU_HOURS_MONTHS: ["2026-12"],
            f.RECLAIM_REASON: "idle",
            f.HISTORY: [f"{isoformat(start)} {value} requested: {value}"],
        },
    )


@pytest.fixture
def incidents() -> FakeIncidents:
    store = FakeIncidents(FakeClock(NOW))
    for n, value in enumerate(HOSTILE):
        _lease(store, value, n)
    return store


@pytest.fixture(params=["team", "project", "environment", "ir"])
def hostile_report(request: pytest.FixtureRequest, incidents: FakeIncidents) -> Report:
    report = make_report(incidents, VIEW, NOW, since="30d", by=request.param)
    # Every hostile value is a group of its own (or, by IR, a lease line): the renderers do see them.
    assert report.total.leases == len(HOSTILE)
    assert {x.project for x in report.top_idle} >= {v for v in HOSTILE if len(v) < 100}
    return report


def _no_long_run(text: str) -> None:
    assert "x" * (NOTE_CHARS + 1) not in text


def _inert_text(text: str) -> None:
    """Printable but for the line breaks the output itself writes, and no hostile value longer than a bound."""
    assert not _RAW.search(text), repr(_RAW.search(text))
    _no_long_run(text)


# -- the terminal table ------------------------------------------------------------------------------------------


def test_the_table_shows_controls_as_escapes_and_bounds_every_cell(hostile_report: Report) -> None:
    table = render_table(hostile_report)
    _inert_text(table)
    assert "\\x1b[2J\\x1b[31mowned" in table or hostile_report.query.by.value == "ir"
    assert "x" * (MAX_SHOWN + 1) not in table
    # A line break in a field cannot make a line of its own: the table has exactly its own lines.
    assert not any(line.startswith("lines") for line in table.splitlines())


def test_gpufarm_report_prints_the_table_inert(incidents: FakeIncidents, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DD_API_KEY", "DD_APP_KEY", "GPUFARM_FARM_CONFIG", "GPUFARM_FARM_CONFIG_PARAMETER"):
        monkeypatch.delenv(name, raising=False)
    rt.override(farm=FARM, clock=FakeClock(NOW), incidents=incidents)
    try:
        shown = CliRunner().invoke(report_command, ["--by", "project"])
        refused = CliRunner().invoke(report_command, ["--project", "ghost"])
    finally:
        rt.reset()
    assert shown.exit_code == 0, shown.output
    assert "\\x1b]8;;http://evil.example\\x07click" in shown.output
    _inert_text(shown.output)
    # The refusal lists the projects the leases name: hand-edited ones are listed as data too.
    assert refused.exit_code == 2 and "unknown project 'ghost'" in refused.output
    _inert_text(refused.output)


# -- the CSV -----------------------------------------------------------------------------------------------------


def _csv_inert(text: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    for row in rows:
        for cell in row:
            assert not cell.lstrip(" ").startswith(FORMULA_START), cell
            assert cell.isprintable() and len(cell) <= NOTE_CHARS + 1, cell
    assert all(len(row[2]) <= MAX_SHOWN + 1 for row in rows)  # the group
    return rows


def test_no_csv_cell_starts_a_formula_or_carries_a_control(hostile_report: Report) -> None:
    rows = _csv_inert(render_csv(hostile_report))
    groups = [row[2] for row in rows[1:]]
    if hostile_report.query.by.value != "ir":
        assert '\'=HYPERLINK("http://evil.example/x","invoice")' in groups
        assert "'  =1+1" in groups and "'\uff1d1+1" in groups and "\\x09=1+1" in groups


# -- the HTML page -----------------------------------------------------------------------------------------------


class _Tags(HTMLParser):
    """Every start tag and attribute the page has, and the text of its scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


_PAGE_TAGS = {"html", "head", "meta", "link", "title", "style", "body", "h1", "h2", "h3", "p", "main", "div"}
_PAGE_TAGS |= {"section", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "script"}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_the_html_page_has_only_its_own_markup_and_scripts(
    hostile_report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(html_module, "plotly_js", lambda: "/* plotly.js */")
    page = html_module.render_html(hostile_report)
    _inert_text(page)
    parsed = _Tags()
    parsed.feed(page)
    parsed.close()
    assert {tag for tag, _ in parsed.tags} <= _PAGE_TAGS
    assert all(not name.startswith("on") for _, attrs in parsed.tags for name, _ in attrs)
    # Three scripts, all the page's own: the figures' data, plotly.js and the drawing code.
    assert len(parsed.scripts) == 3 and parsed.scripts[1] == "/* plotly.js */"
    assert parsed.scripts[2] == html_module._DRAW_JS
    data = parsed.scripts[0]
    assert not {"<", ">", "&"} & set(data), "the figures' JSON carries raw markup characters"
    # Chart labels are escaped too: plotly.js reads `<b>` or `<a href>` in a label as markup.
    labels = list(_strings(json.loads(data)))
    assert all("<" not in s and ">" not in s for s in labels)
    if hostile_report.query.by.value != "ir":
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in labels
        assert '"&gt;&lt;img src=x onerror=alert(1)&gt;' in labels  # plotly.js shows &quot; as it is
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown, as text


# -- the JSON ----------------------------------------------------------------------------------------------------


def test_the_json_strings_are_printable_and_bounded(hostile_report: Report) -> None:
    document = json.loads(render_json(hostile_report))
    for text in _strings(document):
        assert text.isprintable() and len(text) <= NOTE_CHARS, text


# -- /gpu report and the digest in Slack -------------------------------------------------------------------------


def _sent_texts(chat: FakeChat) -> list[str]:
    out = []
    for sent in chat.sent:
        out += [sent.text, *_strings(sent.blocks)]
    return out


def test_the_slack_summary_and_its_csv_carry_no_control(incidents: FakeIncidents) -> None:
    chat = FakeChat(operators=frozenset({OPS}))
    svc = GpuFarm(incidents=incidents, hosts=FakeHosts(), chat=chat, clock=FakeClock(NOW), farm=FARM)
    message = report_answer(svc.context, OPS, None)
    texts = [message.text, *_strings(message.blocks)]
    assert any("\\x1b[2J" in t for t in texts)
    for text in texts:
        _inert_text(text)
    [(_, content)] = chat.files.values()
    _csv_inert(content.decode())


def test_the_digest_shows_hand_edited_fields_as_data() -> None:
    clock = FakeClock(NOW)
    chat = FakeChat(operators=frozenset({OPS}))
    hosts = FakeHosts()
    hosts.seed("hpc-1", "H100", 8, "hpc")
    store = FakeIncidents(clock)
    since = NOW - timedelta(hours=2)
    for n, value in enumerate(HOSTILE):
        # Waiting for an operator, with a repair the sync wrote (both are digest news), every text field hostile.
        store.create(
            f"GPU request {n}",
            {
                f.STATE: "active",
                f.PHASE: "requested",
                f.TEAM: value,
                f.PROJECT: value,
                f.ENVIRONMENT: value,
                f.PURPOSE: value,
                f.GPU_MODEL: "H100",
                f.GPU_COUNT: "8",
                f.HISTORY: [
                    f"{isoformat(since)} gpufarm requested: {value}",
                    f"{isoformat(since + timedelta(minutes=1))} gpufarm repaired: {value}",
                ],
            },
        )
    svc = GpuFarm(incidents=store, hosts=hosts, chat=chat, clock=clock, farm=FARM)
    done = digest_run.run(svc.context, force=True)
    assert done.posted and done.sections["Waiting requests"] == len(HOSTILE)
    texts = _sent_texts(chat)
    assert any("\\x1b[2J\\x1b[31mowned" in t for t in texts) and any("exe.\\u202etxt" in t for t in texts)
    for text in texts:
        _inert_text(text)
        # Each bullet is one line of at most MAX_LINE_CHARS: a field's line break cannot add a bullet of its own.
        bullets = [line for line in text.splitlines() if line.startswith("• ")]
        assert all(len(line) <= MAX_LINE_CHARS + 2 for line in bullets)
        assert not any(line.startswith("lines") for line in text.splitlines())
