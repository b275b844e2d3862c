"""Squatter detection: a busy device's processes that are not of the lease holding it (gpufarm_node.squatters)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufarm_node.attribution import Workload
from gpufarm_node.collect import CollectOptions, Series, SeriesBuilder
from gpufarm_node.model import GpuSnapshot, MemoryInfo, MigSnapshot, NodeSnapshot, ProcessSample
from gpufarm_node.series_tags import identity_tags
from gpufarm_node.squatters import PodRef, Squatter, UserNames, squatter_rows, user_tag_value

GIB = 1 << 30
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG0 = "MIG-22222222-2222-2222-2222-222222222222"
MIG1 = "MIG-33333333-3333-3333-3333-333333333333"
POD_UID = "0123abcd-0000-4000-8000-00000000beef"
COMMON = identity_tags("onprem-hpc", "hpc-a")


def _gpu(uuid: str, util: float, *pids: int, index: int = 0) -> GpuSnapshot:
    procs = [ProcessSample(pid, 10 * GIB, util) for pid in pids]
    memory = MemoryInfo(80 * GIB, GIB, 79 * GIB, 0)
    return GpuSnapshot(index, uuid, "NVIDIA H100 80GB HBM3", utilization=util, memory=memory, processes=procs)


def _mig_gpu(*slices: tuple[str, list[int]]) -> GpuSnapshot:
    migs = [
        MigSnapshot(
            uuid, n + 1, 0, "1g.10gb", MemoryInfo(10 * GIB, GIB, 9 * GIB), [ProcessSample(p, GIB) for p in pids]
        )
        for n, (uuid, pids) in enumerate(slices)
    ]
    return GpuSnapshot(0, UUID0, "NVIDIA A100-SXM4-80GB", mig_enabled=True, migs=migs)


def _run(
    gpus: list[GpuSnapshot],
    workloads: dict[int, Workload | None],
    *,
    host_ir: str | None = None,
    assigned: dict[str, str] | None = None,
    options: CollectOptions | None = None,
    users: dict[int, str] | None = None,
) -> tuple[SeriesBuilder, list[Series]]:
    builder = SeriesBuilder(COMMON, options, user_of=(users or {}).get)
    series = builder.build(NodeSnapshot(1.0, gpus), workloads, {}, host_ir, assigned=assigned)
    return builder, series


def _count(series: list[Series], uuid: str) -> float:
    (found,) = [s for s in series if s.metric == "gpufarm.gpu.squatters" and f"gpu_uuid:{uuid.lower()}" in s.tags]
    return found.value


def _squatter_series(series: list[Series]) -> list[Series]:
    return [s for s in series if s.metric == "gpufarm.process.squatter"]


def test_dedicated_host_a_process_of_another_lease_is_a_squatter_the_holder_s_own_and_unclaimed_ones_are_not() -> None:
    # Process 2 claims no lease: the holder's own job that did not set GPUFARM_IR, charged to the device's lease.
    workloads = {1: Workload(ir="ir-7"), 2: Workload(), 3: Workload(ir="ir-9")}
    builder, series = _run(
        [_gpu(UUID0, 90.0, 1), _gpu(UUID1, 90.0, 2, 3, index=1)], workloads, host_ir="ir-7", users={3: "mallory"}
    )
    assert _count(series, UUID0) == 0.0
    assert _count(series, UUID1) == 1.0
    key = UUID1.lower()
    assert builder.squatters == [Squatter(key, "ir-7", "ir-9", 3)]
    tags = {s.tags for s in _squatter_series(series)}
    assert tags == {(*COMMON, f"gpu_uuid:{key}", "gpu_ir:ir-7", "claimed_ir:ir-9", "pid:3", "user:mallory")}
    # The device count carries the hurt lease, for the monitor's group.
    (device,) = [s for s in series if s.metric == "gpufarm.gpu.squatters" and f"gpu_uuid:{key}" in s.tags]
    assert "gpu_ir:ir-7" in device.tags and "ir:ir-7" in device.tags


def test_host_held_by_no_lease_every_busy_process_is_one_even_one_claiming_a_lease() -> None:
    builder, series = _run([_gpu(UUID0, 90.0, 1)], {1: Workload(ir="ir-7")})
    assert builder.squatters == [Squatter(UUID0.lower(), None, "ir-7", 1)]
    (device,) = [s for s in series if s.metric == "gpufarm.gpu.squatters"]
    assert "gpu_ir:none" in device.tags and device.value == 1.0


def test_an_idle_or_idle_held_device_is_never_squatted() -> None:
    builder, series = _run([_gpu(UUID0, 0.0, 1), _gpu(UUID1, 1.0, 2, index=1)], {1: Workload(), 2: Workload()})
    assert builder.squatters == []
    assert _count(series, UUID0) == 0.0 and _count(series, UUID1) == 0.0
    assert _squatter_series(series) == []


def test_shared_host_the_assignment_is_the_device_s_lease_and_an_unassigned_slice_has_none() -> None:
    gpu = _mig_gpu((MIG0, [1, 2]), (MIG1, [3]))
    workloads = {
        1: Workload(ir="ir-5"),
        2: Workload("c" * 64, POD_UID, "intruder", "team-b", "main", "ir-6"),
        3: Workload(ir="ir-5"),
    }
    builder, series = _run([gpu], workloads, assigned={MIG0.lower(): "ir-5"})
    pod = PodRef("team-b", "intruder", POD_UID, "main")
    assert builder.squatters == [
        Squatter(MIG0.lower(), "ir-5", "ir-6", 2, pod),
        Squatter(MIG1.lower(), None, "ir-5", 3),
    ]
    assert _count(series, MIG0) == 1.0 and _count(series, MIG1) == 1.0
    pod_series = [s for s in _squatter_series(series) if "pod_name:intruder" in s.tags]
    assert pod_series and f"pod_uid:{POD_UID}" in pod_series[0].tags and "kube_namespace:team-b" in pod_series[0].tags


def test_the_processes_never_make_the_device_s_lease() -> None:
    # Attribution charges an unassigned device to its processes' majority; the squatter rule does not.
    builder, series = _run([_gpu(UUID0, 90.0, 1)], {1: Workload(ir="ir-9")}, assigned={UUID1.lower(): "ir-5"})
    assert builder.squatters == [Squatter(UUID0.lower(), None, "ir-9", 1)]
    assert any(s.metric == "gpufarm.gpu.utilization" and "gpu_ir:ir-9" in s.tags for s in series)


def test_detection_off_emits_nothing_of_it() -> None:
    builder, series = _run([_gpu(UUID0, 90.0, 1)], {1: None}, options=CollectOptions(squatters=False))
    assert builder.squatters == []
    assert not [s for s in series if "squatter" in s.metric]


def test_a_device_reports_at_most_sixteen_squatters_but_counts_them_all() -> None:
    pids = list(range(100, 140))
    _, series = _run([_gpu(UUID0, 90.0, *pids)], dict.fromkeys(pids))
    assert _count(series, UUID0) == 40.0
    assert len(_squatter_series(series)) == 16


def test_a_found_pod_without_a_pid_is_the_same_record() -> None:
    squatter = Squatter("mig-x", "ir-5", "ir-6", pod=PodRef("team-b", "intruder", POD_UID))
    (row,) = squatter_rows(COMMON, [squatter], lambda pid: "never")
    assert row[2] == (
        *COMMON,
        "gpu_uuid:mig-x",
        "gpu_ir:ir-5",
        "claimed_ir:ir-6",
        f"pod_uid:{POD_UID}",
        "pod_name:intruder",
        "kube_namespace:team-b",
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("alice", "alice"), ("Bob", "bob"), ("", "uid-1234"), ("ev il\n", "uid-1234"), ("1abc", "uid-1234")],
)
def test_user_tag_values(name: str, value: str) -> None:
    assert user_tag_value(name, 1234) == value


def test_user_names_come_from_the_proc_entry_s_owner(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    asked: list[int] = []

    def lookup(uid: int) -> str:
        asked.append(uid)
        return "carol"

    users = UserNames(str(tmp_path), lookup)
    assert users.of(42) == "carol"
    assert users.of(42) == "carol"
    assert asked == [os.getuid()]  # one lookup per uid
    assert users.of(43) is None  # gone from /proc


def test_squatters_another_source_reports_are_merged_into_their_device_once_per_pod() -> None:
    # A pod of ir-6 holds slice MIG1 of ir-5 (pod-resources) and runs nothing visible there; another pod's process
    # on MIG0 was found by the agent itself, and reported again by the source: counted once.
    gpu = _mig_gpu((MIG0, [2]), (MIG1, []))
    intruder = PodRef("team-b", "intruder", POD_UID, "main")
    workloads = {2: Workload("c" * 64, POD_UID, "intruder", "team-b", "main", "ir-6")}
    reported = [
        Squatter(MIG0.lower(), "ir-5", "ir-6", pod=intruder),
        Squatter(MIG1.lower(), "ir-5", "ir-6", pod=PodRef("team-b", "idler", None, "main")),
    ]
    builder = SeriesBuilder(COMMON)
    snap = NodeSnapshot(1.0, [gpu])
    assigned = {MIG0.lower(): "ir-5", MIG1.lower(): "ir-5"}
    series = builder.build(snap, workloads, {}, None, assigned=assigned, reported=reported)
    assert _count(series, MIG0) == 1.0 and _count(series, MIG1) == 1.0
    assert [s.pid for s in builder.squatters] == [2, None]
    assert any("pod_name:idler" in s.tags for s in _squatter_series(series))


def test_a_failing_squatter_source_never_fails_the_cycle(tmp_path: Path) -> None:
    from gpufarm_node.agent import Agent
    from gpufarm_node.attribution import Attributor, ProcFs
    from gpufarm_node.fake_host import FakeHost
    from gpufarm_node.fake_nvml import FakeNvml
    from gpufarm_node.nvml.source import NvmlSource
    from gpufarm_node.sender import DatadogSender
    from gpufarm_node.topology import topology_from_dict

    class _Drop:
        encoding = "gzip"

        def post(self, compressed: bytes) -> None:
            return None

    def broken() -> list[Squatter]:
        raise RuntimeError("pod-resources gone")

    doc = {
        "name": "s",
        "gpus": [{"model": "H100", "count": 1}],
        "processes": [{"pid": 7, "gpu": 0, "workload": "busy"}],
    }
    fake = FakeNvml(topology_from_dict(doc, seed="s"))
    host = FakeHost(fake, tmp_path)
    agent = Agent(
        NvmlSource(fake),
        Attributor(ProcFs(host.proc_root)),
        DatadogSender(_Drop(), "h"),
        hostname="h",
        environment="e",
        cluster="c",
        squatter_source=broken,
    )
    agent.start()
    try:
        agent.cycle()
    finally:
        agent.close()
    assert [s.pid for s in agent.builder.squatters] == [7]


def test_a_cached_device_follows_new_processes_and_unknown_ones_by_pid() -> None:
    builder = SeriesBuilder(COMMON)

    def cycle(pid: int, workload: Workload | None, host_ir: str | None = "ir-7") -> list[Squatter]:
        builder.build(NodeSnapshot(1.0, [_gpu(UUID0, 90.0, pid)]), {pid: workload}, {}, host_ir)
        return list(builder.squatters)

    own = Workload(ir="ir-7")
    assert cycle(1, own) == [] and cycle(1, own) == []
    # The same pid, now another process (a new workload object) claiming another lease: found at once.
    assert cycle(1, Workload(ir="ir-9")) == [Squatter(UUID0.lower(), "ir-7", "ir-9", 1)]
    # On a host no lease holds, processes gone from /proc (no workload) are told apart by pid.
    assert cycle(2, None, None) == [Squatter(UUID0.lower(), None, None, 2)]
    assert cycle(3, None, None) == [Squatter(UUID0.lower(), None, None, 3)]


def test_a_pod_mismatch_is_a_squatter_record_merged_once_with_the_pod_s_own_processes() -> None:
    from gpufarm_node.enforce.pod_leases import PodMismatch
    from gpufarm_node.squatters import from_pod_mismatch

    mismatch = PodMismatch(MIG0.lower(), "team-b", "intruder", "ir-6", "ir-5")
    assert from_pod_mismatch(mismatch) == Squatter(MIG0.lower(), "ir-5", "ir-6", pod=PodRef("team-b", "intruder"))
    gpu = _mig_gpu((MIG0, [2]), (MIG1, []))
    workloads = {2: Workload("c" * 64, POD_UID, "intruder", "team-b", "main", "ir-6")}
    builder = SeriesBuilder(COMMON)
    series = builder.build(
        NodeSnapshot(1.0, [gpu]),
        workloads,
        {},
        None,
        assigned={MIG0.lower(): "ir-5"},
        reported=[from_pod_mismatch(mismatch)],
    )
    assert _count(series, MIG0) == 1.0 and [s.pid for s in builder.squatters] == [2]
