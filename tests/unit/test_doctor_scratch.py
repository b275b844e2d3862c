"""gpufarm doctor's checks that write, on fakes: the probe incident's webhook round trip and the scratch tag,
each removed however its check ends (done, failed, interrupted, its create's answer lost); and a run that stops
at refused keys, before anything is written."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeHosts

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.setup.doctor import roundtrip, tags
from gpufarm.setup.doctor.ports import Collaborators, Options, Timing
from gpufarm.setup.doctor.report import Line, Status
from gpufarm.setup.doctor.run import run_checks
from gpufarm.setup.doctor.scratch import CLEANUP, Scratch

HEADER_OBJECT = "token in header; fields as object; trigger resolved/reclaimed"


class Ticks:
    """A clock that moves only when the check sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def timing(wait_s: float = 6.0) -> tuple[Timing, Ticks]:
    ticks = Ticks()
    return Timing(wait_s, ticks.clock, ticks.sleep), ticks


class ProbeStore:
    """Incidents in memory whose 'webhook' notes a change as the consumer would, as configured:
    `on` holds the fields whose change fires it ('created' for the creation), `note` what it writes."""

    def __init__(self, on: frozenset[str], note: str = HEADER_OBJECT, lose_create_answer: bool = False) -> None:
        self.on, self.note, self.lose = on, note, lose_create_answer
        self.records: dict[str, IncidentRecord] = {}
        self.seen: dict[str, list[str]] = {}
        self.deleted: list[str] = []

    @property
    def incident_type_id(self) -> str:
        return "t1"

    def create(self, title: str, fields: Mapping[str, object]) -> IncidentRecord:
        record = IncidentRecord(id=f"i{len(self.records) + 1}", public_id=1, title=title, state="resolved")
        record = record.model_copy(update={"fields": {k: v for k, v in fields.items() if k != f.STATE}})
        self.records[record.id] = record
        self.seen[record.id] = [self.note] if "created" in self.on else []
        if self.lose:
            raise UpstreamError("Datadog create incident failed: no answer in time (ReadTimeoutError)")
        return record

    def get(self, incident_id: str) -> IncidentRecord:
        if incident_id not in self.records:
            raise NotFound(incident_id)
        return self.records[incident_id]

    def update(self, incident_id: str, fields: Mapping[str, object]) -> IncidentRecord:
        record = self.get(incident_id)
        state = str(fields.get(f.STATE, record.state))
        changed = {k: v for k, v in fields.items() if k != f.STATE}
        record = record.model_copy(update={"state": state, "fields": {**record.fields, **changed}})
        self.records[incident_id] = record
        if set(fields) & self.on:
            self.seen[incident_id].append(self.note)
        return record

    def delete(self, incident_id: str) -> None:
        self.get(incident_id)
        del self.records[incident_id]
        self.deleted.append(incident_id)

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        return next((r for r in self.records.values() if r.fields.get(f.REQUEST_ID) == request_id), None)


@pytest.fixture
def store_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ProbeStore]]:
    """The probe module as the round trip sees it, reading the fake store's notes."""
    stores: list[ProbeStore] = []
    fake = SimpleNamespace(
        probe_fields=lambda token, environment, team: {
            f.REQUEST_ID: f"doctor-{token}",
            f.STATE: "resolved",
            f.PHASE: "rejected",
            f.ENVIRONMENT: environment,
            f.TEAM: team,
        },
        webhook_arrivals=lambda record: list(stores[0].seen.get(record.id, [])),
    )
    monkeypatch.setattr(roundtrip, "probe", fake)
    yield stores


def round_trip(store: ProbeStore, renotify: list[str], wait_s: float = 6.0) -> tuple[Line, Scratch]:
    scratch = Scratch()
    clock, _ = timing(wait_s)
    with roundtrip.probe_incident(store, scratch, "hpc", "nlp") as record:
        line = roundtrip.check_round_trip(store, record.id, renotify, clock)
    return line, scratch


@pytest.mark.parametrize(
    ("on", "note", "status", "says"),
    [
        ({"created", f.PHASE, f.STATE}, HEADER_OBJECT, Status.CONFIRMED, "fired on a phase change"),
        ({"created", f.STATE}, HEADER_OBJECT, Status.FELL_BACK, "fired only after a state change"),
        ({"created", f.PHASE}, "token in payload; fields as string; trigger x/y", Status.FELL_BACK, "in the payload"),
        ({"created", f.PHASE}, "token in header; fields as string; trigger x/y", Status.FELL_BACK, "as a string"),
        (set(), HEADER_OBJECT, Status.BROKEN, "neither the creation"),
        ({"created"}, HEADER_OBJECT, Status.BROKEN, "no change after the creation"),
    ],
)
def test_the_round_trip_reads_how_the_webhook_came(
    store_probe: list[ProbeStore], on: set[str], note: str, status: Status, says: str
) -> None:
    store = ProbeStore(frozenset(on), note)
    store_probe.append(store)
    line, scratch = round_trip(store, ["state", "phase"])
    assert line.status is status and says in line.detail, line
    assert store.records == {} and store.deleted == ["i1"] and scratch.left == []


def test_a_rule_that_renotifies_on_state_only_is_tried_with_a_state_change(store_probe: list[ProbeStore]) -> None:
    store = ProbeStore(frozenset({"created", f.STATE}))
    store_probe.append(store)
    line, _ = round_trip(store, ["state"])
    assert line.status is Status.FELL_BACK and store.records == {}


def test_a_create_whose_answer_was_lost_is_found_and_deleted(store_probe: list[ProbeStore]) -> None:
    store = ProbeStore(frozenset({"created"}), lose_create_answer=True)
    store_probe.append(store)
    with pytest.raises(UpstreamError):
        round_trip(store, ["phase"])
    assert store.records == {} and store.deleted == ["i1"]


def test_an_interrupt_while_waiting_deletes_the_probe(store_probe: list[ProbeStore]) -> None:
    store = ProbeStore(frozenset())
    store_probe.append(store)
    scratch = Scratch()

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), roundtrip.probe_incident(store, scratch, "hpc", "nlp") as record:
        roundtrip.check_round_trip(store, record.id, ["phase"], Timing(5.0, lambda: 0.0, interrupted))
    assert store.records == {}


def test_the_deployed_rule_is_the_one_on_gpufarms_type_calling_its_webhook() -> None:
    def rule(type_id: str, trigger: str = roundtrip.MODIFIED_TRIGGER, enabled: bool = True) -> dict[str, Any]:
        attributes = {"trigger": trigger, "handles": ["@webhook-gpufarm-incidents"], "enabled": enabled}
        return {"attributes": attributes, "relationships": {"incident_type": {"data": {"id": type_id}}}}

    ours = rule("t1")
    assert roundtrip.deployed_rule([rule("t2"), rule("t1", "incident_created_trigger"), ours], "t1") is ours
    assert roundtrip.deployed_rule([rule("t1", enabled=False)], "t1") is None


# -- the scratch tag ------------------------------------------------------------------------------------------------


class ListedHosts(FakeHosts):
    """FakeHosts with the host list's sources as Datadog spells them: `user` as `spelled`, or, `lagging`, without
    the user source at all (a list that has not caught up)."""

    def __init__(self, spelled: str = "user", lagging: bool = False) -> None:
        super().__init__()
        self.spelled, self.lagging = spelled, lagging

    def listed_sources(self, host: str) -> dict[str, tuple[str, ...]] | None:
        if host not in self.tags:
            return None
        by = {(self.spelled if k == "user" else k): tuple(v) for k, v in self.tags[host].items()}
        return {k: v for k, v in by.items() if not (self.lagging and k == self.spelled)}


@pytest.mark.parametrize(("spelled", "status"), [("user", Status.CONFIRMED), ("User", Status.FELL_BACK)])
def test_the_tag_is_written_read_back_and_only_it_removed(spelled: str, status: Status) -> None:
    hosts = ListedHosts(spelled)
    hosts.seed("hpc-a-01", "h100", 8, "hpc")
    hosts.add_tags("hpc-a-01", ["ir:ir-7"])
    scratch = Scratch()
    line = tags.check_tags(hosts, "hpc-a-01", timing()[0], scratch)
    assert line.status is status and (spelled == "user" or "'User'" in line.detail)
    assert hosts.user("hpc-a-01") == ["ir:ir-7"] and scratch.left == []


def test_an_unknown_host_writes_nothing_and_no_host_skips() -> None:
    hosts = ListedHosts()
    line = tags.check_tags(hosts, "nowhere", timing()[0], Scratch())
    assert line.status is Status.BROKEN and hosts.writes == 0
    assert tags.check_tags(hosts, None, timing()[0], Scratch()).status is Status.SKIPPED


def test_a_tag_the_host_list_never_shows_is_broken_and_still_removed() -> None:
    hosts = ListedHosts(lagging=True)
    hosts.seed("hpc-a-01", "h100", 8, "hpc")
    clock, ticks = timing(4.0)
    line = tags.check_tags(hosts, "hpc-a-01", clock, Scratch())
    assert line.status is Status.BROKEN and "within 4 s" in line.detail
    assert hosts.user("hpc-a-01") == [] and ticks.now >= 4.0


# -- scratch and the run --------------------------------------------------------------------------------------------


def test_a_removal_that_fails_is_a_cleanup_line_naming_what_was_left() -> None:
    scratch = Scratch()

    def fails() -> None:
        raise UpstreamError("Datadog delete incident failed: HTTP 503")

    with scratch.kept("probe incident doctor-1", fails):
        pass
    [left] = scratch.left
    assert left.check == CLEANUP and left.status is Status.BROKEN and "doctor-1" in left.detail


def test_refused_keys_stop_the_run_before_anything_is_written() -> None:
    class Refused:
        calls: list[str] = []

        def api_key_valid(self) -> bool:
            self.calls.append("validate")
            return False

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"{name} called after the keys were refused")

    emitted: list[Line] = []
    collaborators = Collaborators(
        admin=Refused(),  # type: ignore[arg-type]
        incidents=None,  # type: ignore[arg-type]
        hosts=None,  # type: ignore[arg-type]
        searches=None,  # type: ignore[arg-type]
        slack=None,
        url_answer=lambda *args: (401, ""),
    )
    lines = run_checks(
        collaborators, Options("https://api.datadoghq.com", "GPU allocation", None, host="h"), emitted.append
    )
    assert lines == emitted and len(lines) == 1 and lines[0].detail.startswith("bad API key")


def test_the_probe_lives_in_the_farms_first_pool_or_the_fields_first_choices() -> None:
    from fakes import FARM_YAML

    from gpufarm.core.config.farm import parse_farm

    class Fields:
        def __init__(self, *definitions: dict[str, Any]) -> None:
            self.definitions = list(definitions)

        def list_field_definitions(self, incident_type_id: str | None = None) -> list[dict[str, Any]]:
            return self.definitions

    def dropdown(name: str, *values: str) -> dict[str, Any]:
        return {"attributes": {"name": name, "valid_values": [{"value": v, "display_name": v} for v in values]}}

    farm = parse_farm(FARM_YAML)
    expected = (sorted(farm.environments)[0], sorted(farm.teams)[0])
    assert roundtrip.probe_pool(Fields(), "t1", farm) == expected  # type: ignore[arg-type]
    held = Fields(dropdown("team", "vision", "nlp"), dropdown("environment", "onprem-hpc"))
    assert roundtrip.probe_pool(held, "t1", None) == ("onprem-hpc", "vision")  # type: ignore[arg-type]
    assert roundtrip.probe_pool(Fields(dropdown("team", "nlp")), "t1", None) is None  # type: ignore[arg-type]


def test_sigterm_stops_doctor_as_ctrl_c_does() -> None:
    import os
    import signal
    import time

    from gpufarm.cli.doctor import _sigterm_interrupts

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), _sigterm_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGTERM) is before
