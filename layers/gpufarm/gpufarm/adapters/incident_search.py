"""Incident search that adapts to what Datadog does with facets (docs/datadog.md, "Search that adapts").

Datadog documents the `state` and `severity` facets of incident search; gpufarm also asks for its incident type and
its own fields (`environment:`, `team:`, `phase:`, `requester:`, `gpu_hours_months:`). Either kind may be refused
(400) or ignored (answered as if absent). The store sends the narrowest query Datadog has not refused, keeps only
what the query `matches` (gpufarm.core.kernel.search), and remembers a refused or ignored kind for the container's
life, logged once: the answer is the same in every case, only the reads differ.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from gpufarm.adapters.datadog_http import Failed
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.search import IncidentQuery, accrued_months

if TYPE_CHECKING:
    # An annotation only: the light reader (gpufarm.adapters.datadog_reads) loads no incident model.
    from gpufarm.core.kernel.model import IncidentRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

# A page shows facets ignored when at least this many of its incidents, and more than half, fail the query: one
# or two may only be the search index lagging a change.
IGNORED_AT_LEAST = 2
# Values no incident holds, for the probes that must find nothing.
NO_SUCH_VALUE = "gpufarm-doctor-no-such-value"
NO_SUCH_MONTH = "1900-01"

HTTP_BAD_REQUEST = 400
SEARCH_PAGE = 100  # Datadog's maximum page[size] for incidents
# The most pages of one search read at once, once its first page has given the total (`search_pages`).
MAX_PAGE_READERS = 8

CONFIRMED = "confirmed"
FELL_BACK = "fell back"
BROKEN = "broken"


class Facet(StrEnum):
    """The kinds of undocumented facet gpufarm's searches use."""

    TYPE = "incident type"
    FIELDS = "custom fields"


@dataclass(frozen=True)
class Attempt:
    """One way to send a query: with or without each kind of facet."""

    with_type: bool
    with_fields: bool

    def uses(self, facet: Facet) -> bool:
        """True when this attempt sends that kind of facet."""
        return self.with_type if facet is Facet.TYPE else self.with_fields


@dataclass(frozen=True)
class SearchCheck:
    """One search form as `gpufarm doctor` reports it: confirmed, fell back (and how), or broken."""

    form: str
    status: str
    detail: str


class FacetMemory:
    """Which facets Datadog refused or ignored in this container (shared by every search of one store)."""

    def __init__(self) -> None:
        self._lost: dict[Facet, str] = {}
        self._lock = threading.Lock()

    def attempts(self, query: IncidentQuery) -> list[Attempt]:
        """The ways to send `query`, narrowest first, skipping facets known to be refused or ignored."""
        with self._lock:
            use_type = Facet.TYPE not in self._lost
            use_fields = query.has_facets and Facet.FIELDS not in self._lost
        tried = [Attempt(use_type, use_fields)]
        if use_fields:
            tried.append(Attempt(use_type, with_fields=False))
        if use_type:
            tried.append(Attempt(with_type=False, with_fields=False))
        return tried

    def lose(self, facet: Facet, why: str) -> None:
        """Stop sending this kind of facet; logged the first time."""
        with self._lock:
            if facet in self._lost:
                return
            self._lost[facet] = why
        log.warning("incident search: Datadog %s the %s facets; gpufarm searches without them and filters", why, facet)

    def lost(self) -> dict[Facet, str]:
        """The facets no longer sent, and why."""
        with self._lock:
            return dict(self._lost)


def ignored(checked: int, failed: int) -> bool:
    """True when a page's incidents show the facets sent were not applied."""
    return failed >= IGNORED_AT_LEAST and failed * 2 > checked


@dataclass(frozen=True)
class Form:
    """One search form gpufarm uses, probed with a query that must find a known incident and one that must not."""

    name: str
    facet: Facet | None
    finds: IncidentQuery
    misses: IncidentQuery


def forms(sample: IncidentRecord) -> list[Form]:
    """Every search form gpufarm sends, built around `sample` (an incident of gpufarm's type with those fields)."""
    state = State(sample.state or State.ACTIVE)
    others = frozenset(State) - {state}
    found: list[Form] = [
        Form("state", None, IncidentQuery(frozenset({state})), IncidentQuery(others)),
        Form("incident type", Facet.TYPE, IncidentQuery(frozenset({state})), IncidentQuery(frozenset({state}))),
    ]
    for name in (f.ENVIRONMENT, f.TEAM, f.PHASE, f.REQUESTER):
        value = sample.fields.get(name)
        if isinstance(value, str) and value:
            found.append(
                Form(
                    name,
                    Facet.FIELDS,
                    IncidentQuery(frozenset({state}), ((name, (value,)),)),
                    IncidentQuery(frozenset({state}), ((name, (NO_SUCH_VALUE,)),)),
                )
            )
    months = sorted(accrued_months(sample.fields))
    if months:
        found.append(
            Form(
                "accrued months",
                Facet.FIELDS,
                IncidentQuery.where({state}, months=months),
                IncidentQuery.where({state}, months=[NO_SUCH_MONTH]),
            )
        )
    return found


def verdict(form: Form, found: bool | str, missed: bool | str) -> SearchCheck:
    """The check for one form from its two probes: True/False (the sample was found or not), or Datadog's refusal."""
    if isinstance(found, str) or isinstance(missed, str):
        why = found if isinstance(found, str) else missed
        return SearchCheck(form.name, FELL_BACK, f"refused ({why}); gpufarm searches without it and filters")
    if not found:
        return SearchCheck(form.name, BROKEN, "the search did not find an incident it should")
    if missed:
        return SearchCheck(form.name, FELL_BACK, "ignored (answered as if absent); gpufarm filters locally")
    return SearchCheck(form.name, CONFIRMED, "filters as documented" if form.facet is None else "Datadog applies it")


# -- paging, shared by the incident store and the light lease reads ------------------------------------------------

# (query text, offset) -> a search answer's `data.attributes`; raises Failed.
Fetch = Callable[[str, int], dict[str, Any]]
# (the attempt that sent the page, the page's items) -> what the caller keeps of them.
Keep = Callable[[Attempt, list[Any]], list[T]]


def search_pages(
    query: IncidentQuery,
    facets: FacetMemory,
    text: Callable[[Attempt], str],
    fetch: Fetch,
    keep: Keep[T],
    *,
    page_size: int,
    limit: int | None = None,
    readers: int = 1,
) -> Iterator[T]:
    """Every page of a search, sent the narrowest way Datadog has not refused (a 400 on a facet is remembered and
    the next attempt sent without it), each page's items passed through `keep`, at most `limit` kept.

    With `readers` above 1, a search read whole (no `limit`, no `scan`) reads the pages its first page's `total`
    announces up to that many at a time (`_Ahead`), each within the invocation's time budget and through the same
    rate-limit gate as any call; pages are still kept in order, and a page that fails fails the whole search (the
    caller decides nothing on a partial read)."""
    for attempt in facets.attempts(query):
        sent = text(attempt)
        try:
            first = fetch(sent, 0)
        except Failed as failed:
            if failed.outcome.status == HTTP_BAD_REQUEST and (attempt.with_fields or attempt.with_type):
                refused = Facet.FIELDS if attempt.with_fields else Facet.TYPE
                facets.lose(refused, f"refused ({failed.outcome.message})")
                continue
            raise failed.error() from None
        whole = limit is None and query.scan is None
        ahead = _Ahead(fetch, sent, page_size, min(max(1, readers), MAX_PAGE_READERS) if whole else 1)
        pages = _pages(query, first, partial(keep, attempt), fetch=ahead.page, page_size=page_size, limit=limit)
        del first  # held by the pages alone, so it goes with them (see _pages)
        try:
            yield from pages
        finally:
            ahead.close()
        return


class _Ahead:
    """The pages of one search after its first, read up to `readers` at a time at the offsets the first page's
    `total` announces, never more than `readers` ahead of the page kept last (a read whole holds a few pages at a
    time, not the search); an offset not announced (the total grew, a page came short) is read when asked for."""

    def __init__(self, fetch: Fetch, sent: str, page_size: int, readers: int) -> None:
        self._fetch = fetch
        self._sent = sent
        self._page_size = page_size
        self._readers = readers
        self._pool: ThreadPoolExecutor | None = None
        self._offsets: list[int] = []
        self._planned: dict[int, Future[dict[str, Any]]] = {}

    def page(self, offset: int, total: Any) -> dict[str, Any]:
        """The page at `offset` (`total`: as the last page read gave it); raises Failed as `fetch` does."""
        if self._readers > 1 and self._pool is None and isinstance(total, int) and total - offset > self._page_size:
            self._pool = ThreadPoolExecutor(self._readers, thread_name_prefix="incident-search")
            self._offsets = list(range(offset, total, self._page_size))[::-1]
        while self._pool is not None and self._offsets and len(self._planned) < self._readers:
            at = self._offsets.pop()
            # Each read runs in a copy of this context: the invocation's time budget bounds its waits too.
            self._planned[at] = self._pool.submit(contextvars.copy_context().run, self._fetch, self._sent, at)
        planned = self._planned.pop(offset, None)
        if planned is None:
            return self._fetch(self._sent, offset)
        return planned.result()

    def close(self) -> None:
        """Drop the pages not asked for (those already on the wire are waited for, then thrown away)."""
        if self._pool is not None:
            for future in self._planned.values():
                future.cancel()
            self._planned.clear()
            self._offsets.clear()
            self._pool.shutdown(wait=True)
            self._pool = None


def _pages(
    query: IncidentQuery,
    attributes: dict[str, Any],
    keep: Callable[[list[Any]], list[T]],
    *,
    fetch: Callable[[int, Any], dict[str, Any]],
    page_size: int,
    limit: int | None,
) -> Iterator[T]:
    offset = 0
    seen = 0
    while True:
        page = attributes.get("incidents") or []
        if query.scan is not None and offset + len(page) > query.scan:
            page = page[: max(0, query.scan - offset)]
        for kept in keep(page):
            yield kept
            seen += 1
            if limit is not None and seen >= limit:
                return
        offset += len(page)
        total = attributes.get("total")
        # Stop on a short page, as the client's own pagination does, or once `total` is reached.
        if len(page) < page_size or (isinstance(total, int) and offset >= total):
            return
        if query.scan is not None and offset >= query.scan:
            return
        # The page read goes before the next is fetched: what `keep` took is all that stays, so a search holds one
        # parsed page at a time, not two (3,000 leases' report: a page is some 100,000 objects).
        del page, attributes
        try:
            attributes = fetch(offset, total)
        except Failed as failed:
            raise failed.error() from None


def search_attributes(body: Any) -> dict[str, Any]:
    """`data.attributes` of a search answer's JSON (incidents, total), checked for the shape gpufarm reads."""
    data = body.get("data") if isinstance(body, dict) else None
    attributes = data.get("attributes") if isinstance(data, dict) else None
    if not isinstance(attributes, dict) or not isinstance(attributes.get("incidents", []), list):
        raise UpstreamError("Datadog answered the incident search with an unexpected shape")
    return attributes


def item_data(item: Any) -> dict[str, Any]:
    """The incident data object of one search result (`{"data": {...}}`)."""
    data = item.get("data") if isinstance(item, dict) else None
    if not isinstance(data, dict) or "id" not in data:
        raise UpstreamError("Datadog answered the incident search with an incident that has no id")
    return data


def type_id_named(types: list[dict[str, Any]], name: str) -> str:
    """The id of the one incident type called `name` among those Datadog lists (plain JSON), which must not be the
    organization's default type; UpstreamError otherwise (the setup is missing: `gpufarm datadog apply`)."""
    named = [t for t in types if isinstance(t, dict) and (t.get("attributes") or {}).get("name") == name]
    # UpstreamError, not NotFound: the setup is missing, not an incident, and callers retry upstream errors
    # (a queued change is redelivered once `gpufarm datadog apply` has made the type).
    if len(named) != 1:
        why = "no incident type" if not named else f"{len(named)} incident types"
        raise UpstreamError(f"Datadog has {why} named {name!r}: run `gpufarm datadog apply`")
    if (named[0].get("attributes") or {}).get("is_default"):
        raise UpstreamError(
            f"incident type {name!r} is the organization's default type; gpufarm needs a type of its own "
            "(run `gpufarm datadog apply`)"
        )
    return str(named[0]["id"])
