"""Exact units through the real Datadog adapter against the sandbox: the incident field, the gpu_assign host tags
set on allocation, removed on release, and repaired by the sync."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock
from helpers import define_gpufarm_type, http

from gpufarm.adapters.datadog import DatadogGateway
from gpufarm.adapters.datadog_admin import DatadogAdmin
from gpufarm.config import Settings
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel import units
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.service import GpuFarm
from gpufarm_node.tags import registration_tags, unit_tag
from gpufarm_sandbox.emulator.app import Sandbox

pytestmark = pytest.mark.contract

HOST = "slice-mig-01"
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
VALUES = {"team": ["nlp", "vision"], "gpu_model": ["A100"], "environment": ["slices"]}


def _mig(gpu: int, slot: int) -> str:
    return f"MIG-{gpu:04x}{slot:04x}-2222-4222-8222-222222222222"


@pytest.fixture
def svc(settings: Settings, sandbox: Sandbox, sandbox_url: str) -> Iterator[GpuFarm]:
    """The lifecycle on the real gateway; the sandbox knows one sliced host (2 x A100 in MIG 7 x 1g.10gb)."""
    admin = DatadogAdmin(settings)
    define_gpufarm_type(admin, settings.incident_type, VALUES)
    admin.close()
    slices = [unit_tag(g, _mig(g, s), s + 1, "1g.10gb") for g in range(2) for s in range(7)]
    tags = registration_tags("A100", 2, "slices", "k8s", slices)
    status, answer = http(
        f"{sandbox_url}/_sandbox/hosts", "POST", {"hosts": [{"name": HOST, "tags": {"user": tags}, "reporting": True}]}
    )
    assert status in (200, 201), answer
    gateway = DatadogGateway(settings, create_backoff_s=0.05)
    yield GpuFarm(incidents=gateway, hosts=gateway, chat=FakeChat(), clock=FakeClock(NOW), farm=parse_farm(FARM_YAML))
    gateway.close()


def _lease(svc: GpuFarm, count: int, n: int) -> Allocation:
    values = {"gpu_count": str(count), "gpu_model": "A100", "environment": "slices", "team": "nlp", "project": "p"}
    request = build_request(
        values, svc.context.farm, requester="U0000000001", channel=None, request_id=f"req-units-{n:04d}"
    )
    created = svc.context.incidents.create(request.title(), request.to_fields(Phase.APPROVED, NOW))
    assert [o.action for o in svc.process(created.id)] == ["allocated"]
    return Allocation.from_record(svc.context.incidents.get(created.id))


def _assigned(svc: GpuFarm) -> list[str]:
    return sorted(t for t in svc.context.hosts.get_tags(HOST) if t.startswith("gpu_assign:"))


def test_units_are_recorded_tagged_released_and_repaired(svc: GpuFarm, sandbox: Sandbox) -> None:
    first, second = _lease(svc, 3, 1), _lease(svc, 2, 2)
    mine, theirs = units.lease_devices(first)[HOST], units.lease_devices(second)[HOST]
    assert len(mine) == 3 and len(theirs) == 2 and not {u.id for u in mine} & {u.id for u in theirs}
    # Datadog keeps the field as written; the tags come back lowercased, one per unit.
    stored = next(i for i in sandbox.incidents.dump()["incidents"] if i["id"] == first.incident_id)
    assert stored["fields"][f.DEVICES] == units.encode_devices({HOST: mine})
    expected = [f"gpu_assign:ir-{a.ir}/{u.id}" for a, held in ((first, mine), (second, theirs)) for u in held]
    assert _assigned(svc) == sorted(expected)
    assert all(u.id == u.id.lower() and u.id.startswith("mig-") for u in mine)
    # Drift: one of the second lease's tags lost, a stray one for the first lease added; the sync puts both right.
    lost = f"gpu_assign:ir-{second.ir}/{theirs[0].id}"
    stray = f"gpu_assign:ir-{first.ir}/{_mig(1, 6).lower()}"
    current = svc.context.hosts.get_tags(HOST)
    svc.context.hosts.replace_tags(HOST, [*(t for t in current if t != lost), stray])
    repair = svc.reconcile_pool("slices")
    assert f"{HOST}:{lost}" in repair.restored and f"{HOST}:{stray}" in repair.removed
    assert _assigned(svc) == sorted(expected)
    # Release: exactly the first lease's tags go; the second's and the agent's unit tags stay.
    svc.release(first.ir, "U0000000001")
    svc.process(first.incident_id)
    assert _assigned(svc) == sorted(f"gpu_assign:ir-{second.ir}/{u.id}" for u in theirs)
    assert len([t for t in svc.context.hosts.get_tags(HOST) if t.startswith("gpu_unit:")]) == 14
    assert Allocation.from_record(svc.context.incidents.get(first.incident_id)).devices == ()
