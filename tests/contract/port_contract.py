"""The behaviour the core relies on from its ports, written once and run against every implementation.

`tests/contract/test_port_fakes.py` runs these against the real adapters on the sandbox and against the in-memory
fakes the unit tests use (`tests/fakes.py`), so a fake that drifts from the adapter fails here, not in a unit test
that trusts it (docs/design.md, rule 12). Subclasses provide the port's fixture (and a seeding one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.ports import Chat, HostPage, HostPages, HostTags, IncidentStore, WorkQueue
from gpufarm.core.kernel.search import IncidentQuery

# Makes hosts known with tags per source, as their agents' reports would: {host: {source: [tags]}}.
SeedHosts = Callable[[Mapping[str, Mapping[str, Sequence[str]]]], None]
# Makes a user group with these members: (group id, members).
SeedGroup = Callable[[str, Sequence[str]], None]
# What a queue's consumer receives, in order: (group, body) pairs.
Received = Callable[[], list[tuple[str, dict[str, Any]]]]
UNKNOWN_UUID = "00000000-0000-4000-8000-000000000000"


def request_fields(request_id: str | None = "req-0001", **overrides: object) -> dict[str, object]:
    """The fields of a fresh GPU request, as the service writes them."""
    values: dict[str, object] = {
        f.STATE: "active",
        f.PHASE: "requested",
        f.TEAM: "nlp",
        f.PROJECT: "llm-ko",
        f.GPU_MODEL: "H100",
        f.GPU_COUNT: 8,
        f.ENVIRONMENT: "onprem-hpc",
        f.REQUESTER: "U0000000001",
        f.REQUEST_ID: request_id,
    }
    values.update(overrides)
    return values


class IncidentStoreContract:
    """What the lifecycle service relies on from an IncidentStore."""

    def test_create_gives_a_numbered_active_incident_with_its_fields(self, incidents: IncidentStore) -> None:
        created = incidents.create("GPU request: nlp/llm-ko 8xH100", request_fields())
        assert created.public_id >= 1
        assert created.state == "active"
        assert created.title == "GPU request: nlp/llm-ko 8xH100"
        # Plain values come back as the strings and string lists Datadog stores.
        assert created.fields[f.GPU_COUNT] == "8"
        assert created.fields[f.TEAM] == "nlp"
        assert created.fields[f.REQUEST_ID] == "req-0001"

    def test_numbers_grow_with_creation_and_find_their_incident(self, incidents: IncidentStore) -> None:
        first = incidents.create("first", request_fields("req-a"))
        second = incidents.create("second", request_fields("req-b"))
        assert second.public_id > first.public_id
        assert incidents.get_by_ir(first.public_id).id == first.id
        assert incidents.get(second.id).title == "second"

    def test_unknown_incidents_raise_not_found(self, incidents: IncidentStore) -> None:
        with pytest.raises(NotFound):
            incidents.get(UNKNOWN_UUID)
        with pytest.raises(NotFound, match="IR-999"):
            incidents.get_by_ir(999)

    def test_an_ir_finds_its_incident_in_every_state_and_is_checked(self, incidents: IncidentStore) -> None:
        made = [incidents.create(f"GPU request {n}", request_fields(f"req-ir-{n}")) for n in range(4)]
        incidents.update(made[0].id, {f.STATE: "resolved"})
        incidents.update(made[2].id, {f.STATE: "stable"})
        found = [incidents.get_by_ir(record.public_id) for record in made]
        assert [r.id for r in found] == [r.id for r in made]
        assert [r.state for r in found] == ["resolved", "active", "stable", "active"]
        with pytest.raises(NotFound):
            incidents.get_by_ir(made[-1].public_id + 1)
        for bad in (0, -1, True):
            with pytest.raises(ValidationFailed, match="positive integer"):
                incidents.get_by_ir(bad)

    def test_update_writes_some_fields_and_keeps_the_others(self, incidents: IncidentStore) -> None:
        created = incidents.create("GPU request", request_fields())
        updated = incidents.update(
            created.id, {f.STATE: "stable", f.PHASE: "allocated", f.HOSTS: ["gpu-node-01", "gpu-node-02"]}
        )
        assert updated.state == "stable"
        assert updated.fields[f.HOSTS] == ["gpu-node-01", "gpu-node-02"]
        assert updated.fields[f.TEAM] == "nlp"
        assert updated.title == "GPU request"
        assert incidents.get(created.id).fields[f.PHASE] == "allocated"
        retitled = incidents.update(created.id, {}, title="GPU request (extended)")
        assert retitled.title == "GPU request (extended)"
        assert retitled.state == "stable"

    def test_resolving_stamps_the_resolution_time(self, incidents: IncidentStore) -> None:
        created = incidents.create("GPU request", request_fields())
        assert created.resolved is None
        incidents.update(created.id, {f.STATE: "resolved", f.RECLAIM_REASON: "released"})
        resolved = incidents.get_by_ir(created.public_id)
        assert resolved.state == "resolved"
        assert resolved.resolved is not None

    def test_search_by_state(self, incidents: IncidentStore) -> None:
        live = incidents.create("live", request_fields("req-live"))
        held = incidents.create("held", request_fields("req-held"))
        ended = incidents.create("ended", request_fields("req-ended"))
        incidents.update(held.id, {f.STATE: "stable"})
        incidents.update(ended.id, {f.STATE: "resolved"})
        assert {r.id for r in incidents.search(IncidentQuery.where({State.ACTIVE, State.STABLE}))} == {live.id, held.id}
        assert [r.id for r in incidents.search(IncidentQuery.where({State.RESOLVED}))] == [ended.id]

    def test_a_request_id_finds_its_incident_and_a_repeated_create_returns_it(self, incidents: IncidentStore) -> None:
        first = incidents.create("GPU request", request_fields("req-dup"))
        assert incidents.find_by_request_id("req-dup") == first
        assert incidents.find_by_request_id("req-unknown") is None
        again = incidents.create("GPU request", request_fields("req-dup"))
        assert again.id == first.id
        assert [r.id for r in incidents.search(IncidentQuery.where({State.ACTIVE}))] == [first.id]

    def test_of_twin_incidents_for_one_request_the_lowest_ir_is_found(self, incidents: IncidentStore) -> None:
        # Two overlapping deliveries of one Slack request each created one; the later was closed as a duplicate.
        first = incidents.create("GPU request", request_fields("req-twin"))
        twin = incidents.create("GPU request", request_fields("req-twin-other"))
        incidents.update(twin.id, {f.REQUEST_ID: "req-twin", f.STATE: "resolved", f.PHASE: "rejected"})
        found = incidents.find_by_request_id("req-twin")
        assert found is not None and found.id == first.id and found.public_id < twin.public_id

    def test_an_unknown_field_is_refused_and_nothing_is_created(self, incidents: IncidentStore) -> None:
        with pytest.raises(ValidationFailed, match="no_such_field"):
            incidents.create("GPU request", {**request_fields(), "no_such_field": "x"})
        assert list(incidents.search(IncidentQuery())) == []


class HostTagsContract:
    """What placement, allocation and reclaim rely on from HostTags."""

    def test_tags_are_kept_per_source(self, hosts: HostTags, seed_hosts: SeedHosts) -> None:
        seed_hosts({"gpu-node-01": {"datadog": ["gpu_model:h100"], "user": ["gpufarm:managed"]}})
        assert hosts.get_tags("gpu-node-01") == ["gpufarm:managed"]
        assert hosts.get_tags("gpu-node-01", source="datadog") == ["gpu_model:h100"]

    def test_add_appends_normalized_tags_once(self, hosts: HostTags, seed_hosts: SeedHosts) -> None:
        seed_hosts({"gpu-node-01": {"user": ["gpufarm:managed"]}})
        added = hosts.add_tags("gpu-node-01", ["ir:IR-7", "project:llm-ko"])
        assert added == ["gpufarm:managed", "ir:ir-7", "project:llm-ko"]
        assert hosts.add_tags("gpu-node-01", ["ir:ir-7"]) == added
        assert hosts.get_tags("gpu-node-01") == added

    def test_replace_sets_a_source_and_an_empty_list_clears_it(self, hosts: HostTags, seed_hosts: SeedHosts) -> None:
        seed_hosts({"gpu-node-01": {"user": ["gpufarm:managed", "ir:ir-7"], "datadog": ["gpu_model:h100"]}})
        assert hosts.replace_tags("gpu-node-01", ["gpufarm:managed"]) == ["gpufarm:managed"]
        assert hosts.get_tags("gpu-node-01") == ["gpufarm:managed"]
        assert hosts.replace_tags("gpu-node-01", []) == []
        assert hosts.get_tags("gpu-node-01") == []
        assert hosts.get_tags("gpu-node-01", source="datadog") == ["gpu_model:h100"]

    def test_a_host_never_seen_has_no_tags(self, hosts: HostTags, seed_hosts: SeedHosts) -> None:
        assert hosts.get_tags("never-seen-host") == []

    def test_list_hosts_merges_sources_and_filters(self, hosts: HostTags, seed_hosts: SeedHosts) -> None:
        seed_hosts(
            {
                "gpu-node-01": {"datadog": ["gpu_model:h100"], "user": ["ir:ir-7"]},
                "gpu-node-02": {"datadog": ["gpu_model:a100"]},
            }
        )
        listed = {h.name: h for h in hosts.list_hosts()}
        assert set(listed) == {"gpu-node-01", "gpu-node-02"}
        assert set(listed["gpu-node-01"].tags) == {"gpu_model:h100", "ir:ir-7"}
        assert listed["gpu-node-01"].tags_by_source["user"] == ("ir:ir-7",)
        assert [h.name for h in hosts.list_hosts("gpu_model:a100")] == ["gpu-node-02"]
        assert [h.name for h in hosts.list_hosts("node-01")] == ["gpu-node-01"]

    def test_a_host_page_says_exactly_how_many_match(self, hosts: HostTags, seed_hosts: SeedHosts) -> None:
        # What a pool's host sizes are counted with (gpufarm.core.context.reads.Reads.host_sizes).
        assert isinstance(hosts, HostPages)
        seed_hosts(
            {f"gpu-node-0{i}": {"datadog": ["gpu_model:h100", f"gpu_count:{4 * (i % 2 + 1)}"]} for i in range(5)}
        )
        page = hosts.host_page("gpu_model:h100", 1, 2)
        assert [h.name for h in page.hosts] == ["gpu-node-01", "gpu-node-02"] and page.total == 5
        assert hosts.host_page("gpu_model:h100 gpu_count:8", 0, 1).total == 2
        assert hosts.host_page("gpu_model:a100", 0, 1) == HostPage((), 0)


class ChatContract:
    """What the service relies on from Chat: message timestamps, DMs, the operators' group and user names."""

    def test_every_post_gets_its_own_timestamp(self, chat: Chat) -> None:
        first = chat.post_message("C0000000001", "GPU request IR-1")
        second = chat.post_message("C0000000001", "GPU request IR-2", [{"type": "divider"}])
        dm = chat.tell_user("U0000000001", "IR-1 is allocated")
        assert len({first, second, dm}) == 3

    def test_a_users_dm_channel_is_stable(self, chat: Chat) -> None:
        channel = chat.open_dm("U0000000001")
        assert channel.startswith("D")
        assert chat.open_dm("U0000000001") == channel

    def test_group_members_are_listed_and_an_unknown_group_fails(self, chat: Chat, seed_group: SeedGroup) -> None:
        seed_group("S0000000007", ["U0000000001", "U0000000002"])
        assert chat.usergroup_members("S0000000007") == frozenset({"U0000000001", "U0000000002"})
        # "Nobody is an operator" must never stand in for "Slack could not say".
        with pytest.raises(UpstreamError):
            chat.usergroup_members("S0000000404")

    def test_a_home_is_published_and_a_view_that_is_no_home_is_refused(self, chat: Chat) -> None:
        home = {"type": "home", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*Your GPUs*"}}]}
        chat.publish_home("U0000000001", home)
        chat.publish_home("U0000000001", {**home, "blocks": [{"type": "divider"}]})
        with pytest.raises(UpstreamError):
            chat.publish_home("U0000000001", {**home, "type": "modal"})
        with pytest.raises(UpstreamError):
            chat.publish_home("U0000000001", {**home, "blocks": [{"type": "divider"}] * 101})

    def test_an_unknown_user_is_named_by_its_id(self, chat: Chat) -> None:
        assert chat.user_name("U0000000404") == "U0000000404"

    def test_each_upload_gets_its_own_file_id_and_a_path_as_name_is_refused(self, chat: Chat) -> None:
        first = chat.upload_file("C0000000001", "report-2026-11.csv", b"team,hours\nnlp,1\n", title="November")
        second = chat.upload_file(
            "C0000000001", "report-2026-11.csv", b"team,hours\n", title="November", initial_comment="again"
        )
        assert first and second and first != second
        with pytest.raises(ValidationFailed):
            chat.upload_file("C0000000001", "../report.csv", b"x", title="report")


class WorkQueueContract:
    """What the serialized allocation path relies on from WorkQueue: order within a group, duplicates dropped."""

    def test_messages_keep_their_group_and_order(self, queue: WorkQueue, received: Received) -> None:
        queue.send({"incident_id": "a"}, group="pool:onprem-hpc", dedup_id="a-approved")
        queue.send({"incident_id": "b"}, group="pool:onprem-hpc", dedup_id="b-approved")
        assert received() == [("pool:onprem-hpc", {"incident_id": "a"}), ("pool:onprem-hpc", {"incident_id": "b"})]

    def test_a_repeated_dedup_id_is_dropped(self, queue: WorkQueue, received: Received) -> None:
        queue.send({"incident_id": "a"}, group="pool:cloud", dedup_id="a-approved")
        queue.send({"incident_id": "a", "again": True}, group="pool:cloud", dedup_id="a-approved")
        assert received() == [("pool:cloud", {"incident_id": "a"})]
