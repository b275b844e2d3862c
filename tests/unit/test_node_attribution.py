"""PID -> container/pod -> IR: cgroup paths, /proc reads, PID reuse, pod metadata, kubelet pod-resources."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpufarm_node.attribution import (
    VERIFY_EVERY,
    Attributor,
    CgroupIdentity,
    DeviceOwner,
    PodMetadataFile,
    PodResourcesOwners,
    ProcFs,
    StaticOwners,
    parse_cgroup,
    parse_pod_list,
)
from gpufarm_node.podresources import WireError, decode_list_response, kubelet_lister

CID = "0123456789abcdef" * 4
UID = "a9c80282-3f6b-4d5b-84d5-a137a6668011"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n", CgroupIdentity(CID, UID)),
        (f"4:devices:/kubepods/pod{UID}/{CID}\n1:name=systemd:/kubepods/pod{UID}/{CID}\n", CgroupIdentity(CID, UID)),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            CgroupIdentity(CID, UID),
        ),
        (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope", CgroupIdentity(CID, UID)),
        (f"0::/system.slice/docker-{CID}.scope\n", CgroupIdentity(CID, None)),
        (f"11:cpu,cpuacct:/docker/{CID}\n", CgroupIdentity(CID, None)),
        (
            "0::/ecs/1234567890abcdef1234567890abcdef-1234567890\n",
            CgroupIdentity("1234567890abcdef1234567890abcdef-1234567890"),
        ),
        ("0::/system.slice/docker.service\n", CgroupIdentity()),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", CgroupIdentity()),
        ("0::/\n", CgroupIdentity()),
        ("garbage\n\n", CgroupIdentity()),
    ],
)
def test_cgroup_paths(text: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup(text) == expected


def _proc(root: Path, pid: int, *, start: int, cgroup: str = "0::/\n", env: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S", "1", "1", "1", "0", "-1", "0"] + ["0"] * 8 + ["20", "0", "1", "0", str(start)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (python (x) y) {' '.join(fields)}\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))


def test_procfs_reads_start_time_past_odd_process_names_and_one_environment_variable(tmp_path: Path) -> None:
    _proc(tmp_path, 42, start=123456, env={"A": "1", "GPUFARM_IR": " IR-77 ", "GPUFARM_IR_X": "no"})
    fs = ProcFs(tmp_path)
    assert fs.starttime(42) == 123456
    assert fs.environ_value(42, "GPUFARM_IR") == "IR-77"
    assert fs.starttime(43) is None and fs.cgroup(43) is None and fs.environ_value(43, "GPUFARM_IR") is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_an_unreadable_environment_is_no_ir_not_an_error(tmp_path: Path) -> None:
    _proc(tmp_path, 42, start=1, env={"GPUFARM_IR": "IR-77"})
    (tmp_path / "42" / "environ").chmod(0)
    assert ProcFs(tmp_path).environ_value(42, "GPUFARM_IR") is None


def test_workload_from_environment_and_cache_keyed_by_pid_and_start_time(tmp_path: Path) -> None:
    _proc(tmp_path, 42, start=100, cgroup=f"0::/system.slice/docker-{CID}.scope\n", env={"GPUFARM_IR": "IR-77"})
    attributor = Attributor(ProcFs(tmp_path))
    attributor.begin_cycle()
    first = attributor.workload(42)
    assert first is not None and (first.container_id, first.ir) == (CID, "ir-77")
    # The same process again: served from the cache even if its files changed under it.
    (tmp_path / "42" / "environ").write_bytes(b"GPUFARM_IR=IR-99\0")
    assert attributor.workload(42) == first
    # The pid is reused by a new process (new start time): read again.
    _proc(tmp_path, 42, start=200, env={"GPUFARM_IR": "ir-88"})
    second = attributor.workload(42)
    assert second is not None and (second.container_id, second.ir) == (None, "ir-88")
    attributor.end_cycle()


def test_a_vanished_process_has_no_workload_and_leaves_the_cache(tmp_path: Path) -> None:
    _proc(tmp_path, 42, start=100, env={"GPUFARM_IR": "IR-77"})
    _proc(tmp_path, 43, start=100)
    attributor = Attributor(ProcFs(tmp_path))
    attributor.begin_cycle()
    assert attributor.workload(42) is not None and attributor.workload(43) is not None
    attributor.end_cycle()
    for name in ("stat", "cgroup", "environ"):
        (tmp_path / "42" / name).unlink()
    (tmp_path / "42").rmdir()
    attributor.begin_cycle()
    assert attributor.workload(42) is None
    attributor.end_cycle()
    assert attributor.cached == 0  # 42 is gone, 43 was not seen this cycle


class CountingProcFs(ProcFs):
    """ProcFs that counts start-time reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads = 0

    def starttime(self, pid: int) -> int | None:
        self.reads += 1
        return super().starttime(pid)


def _cursor(root: Path, last_pid: int) -> None:
    (root / "loadavg").write_text(f"0.10 0.20 0.30 2/345 {last_pid}\n")


def _cycle(attributor: Attributor, *pids: int) -> list[str | None]:
    attributor.begin_cycle()
    irs = [(w.ir if w else None) for w in (attributor.workload(pid) for pid in pids)]
    attributor.end_cycle()
    return irs


def test_the_pid_cursor_reads_no_start_time_for_pids_it_did_not_pass(tmp_path: Path) -> None:
    for pid in (4000, 5000, 6000):
        _proc(tmp_path, pid, start=100, env={"GPUFARM_IR": f"IR-{pid}"})
    _cursor(tmp_path, 6100)
    fs = CountingProcFs(tmp_path)
    attributor = Attributor(fs)
    assert _cycle(attributor, 4000, 5000, 6000) == ["ir-4000", "ir-5000", "ir-6000"]
    assert fs.reads == 3
    fs.reads = 0
    for _ in range(VERIFY_EVERY):
        # The cursor did not move: only each pid's turn in the rotation reads its start time.
        assert _cycle(attributor, 4000, 5000, 6000) == ["ir-4000", "ir-5000", "ir-6000"]
    assert fs.reads == 3  # once each in VERIFY_EVERY cycles


def test_a_pid_the_cursor_passed_is_read_again_and_a_reuse_is_seen(tmp_path: Path) -> None:
    for pid in (4000, 5000):
        _proc(tmp_path, pid, start=100, env={"GPUFARM_IR": f"IR-{pid}"})
    _cursor(tmp_path, 6100)
    fs = CountingProcFs(tmp_path)
    attributor = Attributor(fs)
    _cycle(attributor, 4000, 5000)
    _cycle(attributor, 4000, 5000)
    # The cursor wraps round pid_max and hands 4000 out again; 5000 stays ahead of it.
    _proc(tmp_path, 4000, start=900, env={"GPUFARM_IR": "IR-9"})
    _cursor(tmp_path, 4100)
    fs.reads = 0
    assert _cycle(attributor, 4000, 5000) == ["ir-9", "ir-5000"]
    # 4000 was read (the cursor passed it); 5000 only if this was its rotation turn.
    assert 1 <= fs.reads <= 2
    # Without the wrap: the cursor moves forward over 5000 only.
    _proc(tmp_path, 5000, start=950, env={"GPUFARM_IR": "IR-10"})
    _cursor(tmp_path, 5100)
    assert _cycle(attributor, 4000, 5000) == ["ir-9", "ir-10"]


def _listed(attributor: Attributor, pids: list[int]) -> list[str | None]:
    attributor.begin_cycle()
    found = attributor.workloads(pids)
    attributor.end_cycle()
    return [(w.ir if w else None) for w in (found[pid] for pid in pids)]


def test_a_steady_cycle_starts_from_the_last_answers_and_answers_as_the_per_pid_path(tmp_path: Path) -> None:
    """While the pids, the cursor and the pod list stay the same, a cycle starts from the last one's answers and
    re-reads only the rotation's turn and the pids that were gone: the same answers and the same reads as asking
    pid by pid (a cycle's later calls, which never start from the last cycle's answers)."""
    pids = [4000 + k for k in range(3 * VERIFY_EVERY)]
    for pid in pids:
        _proc(tmp_path, pid, start=100, env={"GPUFARM_IR": f"IR-{pid}"})
    _cursor(tmp_path, 9000)
    fs, twin_fs = CountingProcFs(tmp_path), CountingProcFs(tmp_path)
    attributor, twin = Attributor(fs), Attributor(twin_fs)
    changes = 0
    for cycle in range(3 * VERIFY_EVERY):
        if cycle == 3:  # a process ends without the cursor moving
            for name in ("stat", "cgroup", "environ"):
                (tmp_path / "4005" / name).unlink()
        if cycle == 30:  # its pid comes back as another process
            _proc(tmp_path, 4005, start=300, env={"GPUFARM_IR": "IR-1"})
        if cycle == 34:  # a running process is replaced under its pid
            _proc(tmp_path, 4012, start=400, env={"GPUFARM_IR": "IR-2"})
        before = _listed(attributor, pids)
        assert before == _cycle(twin, *pids)
        assert fs.reads == twin_fs.reads
        changes += before.count(None) + before.count("ir-1") + before.count("ir-2")
    assert changes > 0  # each change was seen, on its pid's turn
    assert attributor.cached == twin.cached == len(pids)


def test_a_steady_cycle_follows_the_pod_list_and_the_cursor(tmp_path: Path) -> None:
    _proc(tmp_path, 4000, start=100, env={"GPUFARM_IR": "IR-5"})
    _cursor(tmp_path, 9000)
    fs = CountingProcFs(tmp_path)
    attributor = Attributor(fs)
    assert _listed(attributor, [4000]) == ["ir-5"]
    assert _listed(attributor, [4000]) == ["ir-5"]
    _proc(tmp_path, 4000, start=200, env={"GPUFARM_IR": "IR-6"})
    _cursor(tmp_path, 4000)  # the cursor wrapped round and handed 4000 out again
    assert _listed(attributor, [4000]) == ["ir-6"]


def test_without_a_readable_cursor_every_start_time_is_read(tmp_path: Path) -> None:
    _proc(tmp_path, 4000, start=100)
    (tmp_path / "loadavg").write_text("garbage\n")
    fs = CountingProcFs(tmp_path)
    assert fs.last_pid() is None
    attributor = Attributor(fs)
    for _ in range(3):
        _cycle(attributor, 4000)
    assert fs.reads == 3


def test_an_invalid_ir_in_the_environment_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _proc(tmp_path, 42, start=1, env={"GPUFARM_IR": "project-x"})
    attributor = Attributor(ProcFs(tmp_path))
    attributor.begin_cycle()
    workload = attributor.workload(42)
    assert workload is not None and workload.ir is None
    assert "not an incident number" in caplog.text


def _pods(path: Path, *, label: str = "IR-5", annotation: str | None = None) -> None:
    meta = {"uid": UID, "name": "trainer-0", "namespace": "nlp", "labels": {"gpufarm.io/ir": label}}
    if annotation is not None:
        meta = {"uid": UID, "name": "trainer-0", "namespace": "nlp", "annotations": {"gpufarm.io/ir": annotation}}
    status = {"containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}]}
    path.write_text(json.dumps({"kind": "PodList", "items": [{"metadata": meta, "status": status}, {"bad": 1}]}))


def test_pod_label_gives_the_ir_and_the_container_name(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    _proc(
        root,
        42,
        start=1,
        cgroup=f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    )
    pods_file = tmp_path / "pods.json"
    _pods(pods_file)
    attributor = Attributor(ProcFs(root), pods=PodMetadataFile(pods_file, check_every=0))
    attributor.begin_cycle()
    workload = attributor.workload(42)
    assert workload is not None
    assert (workload.pod_name, workload.namespace, workload.container_name, workload.ir) == (
        "trainer-0",
        "nlp",
        "main",
        "ir-5",
    )
    # Relabelled pod: the cached process picks up the new IR on the next cycle (pod data is joined every cycle).
    _pods(pods_file, annotation="IR-6")
    os.utime(pods_file, (1, 1))
    attributor.begin_cycle()
    relabelled = attributor.workload(42)
    assert relabelled is not None and relabelled.ir == "ir-6"


def test_environment_ir_wins_over_the_pod_label(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    _proc(root, 42, start=1, cgroup=f"12:memory:/kubepods/pod{UID}/{CID}\n", env={"GPUFARM_IR": "IR-9"})
    pods_file = tmp_path / "pods.json"
    _pods(pods_file)
    attributor = Attributor(ProcFs(root), pods=PodMetadataFile(pods_file, check_every=0))
    attributor.begin_cycle()
    workload = attributor.workload(42)
    assert workload is not None and workload.ir == "ir-9" and workload.pod_name == "trainer-0"


def test_a_broken_pod_file_keeps_the_last_good_list(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pods_file = tmp_path / "pods.json"
    _pods(pods_file)
    pods = PodMetadataFile(pods_file, check_every=0)
    pods.refresh()
    pods_file.write_text("{not json")
    os.utime(pods_file, (5, 5))
    pods.refresh()
    info = pods.by_uid(UID)
    assert info is not None and info.ir == "ir-5"
    assert "unreadable" in caplog.text
    with pytest.raises(ValueError, match="not a pod list"):
        parse_pod_list({"kind": "Pod"})


def test_pod_resources_owners_join_pods_and_strip_time_slicing_suffixes(tmp_path: Path) -> None:
    pods_file = tmp_path / "pods.json"
    _pods(pods_file)
    pods = PodMetadataFile(pods_file, check_every=0)
    pods.refresh()
    listing = [
        ("nlp", "trainer-0", "main", "nvidia.com/gpu", ["GPU-aaa", "GPU-bbb::3"]),
        ("nlp", "trainer-0", "main", "nvidia.com/mig-1g.10gb", ["MIG-ccc"]),
        ("nlp", "trainer-0", "main", "cpu", ["0"]),
        ("other", "x", "y", "nvidia.com/gpu", ["GPU-ddd"]),
    ]
    calls: list[int] = []

    def lister() -> list[tuple[str, str, str, str, list[str]]]:
        calls.append(1)
        return listing

    owners = PodResourcesOwners(lister, pods, refresh_every=30, clock=lambda: 100.0)
    got = owners.owners()
    assert set(got) == {"GPU-aaa", "GPU-bbb", "MIG-ccc", "GPU-ddd"}
    assert got["GPU-bbb"] == DeviceOwner("nlp", "trainer-0", "main", UID, "ir-5")
    assert got["GPU-ddd"] == DeviceOwner("other", "x", "y", None, None)
    owners.owners()
    assert len(calls) == 1  # cached until refresh_every passes


def test_a_failing_kubelet_keeps_the_last_answer() -> None:
    answers: list[object] = [[("ns", "p", "c", "nvidia.com/gpu", ["GPU-1"])], OSError("socket closed")]
    now = [0.0]

    def lister() -> list[tuple[str, str, str, str, list[str]]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    owners = PodResourcesOwners(lister, refresh_every=1, clock=lambda: now[0])
    assert set(owners.owners()) == {"GPU-1"}
    now[0] = 5
    assert set(owners.owners()) == {"GPU-1"}


def test_static_owners() -> None:
    owners = StaticOwners()
    owners.set("GPU-1", DeviceOwner(ir="ir-3"))
    owners.set("GPU-2", DeviceOwner(ir="ir-4"))
    owners.set("GPU-2", None)
    assert dict(owners.owners()) == {"GPU-1": DeviceOwner(ir="ir-3")}


# -- kubelet pod-resources protobuf --------------------------------------------------------------------------


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_decode_list_pod_resources_response() -> None:
    device = _field(1, b"nvidia.com/gpu") + _field(2, b"GPU-1") + _field(2, b"GPU-2") + _field(3, b"\x0a\x02\x08\x00")
    cpu_ids = _varint(3 << 3 | 0) + _varint(7)  # a varint field the decoder skips
    container = (
        _field(1, b"main")
        + _field(2, device)
        + cpu_ids
        + _field(2, _field(1, b"nvidia.com/mig-1g.10gb") + _field(2, b"MIG-9"))
    )
    pod = _field(1, b"trainer-0") + _field(2, b"nlp") + _field(3, container)
    fixed = _varint(9 << 3 | 1) + b"\x00" * 8 + _varint(10 << 3 | 5) + b"\x00" * 4
    message = _field(1, pod) + fixed + _field(1, _field(1, b"empty") + _field(2, b"ns"))
    assert decode_list_response(message) == [
        ("nlp", "trainer-0", "main", "nvidia.com/gpu", ["GPU-1", "GPU-2"]),
        ("nlp", "trainer-0", "main", "nvidia.com/mig-1g.10gb", ["MIG-9"]),
    ]


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\x0b", b"\x08\xff"])
def test_malformed_protobuf_is_a_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_list_response(data)


def test_no_kubelet_socket_means_no_lister(tmp_path: Path) -> None:
    assert kubelet_lister(str(tmp_path / "kubelet.sock")) is None
