"""Exact units on shared pools: the gpu_unit tags parsed, units chosen without sharing, recorded, tagged, shown."""

from __future__ import annotations

import itertools

import pytest
from fakes import FARM_YAML, FakeChat, FakeClock, FakeHosts, FakeIncidents

from gpufarm.core.chat.messages import allocated, list_message, status_message
from gpufarm.core.config.farm import parse_farm
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import units
from gpufarm.core.kernel.hosts import MAX_UNITS, GpuHost, GpuUnit, parse_units
from gpufarm.core.kernel.lifecycle import Phase
from gpufarm.core.kernel.model import Allocation
from gpufarm.core.service import GpuFarm
from gpufarm_node.tags import registration_tags, unit_tag

USER = "U0000000001"
OTHER = "U0000000002"
OPS = "U0000000OPS"
_ids = itertools.count(1)


def _gpu_uuid(i: int) -> str:
    return f"gpu-{i:08x}-0000-4000-8000-000000000000"


def _mig_uuid(gpu: int, slot: int) -> str:
    return f"mig-{gpu:04x}{slot:04x}-1111-4111-8111-111111111111"


def _mig_tags(gpus: int = 2, slices: int = 7, profile: str = "1g.10gb") -> list[str]:
    return [unit_tag(g, _mig_uuid(g, s), s + 7, profile) for g in range(gpus) for s in range(slices)]


def _host(tags: list[str], count: int = 2) -> GpuHost:
    host = GpuHost.from_tags("h1", [*registration_tags("A100", count, "slices", "k8s"), *tags])
    assert host is not None
    return host


# -- parsing ------------------------------------------------------------------------------------------------------


def test_unit_tags_round_trip_for_whole_gpus_and_mig_slices() -> None:
    whole = GpuUnit.parse(f"3/{_gpu_uuid(3)}")
    mig = GpuUnit.parse(f"1.9/{_mig_uuid(1, 2)}/1g.10gb")
    index_only = GpuUnit.parse("5")
    assert whole == GpuUnit(3, None, _gpu_uuid(3))
    assert mig == GpuUnit(1, 9, _mig_uuid(1, 2), "1g.10gb")
    assert index_only == GpuUnit(5)
    assert (whole.label, mig.label, mig.is_mig, whole.is_mig) == ("3", "1.9", True, False)
    assert (whole.id, index_only.id) == (_gpu_uuid(3), "5")
    for unit in (whole, mig, index_only):
        assert GpuUnit.parse(unit.tag_value()) == unit


@pytest.mark.parametrize(
    "text",
    [
        "",
        "64/" + _gpu_uuid(1),  # past MAX_GPU_INDEX
        "²/" + _gpu_uuid(1),
        "1.x/" + _mig_uuid(1, 1) + "/1g.10gb",
        "1/" + _mig_uuid(1, 1),  # a whole GPU with a MIG uuid
        "1.2/" + _gpu_uuid(1) + "/1g.10gb",  # a slice with a GPU uuid
        "1.2/" + _mig_uuid(1, 1),  # a slice without its profile
        "1.2",  # a slice known by index only
        "1/" + _gpu_uuid(1) + "/1g.10gb",  # a whole GPU has no profile
        "1.2/" + _mig_uuid(1, 1) + "/huge profile",
        "1/nvidia",
        "1/a/b/c",
    ],
)
def test_malformed_unit_tags_are_skipped(text: str) -> None:
    assert GpuUnit.parse(text) is None


def test_a_host_publishing_units_schedules_them_in_gpu_and_instance_order() -> None:
    tags = list(reversed(_mig_tags()))
    host = _host([*tags, tags[0], "gpu_unit:garbage"])
    assert len(host.units) == 14
    assert [u.label for u in host.units[:3]] == ["0.7", "0.8", "0.9"]
    assert {u.profile for u in host.units} == {"1g.10gb"}


def test_a_host_without_unit_tags_falls_back_to_its_gpu_count_by_index() -> None:
    host = _host([], count=4)
    assert host.units == (GpuUnit(0), GpuUnit(1), GpuUnit(2), GpuUnit(3))


def test_unit_tags_are_bounded() -> None:
    many = [unit_tag(i % 60, f"gpu-{i:08x}-0000-4000-8000-000000000000") for i in range(MAX_UNITS + 50)]
    assert len(parse_units(many)) == MAX_UNITS


def test_devices_field_round_trips_and_skips_garbage() -> None:
    devices = {"h2": (GpuUnit(0),), "h1": (GpuUnit(1, 8, _mig_uuid(1, 1), "1g.10gb"), GpuUnit(0, None, _gpu_uuid(0)))}
    entries = units.encode_devices(devices)
    assert entries[0].startswith("h1=") and entries[-1] == "h2=0"
    assert units.decode_devices([*entries, "nohost", "=1", "h3=99", entries[0]]) == {
        "h1": devices["h1"],
        "h2": devices["h2"],
    }


# -- choosing ------------------------------------------------------------------------------------------------------


def _slices(gpu: int, slots: range) -> list[GpuUnit]:
    return [GpuUnit(gpu, s, _mig_uuid(gpu, s), "1g.10gb") for s in slots]


def test_a_small_request_fills_the_fullest_gpu_and_keeps_a_whole_one_free() -> None:
    free = [*_slices(0, range(4, 7)), *_slices(1, range(7))]
    chosen = units.choose_units(free, 2)
    assert chosen is not None and {u.index for u in chosen} == {0}
    bigger = units.choose_units(free, 5)
    assert bigger is not None and {u.index for u in bigger} == {1}


def test_a_request_larger_than_any_gpu_spans_the_fewest() -> None:
    free = [*_slices(0, range(2)), *_slices(1, range(7)), *_slices(2, range(5))]
    chosen = units.choose_units(free, 9)
    assert chosen is not None and len(chosen) == 9
    assert {u.index for u in chosen} == {1, 2}
    assert units.choose_units(free, 15) is None
    assert units.choose_units(free, 0) is None


def test_a_retry_prefers_the_units_it_tagged_before() -> None:
    free = _slices(0, range(7))
    chosen = units.choose_units(free, 2, prefer=[free[5].id, free[3].id])
    assert chosen is not None and {u.gi for u in chosen} == {3, 5}


def test_units_held_by_count_only_still_reduce_the_host() -> None:
    host = _host(_mig_tags(1, 7))
    legacy = Allocation(incident_id="x", ir=9, title="t", state="active", phase=Phase.ALLOCATED, host_gpus={"h1": 3})
    held = units.holdings([host], [legacy])
    assert held["h1"].used == 3 and not held["h1"].ids


# -- the service on a shared pool ----------------------------------------------------------------------------------


class Farm:
    def __init__(self, *, old_agent: bool = False) -> None:
        self.clock = FakeClock()
        self.incidents = FakeIncidents(self.clock)
        self.hosts = FakeHosts()
        self.hosts.seed("slice-1", "A100", 2, "slices", "k8s")
        self.hosts.tags["slice-1"]["user"] = _mig_tags()
        if old_agent:
            self.hosts.seed("slice-2", "A100", 2, "slices", "k8s")  # an older agent: no unit tags
        self.chat = FakeChat(operators=frozenset({OPS}))
        self.svc = GpuFarm(
            incidents=self.incidents, hosts=self.hosts, chat=self.chat, clock=self.clock, farm=parse_farm(FARM_YAML)
        )

    def lease(self, count: int, user: str = USER) -> int:
        values = {"gpu_count": str(count), "gpu_model": "A100", "environment": "slices", "team": "nlp", "project": "p"}
        request = build_request(
            values, self.svc.context.farm, requester=user, channel=None, request_id=f"r-{next(_ids):08d}"
        )
        created = self.incidents.create(request.title(), {**request.to_fields(Phase.APPROVED, self.clock.now())})
        self.svc.process(created.id)
        return created.public_id

    def alloc(self, ir: int) -> Allocation:
        return Allocation.from_record(self.incidents.by_ir(ir))

    def assigned(self, host: str) -> list[str]:
        return [t for t in self.hosts.user(host) if t.startswith("gpu_assign:")]


@pytest.fixture
def farm() -> Farm:
    return Farm()


def test_two_leases_on_one_sliced_host_get_disjoint_slices_and_one_tag_each(farm: Farm) -> None:
    first, second = farm.lease(3), farm.lease(2, OTHER)
    a, b = units.lease_devices(farm.alloc(first)), units.lease_devices(farm.alloc(second))
    assert set(a) == set(b) == {"slice-1"}
    assert not {u.id for u in a["slice-1"]} & {u.id for u in b["slice-1"]}
    assert {u.index for u in a["slice-1"]} == {u.index for u in b["slice-1"]}  # packed onto one GPU
    wanted = [f"gpu_assign:ir-{ir}/{u.id}" for ir, held in ((first, a), (second, b)) for u in held["slice-1"]]
    assert sorted(farm.assigned("slice-1")) == sorted(wanted)
    assert farm.alloc(first).host_gpus == {"slice-1": 3}
    # The unit tags the agent published are untouched.
    assert len([t for t in farm.hosts.user("slice-1") if t.startswith("gpu_unit:")]) == 14


def test_many_leases_never_share_a_unit_and_the_pool_counts_units() -> None:
    farm = Farm(old_agent=True)
    irs = [farm.lease(1, USER if i % 2 else OTHER) for i in range(16)]
    held = [(h, u.id) for ir in irs for h, us in units.lease_devices(farm.alloc(ir)).items() for u in us]
    assert len(held) == len(set(held)) == 16  # 14 slices on slice-1, 2 GPUs by index on slice-2
    assert {h for h, _ in held} == {"slice-1", "slice-2"}
    assert farm.alloc(farm.lease(1)).phase is Phase.WAITING
    # slice-2's agent reads no assignment: no gpu_assign tags there, the incident alone says which GPU.
    assert farm.assigned("slice-2") == []


def test_release_removes_exactly_the_leases_assign_tags_and_the_units_go_back(farm: Farm) -> None:
    first, second = farm.lease(3), farm.lease(2, OTHER)
    mine = units.lease_devices(farm.alloc(first))["slice-1"]
    farm.svc.release(first, USER)
    farm.svc.process(farm.alloc(first).incident_id)
    assert farm.alloc(first).devices == () and farm.alloc(first).phase is Phase.RECLAIMED
    assert all(t.startswith(f"gpu_assign:ir-{second}/") for t in farm.assigned("slice-1"))
    assert len(farm.assigned("slice-1")) == 2
    third = farm.lease(3)
    assert {u.id for u in units.lease_devices(farm.alloc(third))["slice-1"]} == {u.id for u in mine}


def test_the_sync_restores_missing_assign_tags_and_removes_stale_ones(farm: Farm) -> None:
    ir = farm.lease(2)
    tags = farm.hosts.user("slice-1")
    lost = next(t for t in tags if t.startswith("gpu_assign:"))
    stray = f"gpu_assign:ir-{ir}/{_mig_uuid(1, 6)}"
    foreign = f"gpu_assign:ir-999/{_mig_uuid(1, 5)}"
    farm.hosts.tags["slice-1"]["user"] = [*(t for t in tags if t != lost), stray, foreign]
    repair = farm.svc.reconcile_pool("slices")
    after = farm.hosts.user("slice-1")
    assert lost in after and stray not in after and foreign not in after
    assert f"slice-1:{lost}" in repair.restored
    assert {f"slice-1:{stray}", f"slice-1:{foreign}"} <= set(repair.removed)
    assert farm.svc.reconcile_pool("slices").removed == [] and farm.assigned("slice-1") == [
        t for t in after if t.startswith("gpu_assign:")
    ]


def test_a_unit_tagged_for_another_ir_is_not_handed_out(farm: Farm) -> None:
    # An assignment whose incident the search does not show yet still holds its slice.
    taken = _mig_uuid(0, 0)
    farm.hosts.tags["slice-1"]["user"].append(f"gpu_assign:ir-4242/{taken}")
    ir = farm.lease(7)
    assert taken not in {u.id for u in units.lease_devices(farm.alloc(ir)).get("slice-1", ())}


# -- telling the researcher ----------------------------------------------------------------------------------------


def test_the_allocated_message_names_the_mig_uuids_and_the_kubernetes_resource(farm: Farm) -> None:
    ir = farm.lease(3)
    alloc = farm.alloc(ir)
    slices = units.lease_devices(alloc)["slice-1"]
    message = allocated(alloc)
    body = message.blocks[0]["text"]["text"]
    expected = ",".join("MIG-" + u.id.removeprefix("mig-") for u in slices)
    assert f"CUDA_VISIBLE_DEVICES={expected}" in body
    assert "`nvidia.com/mig-1g.10gb: 3`" in body
    assert "MIG slices " + ", ".join(u.label for u in slices) + " (1g.10gb)" in body
    assert f"CUDA_VISIBLE_DEVICES={expected}" in message.text
    status = status_message(alloc).blocks[0]["text"]["text"]
    assert f"CUDA_VISIBLE_DEVICES={expected}" in status and "nvidia.com/mig-1g.10gb: 3" in status
    # Slices are named as slices, never as GPUs of the model.
    model = alloc.gpu_model
    assert f"is allocated: 3 \N{MULTIPLICATION SIGN} {model} 1g.10gb slices in `" in body
    assert "`slice-1` (3 slices)" in body
    assert f"3x {model}" not in message.text and "3 GPUs" not in message.text
    listed = list_message("Your leases", [alloc]).text
    assert f"3 \N{MULTIPLICATION SIGN} {model} 1g.10gb slices" in listed and f"3x {model}" not in listed


def test_whole_gpus_get_their_indexes_and_nvidia_com_gpu() -> None:
    devices = {"h": (GpuUnit(0, None, _gpu_uuid(0)), GpuUnit(3, None, _gpu_uuid(3)))}
    alloc = Allocation(
        incident_id="x",
        ir=5,
        title="t",
        state="active",
        phase=Phase.ALLOCATED,
        hosts=("h",),
        host_gpus={"h": 2},
        devices=tuple(units.encode_devices(devices)),
    )
    body = allocated(alloc).blocks[0]["text"]["text"]
    assert "GPUs 0, 3" in body and "`CUDA_VISIBLE_DEVICES=0,3`" in body and "`nvidia.com/gpu: 2`" in body


def test_a_dedicated_lease_message_is_unchanged() -> None:
    alloc = Allocation(
        incident_id="x", ir=5, title="t", state="active", phase=Phase.ALLOCATED, hosts=("h",), host_gpus={"h": 8}
    )
    assert "CUDA_VISIBLE_DEVICES" not in allocated(alloc).blocks[0]["text"]["text"]


# -- idle alerts about devices -------------------------------------------------------------------------------------


def test_an_idle_alert_for_a_slice_the_lease_does_not_hold_changes_nothing(farm: Farm) -> None:
    from gpufarm.core.kernel.serial import IdleScope

    first, second = farm.lease(1), farm.lease(1, OTHER)
    theirs = units.lease_devices(farm.alloc(second))["slice-1"][0].id
    mine = units.lease_devices(farm.alloc(first))["slice-1"][0].id
    outcome = farm.svc.idle_triggered(first, IdleScope(hosts=("slice-1",), devices=(theirs,), kind="idle"))
    assert outcome.action.startswith("ignored") and theirs in outcome.action
    assert farm.alloc(first).phase is Phase.ALLOCATED
    warned = farm.svc.idle_triggered(first, IdleScope(hosts=("slice-1",), devices=(mine,), kind="idle"))
    assert warned.action.startswith("warned") and farm.alloc(first).phase is Phase.IDLE_WARNED


def test_the_idle_webhook_reads_a_per_device_groups_long_status_line() -> None:
    from gpufarm.handlers.idle_alert import IdleAlert

    group = f"gpu_ir:ir-3,host:k8s-mig-01,gpu_uuid:{_mig_uuid(0, 1)}"
    status = (
        "gpufarm.gpu.processes over gpufarm:managed AND NOT gpu_ir:none AND environment:shared-slices,"
        f"{group} was < 1 at all times during the last 60m."
    )
    alert = IdleAlert.model_validate({"alert_transition": "Triggered", "alert_scope": group, "alert_status": status})
    assert len(status) > 200
    assert alert.ir() == 3 and alert.idle_scope().devices == (_mig_uuid(0, 1),)


def test_kubernetes_resources_per_profile_and_cuda_devices_for_mixed_units() -> None:
    held = [
        GpuUnit(0, None, _gpu_uuid(0)),
        GpuUnit(1, 2, _mig_uuid(1, 2), "3g.40gb"),
        GpuUnit(1, 9, _mig_uuid(1, 9), "1g.10gb"),
        GpuUnit(1, 10, _mig_uuid(1, 10), "1g.10gb"),
        GpuUnit(2, 3, _mig_uuid(2, 3), "unknown"),
    ]
    assert units.kubernetes_resources(held) == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-3g.40gb": 1,
    }
    visible = units.cuda_visible_devices(held).split(",")
    assert visible[0] == "0" and all(v.startswith("MIG-") for v in visible[1:]) and len(visible) == 5


def test_a_host_with_mixed_profiles_schedules_every_slice_once() -> None:
    tags = [
        unit_tag(0, _mig_uuid(0, 1), 1, "3g.40gb"),
        unit_tag(0, _mig_uuid(0, 2), 2, "1g.10gb"),
        unit_tag(0, _mig_uuid(0, 3), 3, "1g.10gb"),
        unit_tag(1, _gpu_uuid(1)),
    ]
    host = _host(tags)
    assert [(u.label, u.profile) for u in host.units] == [
        ("0.1", "3g.40gb"),
        ("0.2", "1g.10gb"),
        ("0.3", "1g.10gb"),
        ("1", None),
    ]
    # Three units on GPU 0 fit a request of three there, leaving the whole GPU 1 free.
    chosen = units.choose_units(host.units, 3)
    assert chosen is not None and {u.index for u in chosen} == {0}


def test_amounts_name_slices_by_profile_and_whole_gpus_beside_them() -> None:
    from gpufarm.core.chat.amounts import units_amount

    times = "\N{MULTIPLICATION SIGN}"
    one = GpuUnit(0, 1, _mig_uuid(0, 1), "1g.10gb")
    two = GpuUnit(0, 2, _mig_uuid(0, 2), "3g.40gb")
    assert units_amount("A100", [one]) == f"1 {times} A100 1g.10gb slice"
    assert units_amount("A100", [one, two, GpuUnit(1, None, _gpu_uuid(1))]) == (
        f"1 {times} A100 1g.10gb slice + 1 {times} A100 3g.40gb slice + 1x A100"
    )
    assert units_amount("H100", [GpuUnit(1, None, _gpu_uuid(1))]) is None  # whole GPUs: counted as GPUs
