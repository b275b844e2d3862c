"""IncidentQuery: what a search asks for, decided on a record, and the Datadog text that asks the same."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufarm.adapters.incident_search import Attempt, Facet, FacetMemory, ignored
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.search import LIVE_QUERY, IncidentQuery
from gpufarm_sandbox.emulator.incidents_search import matches, parse_query

ENVS = ("onprem-hpc", "cloud-aws")
TEAMS = ("nlp", "vision")


def _record(state: State, env: str, team: str, phase: Phase, months: tuple[str, ...] = ()) -> IncidentRecord:
    fields: dict[str, f.FieldValue] = {f.ENVIRONMENT: env, f.TEAM: team, f.PHASE: phase.value}
    if months:
        fields[f.GPU_HOURS_BY_MONTH] = [f"{m}=1.000" for m in months]
        fields[f.GPU_HOURS_MONTHS] = list(months)
    return IncidentRecord(id="x", public_id=1, title="t", state=state.value, fields=fields)


def test_the_live_query_asks_the_state_facet_only() -> None:
    assert LIVE_QUERY.text() == "state:(active OR stable)"
    assert not LIVE_QUERY.has_facets
    assert LIVE_QUERY.matches(_record(State.STABLE, "x", "y", Phase.ALLOCATED))
    assert not LIVE_QUERY.matches(_record(State.RESOLVED, "x", "y", Phase.RECLAIMED))


def test_months_are_asked_with_plain_values_never_a_wildcard() -> None:
    query = IncidentQuery.where({State.RESOLVED}, team="nlp", months=["2026-12", "2026-11"])
    assert query.text() == 'state:(resolved) AND team:("nlp") AND gpu_hours_months:("2026-11" OR "2026-12")'
    assert "*" not in query.text()
    assert query.text(facets=False) == "state:(resolved)"
    assert query.matches(_record(State.RESOLVED, "hpc", "nlp", Phase.RECLAIMED, ("2026-10", "2026-11")))
    assert not query.matches(_record(State.RESOLVED, "hpc", "nlp", Phase.RECLAIMED, ("2026-10",)))
    assert not query.matches(_record(State.RESOLVED, "hpc", "vision", Phase.RECLAIMED, ("2026-11",)))


@given(
    states=st.frozensets(st.sampled_from(list(State)), min_size=1),
    env=st.none() | st.sampled_from(ENVS),
    team=st.none() | st.sampled_from(TEAMS),
    phases=st.none() | st.frozensets(st.sampled_from(list(Phase)), min_size=1),
    record=st.builds(
        _record,
        st.sampled_from(list(State)),
        st.sampled_from(ENVS),
        st.sampled_from(TEAMS),
        st.sampled_from(list(Phase)),
    ),
)
def test_matches_agrees_with_the_datadog_text_in_the_sandbox_grammar(
    states: frozenset[State],
    env: str | None,
    team: str | None,
    phases: frozenset[Phase] | None,
    record: IncidentRecord,
) -> None:
    """The local filter and the query Datadog is sent select the same incidents: a fallback changes no answer."""
    wanted = [p.value for p in phases] if phases is not None else None
    query = IncidentQuery.where(states, environment=env, team=team, phase=wanted)

    def values(facet: str | None) -> list[str]:
        if facet == "state":
            return [record.state or ""]
        value = record.fields.get(facet or "")
        return [value] if isinstance(value, str) else list(value or [])

    assert query.matches(record) == matches(parse_query(query.text()), values)


def test_a_refused_kind_of_facet_is_not_sent_again_and_the_narrower_ones_come_first() -> None:
    memory = FacetMemory()
    query = IncidentQuery.where({State.ACTIVE}, team="nlp")
    assert memory.attempts(query) == [Attempt(True, True), Attempt(True, False), Attempt(False, False)]
    assert memory.attempts(LIVE_QUERY) == [Attempt(True, False), Attempt(False, False)]
    memory.lose(Facet.FIELDS, "refused (HTTP 400)")
    memory.lose(Facet.FIELDS, "ignored")  # the first reason is kept
    assert memory.attempts(query) == [Attempt(True, False), Attempt(False, False)]
    memory.lose(Facet.TYPE, "refused (HTTP 400)")
    assert memory.attempts(query) == [Attempt(False, False)]
    assert memory.lost() == {Facet.FIELDS: "refused (HTTP 400)", Facet.TYPE: "refused (HTTP 400)"}


def test_one_lagging_incident_is_not_taken_for_ignored_facets() -> None:
    assert not ignored(checked=10, failed=1)
    assert not ignored(checked=10, failed=5)
    assert ignored(checked=10, failed=6)
    assert ignored(checked=2, failed=2)
