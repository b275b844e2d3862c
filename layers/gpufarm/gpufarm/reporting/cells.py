"""Every text a report shows, one helper per output kind: the table, the CSV, the HTML and the JSON.

A report's group keys and lease lines come from incident fields, and any field can be edited by hand in Datadog, so
each renderer passes every cell through its kind's helper here, figures included (they cost nothing and a column
added later is covered without thinking about it). Each starts from gpufarm.core.kernel.display.visible (control
characters and bidirectional overrides shown as escapes, the length bounded), then adds its format's own rule:

- the table: nothing more (what a terminal sees is printable);
- the CSV: a cell a spreadsheet would read as a formula gets a leading quote;
- the HTML: escaped for text and attribute values alike (`&`, `<`, `>`, `"`, `'`);
- a chart label (plotly.js draws it from the figures' JSON): `&`, `<` and `>` escaped, since plotly.js reads a
  label's `<b>` or `<a href>` as markup and shows `&lt;` as `<` (it has no `&quot;`, and a quote is no markup);
- the JSON: nothing more (the encoder escapes what JSON needs).
"""

from __future__ import annotations

import html

from gpufarm.core.kernel.display import MAX_SHOWN, visible

# What a spreadsheet reads as the start of a formula (OWASP's list, and the full-width forms some locales read
# the same way); a cell whose first non-blank character is one of them is written with a leading quote.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
# A note, or a list gpufarm composes (reclaims by reason, budgets), is longer than one value, and still bounded.
NOTE_CHARS = 400


def table_cell(text: str, limit: int = MAX_SHOWN) -> str:
    """A text for the terminal table."""
    return visible(text, limit)


def csv_cell(text: str, limit: int = MAX_SHOWN) -> str:
    """A CSV cell no spreadsheet runs as a formula."""
    shown = visible(text, limit)
    return f"'{shown}" if shown.lstrip(" ").startswith(FORMULA_START) else shown


def html_text(text: str, limit: int = MAX_SHOWN) -> str:
    """A text for the HTML page, safe as element text and as a quoted attribute value."""
    return html.escape(visible(text, limit), quote=True)


def chart_label(text: str, limit: int = MAX_SHOWN) -> str:
    """A label, legend or trace name plotly.js draws: shown as text, never read as its pseudo-HTML."""
    return html.escape(visible(text, limit), quote=False)


def json_text(text: str, limit: int = MAX_SHOWN) -> str:
    """A text for the JSON document."""
    return visible(text, limit)
