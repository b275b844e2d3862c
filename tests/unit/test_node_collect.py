"""Series building: the idle taxonomy, IR resolution, container and IR rollups, parent-only values."""

from __future__ import annotations

import pytest

from gpufarm_node.attribution import DeviceOwner, Workload
from gpufarm_node.collect import AgentStats, CollectOptions, Series, SeriesBuilder
from gpufarm_node.gpu_names import gpu_model
from gpufarm_node.model import GpuSnapshot, MemoryInfo, MigSnapshot, NodeSnapshot, ProcessSample
from gpufarm_node.series_tags import identity_tags

GIB = 1 << 30
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG0 = "MIG-22222222-2222-2222-2222-222222222222"
CID = "ab" * 32


def _gpu(
    uuid: str = UUID0, *, util: float | None = 50.0, procs: list[ProcessSample] | None = None, **kw: object
) -> GpuSnapshot:
    return GpuSnapshot(
        0,
        uuid,
        "NVIDIA H100 80GB HBM3",
        utilization=util,
        memory=MemoryInfo(80 * GIB, GIB, 79 * GIB, 0),
        processes=procs or [],
        **kw,
    )  # type: ignore[arg-type]


def _build(
    gpus: list[GpuSnapshot],
    workloads: dict[int, Workload | None] | None = None,
    owners: dict[str, DeviceOwner] | None = None,
    host_ir: str | None = None,
    options: CollectOptions | None = None,
) -> list[Series]:
    builder = SeriesBuilder(identity_tags("onprem-hpc", "hpc-a"), options)
    return builder.build(NodeSnapshot(1.0, gpus), workloads or {}, owners or {}, host_ir)


def _find(series: list[Series], metric: str, *tags: str) -> list[Series]:
    return [s for s in series if s.metric == metric and all(t in s.tags for t in tags)]


def _state(series: list[Series], uuid: str) -> str:
    (on,) = [s for s in _find(series, "gpufarm.gpu.idle_state", f"gpu_uuid:{uuid.lower()}") if s.value == 1.0]
    return next(t for t in on.tags if t.startswith("state:")).partition(":")[2]


@pytest.mark.parametrize(
    ("util", "procs", "expected"),
    [
        (0.0, [], "idle"),
        (90.0, [], "busy"),  # busy with no process listed (a failed read): never called idle
        (0.0, [ProcessSample(1, 10 * GIB, 0.0)], "idle_held"),
        (4.9, [ProcessSample(1, 10 * GIB, 4.9)], "idle_held"),
        (5.0, [ProcessSample(1, 10 * GIB, 5.0)], "busy"),
        (0.0, [ProcessSample(1, 1 << 20, 0.0)], "idle"),  # 1 MiB held is under the 64 MiB threshold
        (0.0, [ProcessSample(1, None, 0.0)], "idle_held"),  # unknown memory counts as held
    ],
)
def test_idle_taxonomy_for_whole_gpus(util: float, procs: list[ProcessSample], expected: str) -> None:
    assert _state(_build([_gpu(util=util, procs=procs)]), UUID0) == expected


def test_thresholds_are_configurable() -> None:
    series = _build(
        [_gpu(util=8.0, procs=[ProcessSample(1, 10 * GIB, 8.0)])], options=CollectOptions(idle_util_threshold=10)
    )
    assert _state(series, UUID0) == "idle_held"


def test_without_utilization_the_process_sum_decides_and_unknown_activity_is_busy() -> None:
    by_processes = _gpu(util=None, procs=[ProcessSample(1, GIB, 1.0), ProcessSample(2, GIB, 2.0)])
    assert _state(_build([by_processes]), UUID0) == "idle_held"
    unknown = _gpu(util=None, procs=[ProcessSample(1, GIB, None)])
    assert _state(_build([unknown]), UUID0) == "busy"


def test_mig_slices_use_gpm_activity_and_unknown_activity_never_reads_as_idle() -> None:
    with_gpm = MigSnapshot(
        MIG0, 1, 0, "1g.10gb", MemoryInfo(10 * GIB, GIB, 9 * GIB), [ProcessSample(5, GIB)], {"graphics": 0.5}
    )
    without = MigSnapshot(MIG0.replace("2", "3"), 2, 0, "1g.10gb", None, [ProcessSample(6, GIB)], None)
    parent = GpuSnapshot(0, UUID0, "NVIDIA H100 80GB HBM3", mig_enabled=True, migs=[with_gpm, without], power_w=300.0)
    series = _build([parent])
    assert _state(series, MIG0) == "idle_held"
    assert _state(series, without.uuid) == "busy"
    (activity,) = _find(series, "gpufarm.gpu.activity.graphics")
    assert f"gpu_parent_uuid:{UUID0.lower()}" in activity.tags and "gpu_slicing_mode:mig" in activity.tags
    assert sum(t.startswith("gpu_uuid:") for t in activity.tags) == 1
    (power,) = _find(series, "gpufarm.gpu.power.usage")
    assert "gpu_slicing_mode:mig-parent" in power.tags and not any(t.startswith("gpu_ir:") for t in power.tags)
    assert _find(series, "gpufarm.gpu.memory.used", "gpu_slicing_mode:mig-parent") == []


def test_ir_comes_from_the_owner_then_the_processes_then_the_host() -> None:
    procs = [ProcessSample(1, 10 * GIB, 50.0), ProcessSample(2, 20 * GIB, 50.0)]
    workloads: dict[int, Workload | None] = {1: Workload(ir="ir-1"), 2: Workload(ir="ir-2")}
    owned = _build([_gpu(procs=procs)], workloads, {UUID0: DeviceOwner(ir="ir-9")}, host_ir="ir-7")
    assert _find(owned, "gpufarm.gpu.utilization")[0].tags[-2:] == ("gpu_ir:ir-9", "ir:ir-9")
    by_memory = _build([_gpu(procs=procs)], workloads, host_ir="ir-7")
    assert "gpu_ir:ir-2" in _find(by_memory, "gpufarm.gpu.utilization")[0].tags
    by_host = _build([_gpu(procs=[ProcessSample(3, GIB, 50.0)])], {3: None}, host_ir="ir-7")
    assert "gpu_ir:ir-7" in _find(by_host, "gpufarm.gpu.utilization")[0].tags
    nobody = _build([_gpu()])
    util = _find(nobody, "gpufarm.gpu.utilization")[0]
    assert "gpu_ir:none" in util.tags and not any(t.startswith("ir:") for t in util.tags)


def test_container_rollups_per_device_with_zeros_for_an_owner_that_runs_nothing() -> None:
    worker = Workload(CID, "u-1", "trainer-0", "nlp", "main", "ir-5")
    procs = [ProcessSample(1, 2 * GIB, 30.0), ProcessSample(2, GIB, 20.0), ProcessSample(3, GIB, 10.0)]
    owners = {UUID1: DeviceOwner("nlp", "trainer-0", "main", "u-1", "ir-5")}
    series = _build([_gpu(procs=procs), _gpu(UUID1)], {1: worker, 2: worker, 3: None}, owners)
    (memory,) = _find(series, "gpufarm.container.memory.used", f"gpu_uuid:{UUID0.lower()}")
    assert (
        memory.value == 3 * GIB and f"container_id:{CID}" in memory.tags and "kube_container_name:main" in memory.tags
    )
    assert _find(series, "gpufarm.container.sm_utilization", f"gpu_uuid:{UUID0.lower()}")[0].value == 50.0
    (idle,) = _find(series, "gpufarm.container.memory.used", f"gpu_uuid:{UUID1.lower()}")
    assert idle.value == 0.0 and "pod_name:trainer-0" in idle.tags and "gpu_ir:ir-5" in idle.tags
    assert _find(series, "gpufarm.container.processes", f"gpu_uuid:{UUID1.lower()}")[0].value == 0.0
    # PIDs only on a squatter's own series (bounded per device), never on the per-device or container ones.
    assert not any(t.startswith("pid:") for s in series if s.metric != "gpufarm.process.squatter" for t in s.tags)


def test_per_process_series_only_when_asked() -> None:
    procs = [ProcessSample(7, GIB, 12.0)]
    assert _find(_build([_gpu(procs=procs)]), "gpufarm.process.memory.used") == []
    series = _build([_gpu(procs=procs)], options=CollectOptions(per_process=True))
    (memory,) = _find(series, "gpufarm.process.memory.used")
    (sm,) = _find(series, "gpufarm.process.sm_utilization")
    assert memory.value == GIB and sm.value == 12.0 and "pid:7" in sm.tags


def test_ir_rollups_count_states_and_sum_memory() -> None:
    busy = _gpu(UUID0, util=80.0, procs=[ProcessSample(1, 4 * GIB, 80.0)])
    held = _gpu(UUID1, util=0.0, procs=[ProcessSample(2, 6 * GIB, 0.0)])
    lost = GpuSnapshot(2, "GPU-33333333-3333-3333-3333-333333333333", "NVIDIA H100", healthy=False)
    workloads: dict[int, Workload | None] = {1: Workload(ir="ir-5"), 2: Workload(ir="ir-5")}
    series = _build([busy, held, lost], workloads, host_ir="ir-5")

    def value(metric: str) -> float:
        (s,) = _find(series, metric, "gpu_ir:ir-5")
        return s.value

    assert (value("gpufarm.ir.gpus"), value("gpufarm.ir.gpus_busy"), value("gpufarm.ir.gpus_idle_held")) == (2, 1, 1)
    assert (value("gpufarm.ir.gpus_idle"), value("gpufarm.ir.gpus_unhealthy")) == (0, 1)
    assert value("gpufarm.ir.memory.used") == 10 * GIB and value("gpufarm.ir.processes") == 2
    assert value("gpufarm.ir.utilization") == 40.0
    (unhealthy,) = _find(series, "gpufarm.gpu.unhealthy", "gpu_index:2")
    assert unhealthy.value == 1.0 and _find(series, "gpufarm.gpu.utilization", "gpu_index:2") == []


def test_energy_is_a_delta_and_a_driver_reload_is_not_negative() -> None:
    builder = SeriesBuilder(identity_tags("e", "c"))

    def energy(joules: float) -> list[float]:
        snap = NodeSnapshot(1.0, [_gpu(energy_j=joules)])
        return [s.value for s in builder.build(snap, {}, {}) if s.metric == "gpufarm.gpu.energy"]

    assert energy(1000.0) == []
    assert energy(1600.0) == [600.0]
    assert energy(10.0) == []
    assert energy(25.0) == [15.0]


def test_clock_reasons_one_flag_each_and_xids_counted() -> None:
    series = _build([_gpu(clock_event_reasons=0x1 | 0x40, xids=[13, 13, 79])])
    flags = {
        t.partition(":")[2]: s.value
        for s in _find(series, "gpufarm.gpu.clock_event_reason")
        for t in s.tags
        if t.startswith("reason:")
    }
    assert (
        len(flags) == 9
        and flags["gpu_idle"] == 1.0
        and flags["hw_thermal_slowdown"] == 1.0
        and flags["sw_power_cap"] == 0.0
    )
    assert {(t, s.value) for s in _find(series, "gpufarm.gpu.xid_errors") for t in s.tags if t.startswith("xid:")} == {
        ("xid:13", 2.0),
        ("xid:79", 1.0),
    }


def test_node_series_report_errors_and_drops() -> None:
    builder = SeriesBuilder(identity_tags("e", "c"))
    snap = NodeSnapshot(1.0, [_gpu()], errors={"nvmlDeviceGetClockInfo": 2}, events_dropped=3)
    series = builder.build(snap, {}, {}, stats=AgentStats(0.01, {"overflow": 5, "expired": 0}))
    assert [(s.value, s.tags[-1]) for s in _find(series, "gpufarm.node.nvml_errors")] == [
        (2.0, "function:nvmldevicegetclockinfo")
    ]
    assert [(s.value, s.tags[-1]) for s in _find(series, "gpufarm.node.points_dropped")] == [
        (5.0, "drop_reason:overflow")
    ]
    assert _find(series, "gpufarm.node.events_dropped")[0].value == 3.0


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA H200", "H200"),
        ("", "UNKNOWN"),
    ],
)
def test_gpu_model(name: str, model: str) -> None:
    assert gpu_model(name) == model


def test_container_rollups_follow_new_workloads_and_values_across_cycles() -> None:
    # One builder over cycles: the grouping of a device's processes is worked out once per set of workloads.
    builder = SeriesBuilder(identity_tags("onprem-hpc", "hpc-a"))
    other = "cd" * 32
    first = {1: Workload(container_id=CID, pod_name="a", ir="ir-1"), 2: Workload(container_id=other, ir="ir-3")}

    def cycle(workloads: dict[int, Workload | None], used: int) -> list[Series]:
        procs = [ProcessSample(1, used, 10.0), ProcessSample(2, 2 * GIB, 20.0), ProcessSample(3, GIB, 1.0)]
        return builder.build(NodeSnapshot(1.0, [_gpu(procs=procs)]), workloads, {}, None)

    def value(series: list[Series], metric: str, *tags: str) -> float:
        (found,) = _find(series, metric, *tags)
        return found.value

    # The device's IR (and so the IR of pid 3, which has no workload) follows the memory held: ir-3, then ir-1.
    for used, ir1, ir3 in ((GIB, GIB, 3 * GIB), (3 * GIB, 4 * GIB, 2 * GIB)):
        series = cycle(first, used)
        assert value(series, "gpufarm.container.memory.used", f"container_id:{CID}") == float(used)
        assert value(series, "gpufarm.container.memory.used", f"container_id:{other}") == float(2 * GIB)
        assert value(series, "gpufarm.ir.memory.used", "gpu_ir:ir-1") == float(ir1)
        assert value(series, "gpufarm.ir.memory.used", "gpu_ir:ir-3") == float(ir3)
    # The same pids under a new workload object (a label changed): new tags, nothing left of the old ones.
    series = cycle({**first, 1: Workload(container_id=CID, pod_name="a", ir="ir-2")}, 3 * GIB)
    assert _find(series, "gpufarm.container.memory.used", "gpu_ir:ir-1") == []
    assert value(series, "gpufarm.container.processes", f"container_id:{CID}", "gpu_ir:ir-2") == 1.0
