"""Sandbox hosts and host tags through the real datadog-api-client, checked against recorded Datadog traffic."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest
from datadog_api_client import ApiClient
from datadog_api_client.exceptions import ApiException
from datadog_api_client.v1.api.hosts_api import HostsApi
from datadog_api_client.v1.api.tags_api import TagsApi
from datadog_api_client.v1.model.host_list_response import HostListResponse
from datadog_api_client.v1.model.host_tags import HostTags
from datadog_api_client.v1.model.tag_to_hosts import TagToHosts
from helpers import KEYS
from helpers import http as plain_http
from recorded import interactions, missing_keys, response_json

from gpufarm_sandbox.emulator.app import DEFAULT_DD_API_KEY, DEFAULT_DD_APP_KEY, Sandbox

pytestmark = pytest.mark.contract

# The shared helper with what these tests always had: 30 s a request, and no Datadog keys unless a test
# passes them (several check the answers to missing keys).
http = partial(plain_http, keys=False, timeout=30)


def seed(sandbox_url: str, hosts: list[dict[str, Any]]) -> None:
    assert http(f"{sandbox_url}/_sandbox/hosts", "POST", {"hosts": hosts}) == (200, {"ok": True, "hosts": len(hosts)})


def test_list_hosts_matches_the_recorded_answer(client: ApiClient, sandbox_url: str) -> None:
    (recorded,) = interactions("v1-hosts.json", "Get all hosts with metadata deserializes successfully")
    seed(sandbox_url, [{"name": "vagrant", "tags": {"Datadog": ["host:vagrant"], "user": ["gpufarm:managed"]}}])
    query = "&".join(f"{k}={v}" for k, v in recorded["request"]["query"])
    status, ours = http(f"{sandbox_url}{recorded['request']['path']}?{query}", headers=KEYS)
    assert status == recorded["response"]["status"]
    assert missing_keys(ours, response_json(recorded)) == set()
    assert ours["host_list"][0]["tags_by_source"] == {"Datadog": ["host:vagrant"], "user": ["gpufarm:managed"]}
    typed = HostsApi(client).list_hosts(include_hosts_metadata=True)
    assert isinstance(typed, HostListResponse) and not typed._unparsed
    assert typed.host_list[0].host_name == "vagrant" and typed.host_list[0].up is True


def test_list_hosts_pages_with_start_and_count(client: ApiClient, sandbox_url: str) -> None:
    seed(sandbox_url, [{"name": f"gpu-node-{i:04d}", "tags": {"user": ["gpufarm:managed"]}} for i in range(2500)])
    api = HostsApi(client)
    names: list[str] = []
    start = 0
    while True:
        page = api.list_hosts(start=start, count=1000)
        assert page.total_matching == 2500 and page.total_returned == len(page.host_list)
        names.extend(h.name for h in page.host_list)
        start += len(page.host_list)
        if len(page.host_list) < 1000:
            break
    assert names == [f"gpu-node-{i:04d}" for i in range(2500)]
    last = api.list_hosts(sort_field="name", sort_dir="desc", count=2)
    assert [h.name for h in last.host_list] == ["gpu-node-2499", "gpu-node-2498"]


def test_filter_matches_name_substrings_and_exact_tags(client: ApiClient, sandbox_url: str) -> None:
    seed(
        sandbox_url,
        [
            {"name": "gpu-node-01", "tags": {"user": ["env:prod", "ir:ir-1"]}},
            {"name": "gpu-node-02", "tags": {"user": ["env:prod"]}},
            {"name": "cpu-node-01", "tags": {"user": ["env:prod", "ir:ir-1"]}},
        ],
    )
    api = HostsApi(client)

    def names(text: str) -> list[str]:
        return [h.name for h in api.list_hosts(filter=text).host_list]

    assert names("gpu-node") == ["gpu-node-01", "gpu-node-02"]
    assert names("ir:ir-1") == ["cpu-node-01", "gpu-node-01"]
    assert names("gpu ir:ir-1") == ["gpu-node-01"]  # terms are ANDed
    assert names("ir:ir") == []  # tags match exactly, not by prefix
    assert names("GPU-NODE-02") == ["gpu-node-02"]


def test_only_hosts_reporting_in_the_past_three_hours_are_listed(
    client: ApiClient, sandbox: Sandbox, sandbox_url: str
) -> None:
    now = sandbox.clock.now()
    seed(
        sandbox_url,
        [
            {"name": "fresh", "tags": {}},
            {"name": "stale", "tags": {}, "last_reported": now - 4 * 3600},
            {"name": "agent", "tags": {}, "reporting": True},
        ],
    )
    api = HostsApi(client)
    assert [h.name for h in api.list_hosts().host_list] == ["agent", "fresh"]
    assert [h.name for h in api.list_hosts(_from=int(now - 5 * 3600)).host_list] == ["agent", "fresh", "stale"]
    assert http(f"{sandbox_url}/_sandbox/clock", "POST", {"advance": 3 * 3600 + 60})[0] == 200
    listed = api.list_hosts().host_list
    assert [h.name for h in listed] == ["agent"]  # a host whose agent keeps reporting never ages out
    assert listed[0].up is True and listed[0].last_reported_time >= int(now + 3 * 3600)


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("count=1001", 400),
        ("start=-1", 400),
        ("count=abc", 400),
        ("sort_field=colour", 400),
        ("sort_dir=up", 400),
        ("include_hosts_metadata=maybe", 400),
    ],
)
def test_bad_list_parameters_are_400(sandbox_url: str, query: str, status: int) -> None:
    code, body = http(f"{sandbox_url}/api/v1/hosts?{query}", headers=KEYS)
    assert code == status and isinstance(body["errors"][0], str)


def test_hosts_and_tags_need_both_keys(sandbox_url: str) -> None:
    assert http(f"{sandbox_url}/api/v1/hosts", headers={"DD-API-KEY": DEFAULT_DD_API_KEY}) == (
        403,
        {"errors": ["Forbidden"]},
    )
    assert http(f"{sandbox_url}/api/v1/tags/hosts", headers={"DD-APPLICATION-KEY": DEFAULT_DD_APP_KEY})[0] == 403


def test_seeding_and_listing_ten_thousand_hosts_is_quick(client: ApiClient, sandbox_url: str) -> None:
    hosts = [
        {"name": f"gpu-{i:05d}", "tags": {"user": ["gpufarm:managed", "gpu_model:h100", f"cluster:c{i % 7}"]}}
        for i in range(10_000)
    ]
    started = time.perf_counter()
    seed(sandbox_url, hosts)
    seeded = time.perf_counter() - started
    started = time.perf_counter()
    names: list[str] = []
    for start in range(0, 10_000, 1000):  # raw HTTP: this times the sandbox, not the client's model building
        status, page = http(f"{sandbox_url}/api/v1/hosts?start={start}&count=1000", headers=KEYS)
        assert status == 200 and page["total_matching"] == 10_000
        names.extend(h["name"] for h in page["host_list"])
    listed = time.perf_counter() - started
    assert names == [h["name"] for h in hosts]
    assert seeded < 2.0 and listed < 3.0, (seeded, listed)
    page = HostsApi(client).list_hosts(filter="cluster:c3", count=1000)
    assert page.total_matching == len(range(3, 10_000, 7)) and page.total_returned == 1000


def test_seed_validation(sandbox_url: str) -> None:
    for body in (
        {},
        {"hosts": "h1"},
        {"hosts": [{"tags": {}}]},
        {"hosts": [{"name": "h", "tags": "a"}]},
        {"hosts": [{"name": "h", "tags": {"user": "a"}}]},
        {"hosts": [{"name": "h", "last_reported": "yesterday"}]},
        {"hosts": [{"name": "h", "reporting": "yes"}]},
    ):
        code, answer = http(f"{sandbox_url}/_sandbox/hosts", "POST", body)
        assert code == 400 and answer["errors"], body


# -- host tags -------------------------------------------------------------------------------------------------------


def test_host_tags_by_source(client: ApiClient, sandbox: Sandbox) -> None:
    api = TagsApi(client)
    created = api.create_host_tags("gpu-1", HostTags(host="gpu-1", tags=["IR:IR-12", "env:prod"]))
    assert isinstance(created, HostTags) and not created._unparsed
    assert created.tags == ["ir:ir-12", "env:prod"]  # lowercased, as Datadog stores tags
    appended = api.create_host_tags("gpu-1", HostTags(host="gpu-1", tags=["env:prod", "project:llm ko"]))
    assert appended.tags == ["ir:ir-12", "env:prod", "project:llm_ko"]  # appended, no duplicates
    api.update_host_tags("gpu-1", HostTags(host="gpu-1", tags=["gpu_model:h100"]), source="chef")
    assert api.get_host_tags("gpu-1", source="chef").tags == ["gpu_model:h100"]
    assert api.get_host_tags("gpu-1", source="user").tags == ["ir:ir-12", "env:prod", "project:llm_ko"]
    assert api.get_host_tags("gpu-1").tags == ["ir:ir-12", "env:prod", "project:llm_ko", "gpu_model:h100"]
    assert sandbox.hosts.tags_for("gpu-1") == ["ir:ir-12", "env:prod", "project:llm_ko", "gpu_model:h100"]
    replaced = api.update_host_tags("gpu-1", HostTags(host="gpu-1", tags=["env:prod"]))
    assert replaced.tags == ["env:prod"]  # PUT replaces only the user source
    api.create_host_tags("gpu-2", HostTags(host="gpu-2", tags=["env:prod"]))
    listed = api.list_host_tags()
    assert isinstance(listed, TagToHosts) and not listed._unparsed
    assert listed.tags["env:prod"] == ["gpu-1", "gpu-2"]
    assert api.list_host_tags(source="chef").tags == {"gpu_model:h100": ["gpu-1"]}
    assert api.delete_host_tags("gpu-1") is None
    assert api.get_host_tags("gpu-1").tags == ["gpu_model:h100"]
    api.delete_host_tags("gpu-1", source="chef")
    assert api.get_host_tags("gpu-1").tags == []
    assert sandbox.hosts.tags_for("gpu-1") == [] and sandbox.hosts.tags_for("nope") == []


def test_tagging_an_unknown_host_creates_it(client: ApiClient) -> None:
    TagsApi(client).create_host_tags("new-node", HostTags(tags=["gpufarm:managed"]))
    assert [h.name for h in HostsApi(client).list_hosts(filter="gpufarm:managed").host_list] == ["new-node"]


def test_tag_normalisation(client: ApiClient) -> None:
    tags = (
        TagsApi(client)
        .create_host_tags(
            "h", HostTags(tags=["  Team: Vision ", "9lives:x", "a" * 250, "ok:tag/with.dots-and_dashes", "___", "x!!y"])
        )
        .tags
    )
    assert tags == ["team:_vision", "lives:x", "a" * 200, "ok:tag/with.dots-and_dashes", "x_y"]


def test_unknown_host_is_404_and_bad_bodies_are_400(client: ApiClient, sandbox_url: str) -> None:
    api = TagsApi(client)
    with pytest.raises(ApiException) as info:
        api.get_host_tags("ghost")
    assert info.value.status == 404 and info.value.body == {"errors": ["Not Found"]}
    with pytest.raises(ApiException) as info:
        api.delete_host_tags("ghost")
    assert info.value.status == 404
    url = f"{sandbox_url}/api/v1/tags/hosts/h1"
    for body in ({"tags": "env:prod"}, {"tags": [1, 2]}, {}, ["env:prod"], {"host": 5, "tags": []}):
        code, answer = http(url, "POST", body, KEYS)
        assert code == 400 and answer["errors"], body
    code, answer = http(url, "PUT", None, KEYS)
    assert code == 400 and answer == {"errors": ["Invalid JSON: empty body"]}
