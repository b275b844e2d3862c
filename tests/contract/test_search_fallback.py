"""gpufarm's Datadog adapter on a sandbox playing the search and host-list quirks: the same answers as on a Datadog
that applies every facet, each fallback remembered and logged once, and `check_search_forms` saying which fell back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from helpers import http

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.adapters.datadog_reads import DatadogLeaseReads
from gpufarm.adapters.incident_search import BROKEN, CONFIRMED, FELL_BACK, Facet
from gpufarm.config import SecretStr, Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.search import LIVE_QUERY, IncidentQuery
from gpufarm.core.leases import probe
from gpufarm.reporting.read import ended_query
from gpufarm.setup import apply as setup
from gpufarm.setup import plan as planning
from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox
from gpufarm_sandbox.emulator.quirks import FACETS_400, FACETS_IGNORED, NO_LIST_WILDCARD, TAG_SOURCE_USER
from gpufarm_sandbox.emulator.server import ServerThread

pytestmark = pytest.mark.contract

SECRET = "search-fallback-secret-0123"
VALUES = {"team": ["nlp", "vision"], "gpu_model": ["H100"], "environment": ["hpc", "cloud"]}


@dataclass
class Org:
    """A sandbox playing some quirks, gpufarm applied on it, and the runtime gateway aimed at it."""

    sandbox: Sandbox
    url: str
    gateway: DatadogGateway
    leases: list[IncidentRecord]


def _lease(gateway: DatadogGateway, n: int, team: str, env: str, phase: Phase, state: State) -> IncidentRecord:
    fields: dict[str, object] = {
        f.STATE: state.value,
        f.PHASE: phase.value,
        f.TEAM: team,
        f.ENVIRONMENT: env,
        f.GPU_MODEL: "H100",
        f.GPU_COUNT: "8",
        f.REQUESTER: f"U00000000{n:02d}",
        f.REQUEST_ID: f"req-fallback-{n:04d}",
    }
    if state is State.RESOLVED:
        fields |= {f.GPU_HOURS_BY_MONTH: ["2026-12=8.000"], f.GPU_HOURS_MONTHS: ["2026-12"]}
    return gateway.create(f"GPU request {n}", fields)


@pytest.fixture
def start(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """start(quirks) -> Org: a fresh sandbox playing them, gpufarm applied, six leases of two teams and pools."""
    made: list[tuple[ServerThread, DatadogGateway]] = []

    def running(quirks: str) -> Org:
        app = Sandbox(quirks=quirks)
        server = ServerThread(app).start()
        app.base_url = server.url
        monkeypatch.setenv("GPUFARM_DATADOG_HOST", server.url)
        monkeypatch.setenv("DD_API_KEY", DEFAULT_DD_API_KEY)
        monkeypatch.setenv("DD_APP_KEY", DEFAULT_DD_APP_KEY)
        monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
        settings = Settings(max_retries=1, http_timeout=5)
        admin = DatadogAdmin(settings)
        spec = planning.SetupSpec(
            incident_webhook_url=f"{server.url}/nowhere/incidents",
            idle_webhook_url=f"{server.url}/nowhere/idle",
            valid_values=VALUES,
            has_secret=True,
        )
        assert not setup.apply_setup(admin, spec, secret=SecretStr(SECRET)).blocked
        admin.close()
        gateway = DatadogGateway(settings)
        made.append((server, gateway))
        leases = [
            _lease(gateway, 1, "nlp", "hpc", Phase.ALLOCATED, State.STABLE),
            _lease(gateway, 2, "nlp", "cloud", Phase.APPROVED, State.ACTIVE),
            _lease(gateway, 3, "vision", "hpc", Phase.WAITING, State.ACTIVE),
            _lease(gateway, 4, "vision", "cloud", Phase.ALLOCATED, State.STABLE),
            _lease(gateway, 5, "nlp", "hpc", Phase.RECLAIMED, State.RESOLVED),
            _lease(gateway, 6, "vision", "hpc", Phase.RECLAIMED, State.RESOLVED),
        ]
        return Org(app, server.url, gateway, leases)

    yield running
    for server, gateway in made:
        gateway.close()
        server.stop()


QUERIES = {
    "live": LIVE_QUERY,
    "pool": IncidentQuery.where({State.ACTIVE, State.STABLE}, environment="hpc"),
    "team in pool": IncidentQuery.where({State.ACTIVE, State.STABLE}, environment="hpc", team="vision"),
    "phases": IncidentQuery.where({State.ACTIVE, State.STABLE}, phase=["approved", "waiting"]),
    "requester": IncidentQuery.where({State.ACTIVE, State.STABLE}, requester="U0000000004"),
    "ended this month": ended_query(["2026-12"]),
    "ended of a team": ended_query(["2026-11", "2026-12"], team="nlp"),
}


def _answers(gateway: DatadogGateway) -> dict[str, list[int]]:
    return {name: sorted(r.public_id for r in gateway.search(query)) for name, query in QUERIES.items()}


@pytest.mark.parametrize("quirks", [FACETS_400, FACETS_IGNORED, NO_LIST_WILDCARD, "all"])
def test_every_search_answers_the_same_whatever_datadog_does_with_facets(start: object, quirks: str) -> None:
    plain = start("")  # type: ignore[operator]
    expected = _answers(plain.gateway)
    assert expected["team in pool"] == [plain.leases[2].public_id]
    assert len(expected["ended this month"]) == 2
    quirky = start(quirks)  # type: ignore[operator]
    assert _answers(quirky.gateway) == expected
    assert plain.gateway.facets.lost() == {}


@pytest.mark.parametrize("quirks", [FACETS_400, FACETS_IGNORED, NO_LIST_WILDCARD, "all"])
def test_the_light_lease_reads_answer_the_same_whatever_datadog_does_with_facets(start: object, quirks: str) -> None:
    expected = _answers(start("").gateway)  # type: ignore[operator]
    start(quirks)  # type: ignore[operator]
    reads = DatadogLeaseReads(Settings(max_retries=1, http_timeout=5))
    try:
        assert {name: sorted(x.ir for x in reads.lease_facts(q)) for name, q in QUERIES.items()} == expected
    finally:
        reads.close()
    assert reads.facets.lost() or quirks == NO_LIST_WILDCARD


def test_a_refused_facet_is_remembered_and_logged_once(start: object, caplog: pytest.LogCaptureFixture) -> None:
    org = start(FACETS_400)  # type: ignore[operator]
    caplog.set_level(logging.WARNING, logger="gpufarm.adapters.incident_search")
    for _ in range(3):
        _answers(org.gateway)
    lost = org.gateway.facets.lost()
    assert set(lost) == {Facet.FIELDS, Facet.TYPE} and all(why.startswith("refused") for why in lost.values())
    assert len([r for r in caplog.records if "facets" in r.getMessage()]) == 2  # once per kind, not per search
    # Later searches go straight to the form Datadog accepts: one request per page, no 400 first.
    before = _searches(org)
    list(org.gateway.search(QUERIES["team in pool"]))
    assert _searches(org) == before + 1


def _searches(org: Org) -> int:
    counted: int = org.sandbox.requests.dump()["by_endpoint"].get("GET /api/v2/incidents/search", 0)
    return counted


def test_ignored_facets_are_detected_and_filtered(start: object) -> None:
    org = start(FACETS_IGNORED)  # type: ignore[operator]
    _answers(org.gateway)
    assert Facet.FIELDS in org.gateway.facets.lost()
    assert org.gateway.facets.lost()[Facet.FIELDS].startswith("ignored")


def _probe(org: Org) -> IncidentRecord:
    fields = probe.probe_fields("searchcheck01", "hpc", "nlp")
    return org.gateway.create("gpufarm doctor probe", fields)


def test_the_search_forms_are_confirmed_on_a_datadog_that_applies_them(start: object) -> None:
    org = start("")  # type: ignore[operator]
    checks = org.gateway.check_search_forms(_probe(org))
    assert {c.form: c.status for c in checks} == {
        "state": CONFIRMED,
        "incident type": CONFIRMED,
        "environment": CONFIRMED,
        "team": CONFIRMED,
        "phase": CONFIRMED,
        "requester": CONFIRMED,
        "accrued months": CONFIRMED,
    }


@pytest.mark.parametrize(("quirks", "how"), [(FACETS_400, "refused"), (FACETS_IGNORED, "ignored")])
def test_the_search_forms_say_which_fell_back_and_how(start: object, quirks: str, how: str) -> None:
    org = start(quirks)  # type: ignore[operator]
    sample = _probe(org)
    remembered = org.gateway.facets.lost()
    checks = {c.form: c for c in org.gateway.check_search_forms(sample)}
    assert checks["state"].status == CONFIRMED
    fell_back = {name for name, c in checks.items() if c.status == FELL_BACK}
    assert fell_back == {"incident type", "environment", "team", "phase", "requester", "accrued months"}
    assert all(checks[name].detail.startswith(how) for name in fell_back)
    assert org.gateway.facets.lost() == remembered  # probing changes nothing the runtime remembers


def test_the_search_forms_need_an_incident_to_probe_with(start: object) -> None:
    org = start("")  # type: ignore[operator]
    for lease in org.leases:
        org.gateway.delete(lease.id)
    assert [c.status for c in org.gateway.check_search_forms()] == [BROKEN]


def test_the_host_list_source_is_read_in_any_case(start: object) -> None:
    org = start(TAG_SOURCE_USER)  # type: ignore[operator]
    host = {"name": "hpc-01", "tags": {"datadog": ["gpufarm:managed"]}, "reporting": True}
    assert http(f"{org.url}/_sandbox/hosts", "POST", {"hosts": [host]})[0] == 200
    org.gateway.add_tags("hpc-01", ["ir:ir-1"], source="user")
    [host] = [h for h in org.gateway.list_hosts("gpufarm:managed") if h.name == "hpc-01"]
    assert host.tags_by_source["user"] == ("ir:ir-1",)
    assert "User" not in host.tags_by_source
