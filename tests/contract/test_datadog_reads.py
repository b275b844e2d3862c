"""Reads that cost pages, not objects: the gateway's IR index and its bulk reads decoded from JSON.

An IR lookup costs the same number of calls at 10 and at 1,000 live incidents (counted by the sandbox, outside the
client), and the records and hosts decoded from raw answers are exactly the ones the client's typed models gave,
on the recorded real traffic and on the sandbox's answers.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import pytest
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.v1.api.hosts_api import HostsApi
from datadog_api_client.v2.api.incidents_api import IncidentsApi
from helpers import KEYS, http
from recorded import interactions, response_json

from gpufarm.adapters import datadog as dd
from gpufarm.adapters import datadog_client as dc
from gpufarm.adapters import datadog_incidents as di
from gpufarm.adapters import incident_search
from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.ports import HostInfo
from gpufarm.core.kernel.search import ANY_STATE_QUERY, LIVE_QUERY
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

SEARCH = 'Search for incidents returns "OK" response'
SEARCH_PAGES = 'Search for incidents returns "OK" response with pagination'
HOSTS = "Get all hosts with metadata deserializes successfully"


@pytest.fixture
def gateway(settings: Settings, type_id: str) -> Iterator[DatadogGateway]:
    """A gateway that knows its type id (so no call below is the one-off type lookup)."""
    gw = DatadogGateway(settings, incident_type_id=type_id)
    yield gw
    gw.close()


def _seed_incidents(sandbox_url: str, type_id: str, count: int, *, state: str = "active") -> list[dict[str, Any]]:
    """`count` incidents of gpufarm's type posted over one keep-alive connection (seeding, not the path measured)."""
    parsed = urllib.parse.urlsplit(sandbox_url)
    connection = HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=30)
    made: list[dict[str, Any]] = []
    try:
        for n in range(count):
            fields = f.encode_fields({f.STATE: state, f.TEAM: "nlp", f.GPU_MODEL: "H100", f.GPU_COUNT: 8})
            body = {
                "data": {
                    "type": "incidents",
                    "attributes": {
                        "title": f"GPU request {n}",
                        "customer_impacted": False,
                        "incident_type_uuid": type_id,
                        "fields": fields,
                    },
                }
            }
            connection.request(
                "POST", "/api/v2/incidents", json.dumps(body), {"Content-Type": "application/json", **KEYS}
            )
            answer = connection.getresponse()
            data = answer.read()
            assert answer.status == 201, data[:300]
            made.append(json.loads(data)["data"])
    finally:
        connection.close()
    return made


def _requests(sandbox_url: str) -> dict[str, int]:
    status, counts = http(f"{sandbox_url}/_sandbox/requests")
    assert status == 200
    return dict(counts["by_endpoint"])


def _forget_requests(sandbox_url: str) -> None:
    assert http(f"{sandbox_url}/_sandbox/requests", "DELETE")[0] == 200


# -- the request counter ---------------------------------------------------------------------------------------


def test_the_sandbox_counts_api_requests_per_endpoint(sandbox_url: str, sandbox: Sandbox) -> None:
    http(f"{sandbox_url}/api/v2/incidents/00000000-0000-4000-8000-000000000001")
    http(f"{sandbox_url}/api/v2/incidents/00000000-0000-4000-8000-000000000002")
    http(f"{sandbox_url}/api/v1/hosts")
    http(f"{sandbox_url}/api/v9/nowhere")
    http(f"{sandbox_url}/_sandbox/state")  # the control plane is not an API call
    status, counts = http(f"{sandbox_url}/_sandbox/requests")
    assert status == 200
    assert counts == {
        "total": 4,
        "by_endpoint": {
            "GET /api/v2/incidents/<incident_id>": 2,
            "GET /api/v1/hosts": 1,
            "GET /api/v9/nowhere": 1,
        },
    }
    assert http(f"{sandbox_url}/_sandbox/requests", "DELETE")[1] == {"total": 0, "by_endpoint": {}}
    http(f"{sandbox_url}/api/v1/hosts")
    sandbox.reset()
    assert http(f"{sandbox_url}/_sandbox/requests")[1]["total"] == 0


# -- IR lookup --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("live", [10, 1000])
def test_an_ir_lookup_costs_the_same_calls_at_10_and_1000_live_incidents(
    live: int, settings: Settings, type_id: str, sandbox_url: str
) -> None:
    made = _seed_incidents(sandbox_url, type_id, live)
    newest = int(made[-1]["attributes"]["public_id"])
    recent = int(made[-5]["attributes"]["public_id"])
    cold = DatadogGateway(settings, incident_type_id=type_id)
    try:
        # A container that never saw the incident: one newest-first search page holds it.
        _forget_requests(sandbox_url)
        assert cold.get_by_ir(recent).id == made[-5]["id"]
        assert _requests(sandbox_url) == {"GET /api/v2/incidents/search": 1}
        # The page filled the index: the next lookups are one GET each, and the answer is current.
        _forget_requests(sandbox_url)
        assert cold.get_by_ir(newest).id == made[-1]["id"]
        assert cold.get_by_ir(recent).public_id == recent
        assert _requests(sandbox_url) == {"GET /api/v2/incidents/<incident_id>": 2}
        # A number not yet given: the first answer is already below it, one page.
        _forget_requests(sandbox_url)
        with pytest.raises(NotFound, match=f"IR-{newest + 1} "):
            cold.get_by_ir(newest + 1)
        assert _requests(sandbox_url) == {"GET /api/v2/incidents/search": 1}
    finally:
        cold.close()


def test_an_incident_this_gateway_created_is_one_get_away(
    gateway: DatadogGateway, type_id: str, sandbox_url: str
) -> None:
    _seed_incidents(sandbox_url, type_id, 30)
    created = gateway.create("GPU request", {f.STATE: "active", f.TEAM: "nlp"})
    gateway.update(created.id, {f.STATE: "resolved"})
    _forget_requests(sandbox_url)
    found = gateway.get_by_ir(created.public_id)
    assert found.id == created.id
    assert found.state == "resolved"
    assert _requests(sandbox_url) == {"GET /api/v2/incidents/<incident_id>": 1}


def test_an_old_ir_is_found_newest_first_and_stops_below_it(settings: Settings, type_id: str, sandbox_url: str) -> None:
    made = _seed_incidents(sandbox_url, type_id, 45, state="resolved") + _seed_incidents(sandbox_url, type_id, 5)
    cold = DatadogGateway(settings, incident_type_id=type_id, search_page_size=10)
    try:
        _forget_requests(sandbox_url)
        oldest = cold.get_by_ir(int(made[0]["attributes"]["public_id"]))
        assert oldest.id == made[0]["id"]
        assert oldest.state == "resolved"
        assert _requests(sandbox_url) == {"GET /api/v2/incidents/search": 5}  # 50 newest first, 10 a page
        # Everything read on the way is indexed.
        _forget_requests(sandbox_url)
        assert [cold.get_by_ir(int(m["attributes"]["public_id"])).id for m in made[20:23]] == [
            m["id"] for m in made[20:23]
        ]
        assert _requests(sandbox_url) == {"GET /api/v2/incidents/<incident_id>": 3}
    finally:
        cold.close()


def test_a_deleted_incident_leaves_the_index_and_is_not_found(
    gateway: DatadogGateway, settings: Settings, type_id: str, sandbox_url: str
) -> None:
    record = gateway.create("GPU request", {f.STATE: "active", f.TEAM: "nlp"})
    other = DatadogGateway(settings, incident_type_id=type_id)
    try:
        assert other.get_by_ir(record.public_id).id == record.id  # now in `other`'s index
        gateway.delete(record.id)  # by another container
        with pytest.raises(NotFound, match=f"IR-{record.public_id} is not a gpufarm allocation"):
            other.get_by_ir(record.public_id)
        # The stale entry was dropped: the next miss searches instead of GETting the deleted UUID again.
        _forget_requests(sandbox_url)
        with pytest.raises(NotFound):
            other.get_by_ir(record.public_id)
        assert _requests(sandbox_url) == {"GET /api/v2/incidents/search": 1}
    finally:
        other.close()


def test_the_index_is_bounded(gateway: DatadogGateway, type_id: str, sandbox_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(di, "IR_INDEX_SIZE", 8)
    _seed_incidents(sandbox_url, type_id, 20)
    assert len(list(gateway.search(LIVE_QUERY, newest_first=True))) == 20
    assert list(gateway._ir_index) == list(range(8, 0, -1))  # the last 8 read (IR-20 down to IR-1) stay


# -- raw decoding gives exactly the typed records -------------------------------------------------------------


def _typed_client() -> ApiClient:
    cfg = Configuration(check_return_type=True)
    return ApiClient(cfg)


def _typed_records(client: ApiClient, text: str) -> list[IncidentRecord]:
    """What the gateway decoded before: the client's typed models, then gpufarm's conversion."""
    response_type = IncidentsApi(client)._search_incidents_endpoint.settings["response_type"]
    model = client.deserialize(text, response_type, True)
    return [di._record(dc.plain_dict(item.data)) for item in model.data.attributes.incidents]


def _raw_records(text: str) -> list[IncidentRecord]:
    """What the gateway decodes now, from the answer's JSON."""
    attributes = incident_search.search_attributes(json.loads(text))
    return [di._record(incident_search.item_data(item)) for item in attributes["incidents"]]


def _typed_hosts(client: ApiClient, text: str) -> list[HostInfo | None]:
    response_type = HostsApi(client)._list_hosts_endpoint.settings["response_type"]
    model = client.deserialize(text, response_type, True)
    return [dd._host_info(host) for host in model.host_list]


def _raw_hosts(text: str) -> list[HostInfo | None]:
    return [dd._host_info(host) for host in json.loads(text)["host_list"]]


@pytest.mark.parametrize(("scenario", "index"), [(SEARCH, 1), (SEARCH_PAGES, 0), (SEARCH_PAGES, 1)])
def test_recorded_search_pages_decode_to_the_typed_records(scenario: str, index: int) -> None:
    text = json.dumps(response_json(interactions("v2-incidents.json", scenario)[index]))
    with _typed_client() as client:
        typed = _typed_records(client, text)
    raw = _raw_records(text)
    assert typed, "the recording holds incidents"
    assert raw == typed
    # Not vacuous: the recorded incidents carry fields, times and a state.
    assert any(r.fields for r in raw) and all(r.created is not None for r in raw)


def test_recorded_host_list_decodes_to_the_typed_hosts() -> None:
    (interaction,) = interactions("v1-hosts.json", HOSTS)
    text = json.dumps(response_json(interaction))
    with _typed_client() as client:
        typed = _typed_hosts(client, text)
    raw = _raw_hosts(text)
    assert raw == typed
    assert raw[0] is not None and raw[0].tags_by_source and raw[0].last_reported is not None


def test_sandbox_answers_decode_to_the_typed_records(
    gateway: DatadogGateway, type_id: str, sandbox_url: str, dd_configuration: Any
) -> None:
    made = _seed_incidents(sandbox_url, type_id, 3)
    held = gateway.update(
        made[1]["id"], {f.STATE: "stable", f.HOSTS: ["gpu-node-01", "gpu-node-02"], f.PROJECT: "llm-ko"}
    )
    gateway.update(made[2]["id"], {f.STATE: "resolved", f.RECLAIM_REASON: "released"})
    http(
        f"{sandbox_url}/_sandbox/hosts",
        "POST",
        {"hosts": [{"name": "gpu-node-01", "tags": {"user": ["ir:ir-2"], "datadog": ["gpu_model:h100"]}}]},
    )
    query = urllib.parse.quote(f"incident_type:{type_id} AND (state:(active OR stable OR resolved))")
    _, search = http(f"{sandbox_url}/api/v2/incidents/search?query={query}&page[size]=100")
    _, hosts = http(f"{sandbox_url}/api/v1/hosts?count=1000")
    with ApiClient(dd_configuration) as client:
        typed = _typed_records(client, json.dumps(search))
        assert _raw_records(json.dumps(search)) == typed
        assert _raw_hosts(json.dumps(hosts)) == _typed_hosts(client, json.dumps(hosts))
    # And the gateway's own reads give those same records and hosts.
    assert sorted(gateway.search(ANY_STATE_QUERY), key=lambda r: r.public_id) == sorted(
        typed, key=lambda r: r.public_id
    )
    assert held in typed
    (host,) = list(gateway.list_hosts())
    assert host.tags_by_source == {"user": ("ir:ir-2",), "datadog": ("gpu_model:h100",)}


def test_a_bulk_answer_of_the_wrong_shape_is_an_upstream_error() -> None:
    from gpufarm.core.kernel.errors import UpstreamError

    for body in (None, [], {"data": []}, {"data": {"attributes": {"incidents": {}}}}):
        with pytest.raises(UpstreamError, match="unexpected shape"):
            incident_search.search_attributes(body)
    with pytest.raises(UpstreamError, match="no id"):
        incident_search.item_data({"data": {"attributes": {}}})
