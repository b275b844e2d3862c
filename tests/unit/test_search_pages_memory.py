"""A search holds one parsed page at a time (gpufarm.adapters.incident_search.search_pages): the page read, the first
included, is gone before the next is fetched, and only what `keep` took stays."""

from __future__ import annotations

import weakref
from typing import Any

from gpufarm.adapters.incident_search import FacetMemory, search_pages
from gpufarm.core.kernel.search import IncidentQuery

PAGE = 3


class Page(dict[str, Any]):
    """A search answer's attributes that a weak reference can watch."""


def test_each_page_is_gone_before_the_next_is_fetched() -> None:
    alive: list[weakref.ref[Page]] = []
    fetched: list[tuple[int, int]] = []

    def fetch(text: str, offset: int) -> dict[str, Any]:
        fetched.append((offset, sum(ref() is not None for ref in alive)))
        page = Page(incidents=[{"n": offset + k} for k in range(PAGE if offset < 3 * PAGE else 1)])
        alive.append(weakref.ref(page))
        return page

    def keep(attempt: object, items: list[Any]) -> list[int]:
        return [item["n"] for item in items]

    found = list(search_pages(IncidentQuery(), FacetMemory(), lambda attempt: "q", fetch, keep, page_size=PAGE))
    assert found == list(range(3 * PAGE + 1))
    # (offset, pages still alive when it was fetched): none of the pages before.
    assert fetched == [(0, 0), (3, 0), (6, 0), (9, 0)]
