"""The organization's other incidents are never read, changed or counted by gpufarm.

The sandbox is set up as `gpufarm datadog apply` leaves an organization, then seeded with foreign incidents:
on the default type and on a "Security Incident" type, with gpufarm's own field names defined on those types
and gpufarm-looking values in them (team, pool, GPUs, hosts, an expiry in the past, and the very request id
gpufarm is about to use). The runtime gateway and the lifecycle service on top of it must ignore every one of
them: in the create dedup lookup, get / get_by_ir / update / delete, search, the scheduled sync and its quota
gauges, the release path, and the notification rules that call gpufarm's incident webhook.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeMetrics
from helpers import Receiver, http

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.adapters.incident_search import Facet
from gpufarm.config import SecretStr, Settings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound
from gpufarm.core.kernel.lifecycle import State
from gpufarm.core.kernel.search import ANY_STATE_QUERY, LIVE_QUERY, IncidentQuery
from gpufarm.core.service import GpuFarm
from gpufarm.setup import apply as setup
from gpufarm.setup import plan as planning
from gpufarm_node.tags import registration_tags
from gpufarm_sandbox.emulator.app import Sandbox
from gpufarm_sandbox.emulator.server import ServerThread

pytestmark = pytest.mark.contract

SECRET = "hook-secret-for-foreign-tests-0123"
VALUES = {"team": ["nlp", "vision"], "gpu_model": ["A100", "H100", "L4"], "environment": ["cloud", "hpc", "slices"]}
SHARED_REQUEST = "req-shared-00000001"
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@dataclass
class Org:
    """The sandbox organization: gpufarm set up, foreign incidents seeded."""

    url: str
    sandbox: Sandbox
    receiver: Receiver
    default_type: str
    security_type: str
    foreign: list[dict[str, Any]]

    def create_foreign(self, type_id: str, title: str, values: dict[str, object]) -> dict[str, Any]:
        """An incident of another team, carrying gpufarm-looking field values."""
        body = {
            "data": {
                "type": "incidents",
                "attributes": {
                    "title": title,
                    "customer_impacted": False,
                    "incident_type_uuid": type_id,
                    "fields": f.encode_fields(values),
                },
            }
        }
        status, answer = http(f"{self.url}/api/v2/incidents", "POST", body)
        assert status == 201, answer
        incident: dict[str, Any] = answer["data"]
        self.foreign.append(incident)
        return incident

    def stored(self, incident_id: str) -> dict[str, Any]:
        """The sandbox's record of an incident (fields as plain values, modified time)."""
        return next(i for i in self.sandbox.incidents.dump()["incidents"] if i["id"] == incident_id)


def _lease_values(request_id: str, **overrides: object) -> dict[str, object]:
    """What a live gpufarm allocation holds: team nlp, 8 H100 in hpc on hpc-01, expired yesterday."""
    values: dict[str, object] = {
        f.STATE: "stable",
        f.PHASE: "allocated",
        f.TEAM: "nlp",
        f.PROJECT: "llm-ko",
        f.GPU_MODEL: "H100",
        f.GPU_COUNT: "8",
        f.ENVIRONMENT: "hpc",
        f.REQUESTER: "U0000000001",
        f.EXPIRES_AT: (NOW - timedelta(days=1)).isoformat(),
        f.HOSTS: ["hpc-01"],
        f.HOST_GPUS: ["hpc-01=8"],
        f.APPROVED_BY: "policy",
        f.REQUEST_ID: request_id,
    }
    values.update(overrides)
    return values


@pytest.fixture
def settings(dd_env: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings aimed at the sandbox."""
    monkeypatch.setenv("GPUFARM_WEBHOOK_SECRET", SECRET)
    return Settings(max_retries=1, http_timeout=5)


@pytest.fixture
def org(settings: Settings, sandbox: Sandbox, sandbox_url: str) -> Iterator[Org]:
    """gpufarm applied (its webhook aimed at a recorder), and two foreign types with gpufarm's field names."""
    receiver = Receiver()
    with ServerThread(receiver) as server:
        admin = DatadogAdmin(settings)
        spec = planning.SetupSpec(
            incident_webhook_url=f"{server.url}/fn/incident_webhook/",
            idle_webhook_url=f"{server.url}/fn/idle_alert/",
            valid_values=VALUES,
            has_secret=True,
        )
        assert not setup.apply_setup(admin, spec, secret=SecretStr(SECRET)).blocked
        default = next(str(t["id"]) for t in admin.list_incident_types() if t["attributes"]["is_default"])
        security = str(admin.create_incident_type("Security Incident", "breaches")["id"])
        for type_id in (default, security):
            for _, attributes in planning.desired_fields(VALUES):
                assert attributes is not None
                admin.create_field_definition(attributes, type_id)
        # What the org's own on-call set up: every default-type incident pages through another handle.
        admin.create_notification_rule({**planning.desired_rules()[0], "handles": ["@oncall-sre"]}, default)
        admin.close()
        world = Org(sandbox_url, sandbox, receiver, default, security, [])
        world.create_foreign(default, "Checkout latency", _lease_values(SHARED_REQUEST))
        world.create_foreign(security, "Leaked token", _lease_values(SHARED_REQUEST, **{f.TEAM: "vision"}))
        yield world


@pytest.fixture
def gateway(settings: Settings) -> Iterator[DatadogGateway]:
    """The runtime gateway."""
    gw = DatadogGateway(settings, create_backoff_s=0.05)
    yield gw
    gw.close()


def _service(gateway: DatadogGateway, metrics: FakeMetrics) -> GpuFarm:
    return GpuFarm(
        incidents=gateway,
        hosts=gateway,
        chat=FakeChat(operators=frozenset({"U0000000OPS"})),
        clock=FakeClock(NOW),
        farm=parse_farm(FARM_YAML),
        metrics=metrics,
    )


# -- the gateway ------------------------------------------------------------------------------------------------


def test_create_dedup_never_returns_a_foreign_incident(org: Org, gateway: DatadogGateway) -> None:
    assert gateway.find_by_request_id(SHARED_REQUEST) is None
    ours = gateway.create("GPU request: nlp/llm-ko 8xH100 (hpc)", _lease_values(SHARED_REQUEST, **{f.STATE: "active"}))
    assert ours.id not in {i["id"] for i in org.foreign}
    assert org.stored(ours.id)["incident_type_id"] == gateway.incident_type_id
    assert gateway.create("again", _lease_values(SHARED_REQUEST)).id == ours.id
    # The scan reads gpufarm's newest incidents only: 60 newer foreign ones do not push ours out of it.
    for n in range(60):
        org.create_foreign(org.default_type, f"noise {n}", _lease_values(SHARED_REQUEST))
    scanning = DatadogGateway(gateway.settings, request_id_scan=50)
    assert scanning.find_by_request_id(SHARED_REQUEST) == gateway.get(ours.id)
    scanning.close()


def test_a_foreign_incident_is_not_a_lease_and_is_never_changed(org: Org, gateway: DatadogGateway) -> None:
    before = {i["id"]: org.stored(i["id"]) for i in org.foreign}
    for incident in org.foreign:
        ir = int(incident["attributes"]["public_id"])
        with pytest.raises(NotFound, match="not a gpufarm allocation"):
            gateway.get(incident["id"])
        with pytest.raises(NotFound, match=f"IR-{ir} is not a gpufarm allocation"):
            gateway.get_by_ir(ir)
        with pytest.raises(NotFound):
            gateway.update(incident["id"], {f.PHASE: "reclaimed", f.STATE: "resolved"})
        with pytest.raises(NotFound):
            gateway.delete(incident["id"])
    assert {i["id"]: org.stored(i["id"]) for i in org.foreign} == before


def test_search_sees_gpufarm_incidents_only(org: Org, gateway: DatadogGateway) -> None:
    ours = gateway.create("GPU request", _lease_values("req-ours-0001"))
    narrowed = (IncidentQuery.where(team="nlp"), IncidentQuery.where({State.STABLE}, gpu_model="H100"))
    for query in (LIVE_QUERY, ANY_STATE_QUERY, *narrowed):
        assert [r.id for r in gateway.search(query)] == [ours.id], query


def test_each_answer_is_checked_even_when_the_search_filter_is_ignored(
    org: Org, gateway: DatadogGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: if Datadog ignored the type facet, each incident's own type still keeps it out."""
    ours = gateway.create("GPU request", _lease_values("req-ours-0002"))
    gateway.facets.lose(Facet.TYPE, "ignored (a test says so)")
    assert len(list(gateway.search(LIVE_QUERY))) == 1
    org.create_foreign(org.security_type, "Newer, same request", _lease_values("req-ours-0002"))
    assert gateway.find_by_request_id("req-ours-0002") == gateway.get(ours.id)
    with pytest.raises(NotFound):
        gateway.get_by_ir(int(org.foreign[-1]["attributes"]["public_id"]))


def test_without_gpufarm_s_type_the_runtime_says_to_run_apply(settings: Settings, sandbox: Sandbox) -> None:
    from gpufarm.core.kernel.errors import UpstreamError

    gateway = DatadogGateway(settings)
    with pytest.raises(UpstreamError, match="run `gpufarm datadog apply`"):
        gateway.create("GPU request", {f.STATE: "active"})
    with pytest.raises(UpstreamError, match="default type"):
        DatadogGateway(settings.replace(incident_type="Incident")).get_by_ir(1)
    gateway.close()


# -- the lifecycle service on the gateway ------------------------------------------------------------------------


def test_sync_counts_and_release_ignore_foreign_incidents(org: Org, gateway: DatadogGateway, sandbox_url: str) -> None:
    hosts = [
        {"name": f"hpc-0{i}", "tags": {"user": registration_tags("H100", 8, "hpc", "a")}, "reporting": True}
        for i in (1, 2)
    ]
    assert http(f"{sandbox_url}/_sandbox/hosts", "POST", {"hosts": hosts})[0] == 200
    before = {i["id"]: org.stored(i["id"]) for i in org.foreign}
    metrics = FakeMetrics()
    svc = _service(gateway, metrics)

    report = svc.sync()
    assert (report.expired, report.idle_reclaimed, report.conflicts) == ([], [], [])
    held = metrics.value("gpufarm.quota.allocated", "team:nlp", "environment:hpc", "gpu_model:h100")
    assert held == 0  # the foreign "8 H100 held by nlp in hpc" is not counted
    assert metrics.value("gpufarm.inventory.gpus.free", "environment:hpc", "gpu_model:h100") == 16

    for incident in org.foreign:
        ir = int(incident["attributes"]["public_id"])
        with pytest.raises(NotFound):
            svc.status(ir, "U0000000001")
        with pytest.raises(NotFound):
            svc.release(ir, "U0000000001")
        with pytest.raises(NotFound):
            svc.process(incident["id"])
    assert {i["id"]: org.stored(i["id"]) for i in org.foreign} == before

    # Quota: nlp's 8 H100 in hpc are free (the foreign incident holds none), so policy approves at once.
    request = build_request(
        {"gpu_count": "8", "gpu_model": "H100", "environment": "hpc", "team": "nlp", "project": "llm-ko"},
        svc.context.farm,
        requester="U0000000001",
        channel="C0000000002",
        request_id="req-ours-0003",
    )
    svc.submit_request(request)
    created = gateway.find_by_request_id("req-ours-0003")
    assert created is not None
    assert created.fields[f.PHASE] == "approved"
    assert created.fields[f.APPROVED_BY] == "policy"


def test_notification_rules_call_gpufarm_only_for_its_incidents(org: Org, gateway: DatadogGateway) -> None:
    for incident in list(org.foreign):
        body = {"data": {"type": "incidents", "attributes": {"fields": f.encode_fields({f.PHASE: "reclaimed"})}}}
        status, _ = http(f"{org.url}/api/v2/incidents/{incident['id']}", "PATCH", body)
        assert status == 200
    org.create_foreign(org.default_type, "Another outage", _lease_values("req-foreign-9"))
    assert org.sandbox.webhooks.drain(10)
    assert org.receiver.bodies == []
    # The org's own rule still pages for its own incidents: gpufarm's setup left it alone.
    fired = org.sandbox.incidents.dump()["notifications"]
    assert {n["handle"] for n in fired} == {"@oncall-sre"}

    ours = gateway.create("GPU request", _lease_values("req-ours-0004", **{f.STATE: "active", f.PHASE: "requested"}))
    gateway.update(ours.id, {f.PHASE: "approved"})
    assert org.sandbox.webhooks.drain(10)
    # Both changes call gpufarm; deliveries run concurrently (as Datadog's do), so their order is not promised and
    # the webhook re-reads the incident anyway.
    assert sorted((c["incident_uuid"], c["incident_fields"]["phase"]) for c in org.receiver.bodies) == [
        (ours.id, "approved"),
        (ours.id, "requested"),
    ]
