"""Text shown as data (gpufarm.core.kernel.display) and each report format's cell helper (gpufarm.reporting.cells)."""

from __future__ import annotations

import time

import pytest

from gpufarm.core.kernel.display import MAX_SHOWN, visible
from gpufarm.reporting.cells import chart_label, csv_cell, html_text, json_text, table_cell

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("llm-ko", "llm-ko"),
        ("日本語 ok", "日本語 ok"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\x00b\x7fc\x9bd", "a\\x00b\\x7fc\\x9bd"),
        ("two\nlines\r\t", "two\\x0alines\\x0d\\x09"),
        ("exe.\u202etxt\u2066\u2069\u200f", "exe.\\u202etxt\\u2066\\u2069\\u200f"),
        ("\U000e0041tag", "\\U000e0041tag"),
    ],
)
def test_non_printable_characters_are_shown_as_escapes(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_a_long_value_is_cut_with_an_ellipsis_and_costs_no_more_than_a_short_one() -> None:
    assert visible("x" * MAX_SHOWN) == "x" * MAX_SHOWN
    assert visible("x" * (MAX_SHOWN + 1)) == "x" * (MAX_SHOWN - 1) + "…"
    # An escape counts its own length: ten escapes of four characters fill a bound of 20 before the text ends.
    assert visible("\x1b" * 10, 20) == "\\x1b" * 4 + "\\x1…"
    huge = "\x1b" * 10_000_000
    started = time.perf_counter()
    assert len(visible(huge, 40)) == 40
    assert time.perf_counter() - started < 0.1
    with pytest.raises(ValueError, match="at least 1"):
        visible("x", 0)


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "  =", "\uff1d", "\uff0b", "\uff0d", "\uff20"])
def test_a_csv_cell_that_would_start_a_formula_gets_a_leading_quote(start: str) -> None:
    assert csv_cell(f"{start}1+1") == f"'{start}1+1"


def test_each_format_starts_from_the_same_visible_text() -> None:
    hostile = '\t=1"><img src=x onerror=alert(1)>\x1b'
    assert table_cell(hostile) == json_text(hostile) == '\\x09=1"><img src=x onerror=alert(1)>\\x1b'
    assert csv_cell(hostile) == table_cell(hostile)  # the tab is an escape now, no longer a formula's start
    assert html_text(hostile) == "\\x09=1&quot;&gt;&lt;img src=x onerror=alert(1)&gt;\\x1b"
    assert html_text("it's & <b>") == "it&#x27;s &amp; &lt;b&gt;"
    # plotly.js decodes &lt; &gt; &amp; in a label but shows &quot; as it is: a label escapes markup, not quotes.
    assert chart_label(hostile) == '\\x09=1"&gt;&lt;img src=x onerror=alert(1)&gt;\\x1b'
    assert csv_cell("12.5") == "12.5" and csv_cell("") == ""
