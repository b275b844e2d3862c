"""Incident search that adapts to what Datadog does with facets (docs/datadog.md, "Search that adapts").

Datadog documents the `state` and `severity` facets of incident search; gpufarm also asks for its incident type and
its own fields (`environment:`, `team:`, `phase:`, `requester:`, `gpu_hours_months:`). Either kind may be refused
(400) or ignored (answered as if absent). The store sends the narrowest query Datadog has not refused, keeps only
what the query `matches` (gpufarm.core.kernel.search), and remembers a refused or ignored kind for the container's
life, logged once: the answer is the same in every case, only the reads differ.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from enum import StrEnum

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.search import IncidentQuery, accrued_months

log = logging.getLogger(__name__)

# A page shows facets ignored when at least this many of its incidents, and more than half, fail the query: one
# or two may only be the search index lagging a change.
IGNORED_AT_LEAST = 2
# Values no incident holds, for the probes that must find nothing.
NO_SUCH_VALUE = "gpufarm-doctor-no-such-value"
NO_SUCH_MONTH = "1900-01"

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
