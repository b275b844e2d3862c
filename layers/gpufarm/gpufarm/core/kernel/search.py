"""A search for gpufarm's incidents, as data: which states, which field values, which accrual months.

The query is decided on a record by `matches`, in the core; `text` is the Datadog search query that asks for the
same. Datadog documents only the `state` and `severity` facets of incident search: a facet on a custom field or on
the incident type may be refused (400) or ignored. The adapter (gpufarm.adapters.incident_search) then sends a
wider query and keeps what `matches`, so the answer is the same whatever Datadog does with the facets
(docs/datadog.md, "Search that adapts").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, State

if TYPE_CHECKING:
    from gpufarm.core.kernel.model import IncidentRecord

LIVE_STATES = frozenset({State.ACTIVE, State.STABLE})
ANY_STATE = frozenset(State)


@dataclass(frozen=True)
class IncidentQuery:
    """Incidents in one of `states` whose fields hold one of the values asked for each field (AND across fields,
    OR within one) and, when `months` is given, that accrued GPU-hours in one of those months (YYYY-MM)."""

    states: frozenset[State] = ANY_STATE
    fields: tuple[tuple[str, tuple[str, ...]], ...] = ()
    months: tuple[str, ...] = ()
    # A bound on the read, not a filter: when set, only the newest `scan` incidents the store reads are looked at.
    # With the facets applied those are all matches; searching without them (a fallback), the newest in the states.
    scan: int | None = None

    @classmethod
    def where(
        cls,
        states: Iterable[State] = ANY_STATE,
        *,
        months: Iterable[str] = (),
        scan: int | None = None,
        **values: str | Iterable[str] | None,
    ) -> IncidentQuery:
        """A query from keyword field values (a value of None asks nothing of that field)."""
        wanted = tuple(
            (name, (value,) if isinstance(value, str) else tuple(sorted(set(value))))
            for name, value in sorted(values.items())
            if value is not None
        )
        return cls(frozenset(states), wanted, tuple(sorted(set(months))), scan)

    @property
    def has_facets(self) -> bool:
        """True when the query asks more than Datadog's documented `state` facet."""
        return bool(self.fields or self.months)

    def matches(self, record: IncidentRecord) -> bool:
        """True when the record is one this query asks for."""
        return self.admits(record.state, record.fields)

    def admits(self, state: str | None, values: Mapping[str, f.FieldValue]) -> bool:
        """True when an incident in this state with these fields is one this query asks for."""
        if state not in {s.value for s in self.states}:
            return False
        for name, accepted in self.fields:
            if not set(_values(values.get(name))) & set(accepted):
                return False
        return not self.months or bool(accrued_months(values) & set(self.months))

    def text(self, *, facets: bool = True) -> str:
        """The Datadog search query: the states, and (with `facets`) every field term, values quoted.

        The months are asked through the `gpu_hours_months` list field with plain values: a wildcard inside a list
        field's value (`gpu_hours_by_month:(2026-12=*)`) is not something Datadog documents.
        """
        terms = ["state:(" + " OR ".join(s.value for s in sorted(self.states)) + ")"]
        if facets:
            terms += [_term(name, values) for name, values in self.fields]
            terms += [_term(f.GPU_HOURS_MONTHS, self.months)] if self.months else []
        return " AND ".join(terms)


def accrued_months(fields: Mapping[str, f.FieldValue]) -> set[str]:
    """The months (YYYY-MM) a lease accrued GPU-hours in, from its per-month record."""
    return {entry.partition("=")[0] for entry in _values(fields.get(f.GPU_HOURS_BY_MONTH))}


def _term(name: str, values: Iterable[str]) -> str:
    return f"{name}:(" + " OR ".join(json.dumps(v) for v in values) + ")"


def _values(value: f.FieldValue) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def live_query(
    environment: str | None = None,
    team: str | None = None,
    phases: Iterable[Phase] | None = None,
    *,
    requester: str | None = None,
) -> IncidentQuery:
    """The live-incident search narrowed by the environment, team, phase and requester fields."""
    wanted = [p.value for p in phases] if phases is not None else None
    return IncidentQuery.where(LIVE_STATES, requester=requester, environment=environment, team=team, phase=wanted)


def ended_query(months: Iterable[str], team: str | None = None, environment: str | None = None) -> IncidentQuery:
    """The resolved leases that accrued GPU-hours in any of these months (`gpu_hours_months`), of one team or pool
    when given: how budgets, reports, fair share and the digest find the leases that ended inside a period."""
    return IncidentQuery.where({State.RESOLVED}, team=team, environment=environment, months=months)


# gpufarm's live incidents, and all of them.
LIVE_QUERY = IncidentQuery(LIVE_STATES)
ANY_STATE_QUERY = IncidentQuery()
