"""A search read whole reads its pages a few at a time once the first page gives the total: the same incidents in
the same order as one page at a time, never more than `readers` pages held ahead, each read within the invocation's
time budget, and a page that fails fails the whole search (nothing decided on a partial read)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpufarm.adapters import time_budget
from gpufarm.adapters.datadog_http import Failed, Outcome
from gpufarm.adapters.incident_search import Attempt, FacetMemory, search_pages
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.search import LIVE_QUERY, IncidentQuery

PAGE = 10


class Pages:
    """A search's pages over `total` numbered items, served with a little latency; counts what was asked."""

    def __init__(self, total: int, *, fail_at: int | None = None, latency_s: float = 0.01) -> None:
        self.total = total
        self.fail_at = fail_at
        self.latency_s = latency_s
        self.asked: list[int] = []
        self.budgeted: list[bool] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def fetch(self, text: str, offset: int) -> dict[str, Any]:
        with self._lock:
            self.asked.append(offset)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            # A read planned ahead must see the invocation's budget as the caller does (a contextvar).
            self.budgeted.append(not time_budget.allows(3600.0))
            time.sleep(self.latency_s)
            if offset == self.fail_at:
                raise Failed("search incidents", Outcome(503, "Service Unavailable", transient=True, not_applied=False))
            items = list(range(offset, min(offset + PAGE, self.total)))
            return {"incidents": items, "total": self.total}
        finally:
            with self._lock:
                self.in_flight -= 1


def _read(pages: Pages, readers: int, *, query: IncidentQuery = LIVE_QUERY, limit: int | None = None) -> list[int]:
    def text(attempt: Attempt) -> str:
        return query.text()

    def keep(attempt: Attempt, page: list[Any]) -> list[int]:
        return list(page)

    found = search_pages(query, FacetMemory(), text, pages.fetch, keep, page_size=PAGE, limit=limit, readers=readers)
    return list(found)


@pytest.mark.parametrize("total", [0, 7, 10, 95, 100, 101])
def test_pages_read_ahead_give_what_one_at_a_time_gives_each_page_read_once(total: int) -> None:
    one, four = Pages(total), Pages(total)
    assert _read(four, 4) == _read(one, 1) == list(range(total))
    assert sorted(four.asked) == one.asked == list(range(0, max(total, 1), PAGE))[: max(1, -(-total // PAGE))]


def test_at_most_readers_pages_are_read_at_once() -> None:
    pages = Pages(400, latency_s=0.02)
    assert len(_read(pages, 4)) == 400
    assert 1 < pages.most_in_flight <= 4


def test_reading_ahead_is_faster_than_one_page_at_a_time() -> None:
    started = time.perf_counter()
    _read(Pages(200, latency_s=0.02), 1)
    alone = time.perf_counter() - started
    started = time.perf_counter()
    _read(Pages(200, latency_s=0.02), 4)
    assert time.perf_counter() - started < alone * 0.6


def test_a_page_that_fails_fails_the_search_and_nothing_past_it_is_kept() -> None:
    pages = Pages(200, fail_at=120)
    kept: list[int] = []
    with pytest.raises(UpstreamError):
        kept.extend(_read_lazily(pages, 4))
    assert kept == list(range(120))
    # Reads planned past the failure stop with it: no more than the window was asked beyond the failed page.
    assert max(pages.asked) <= 120 + 4 * PAGE


def _read_lazily(pages: Pages, readers: int) -> Any:
    return search_pages(
        LIVE_QUERY,
        FacetMemory(),
        lambda attempt: "q",
        pages.fetch,
        lambda attempt, page: list(page),
        page_size=PAGE,
        readers=readers,
    )


def test_a_search_with_a_limit_or_a_scan_reads_one_page_at_a_time() -> None:
    limited = Pages(200)
    assert _read(limited, 4, limit=15) == list(range(15))
    assert limited.asked == [0, 10] and limited.most_in_flight == 1
    scanned = Pages(200)
    assert _read(scanned, 4, query=IncidentQuery(scan=25)) == list(range(25))
    assert scanned.asked == [0, 10, 20] and scanned.most_in_flight == 1


def test_a_search_left_early_drops_the_pages_read_ahead() -> None:
    pages = Pages(1000)
    found = _read_lazily(pages, 4)
    assert [next(found) for _ in range(15)] == list(range(15))
    found.close()
    asked = len(pages.asked)
    time.sleep(0.05)
    assert len(pages.asked) == asked <= 1 + 4 + 1


def test_every_page_read_ahead_is_within_the_invocations_time_budget() -> None:
    pages = Pages(100)
    with time_budget.invocation(30.0):
        assert len(_read(pages, 4)) == 100
    assert len(pages.budgeted) == 10 and all(pages.budgeted)
