"""The files a node agent reads besides NVML (a /proc tree, kubelet's pod list and pod-resources), generated
for a fake NVML's processes, so attribution runs for real on a fake node."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol

from gpufarm_node.topology_spec import GpuSpec, PodSpec, ProcessSpec, Topology

# Clock ticks per second in /proc/<pid>/stat (USER_HZ on Linux).
CLK_TCK = 100
BOOT_TIME = 1_600_000_000.0
# The kernel's default pid_max on 64-bit hosts, and the pids it never hands out again after wrapping (RESERVED_PIDS).
PID_MAX = 4_194_304
RESERVED_PIDS = 300


class SimulatedNode(Protocol):
    """What the host files follow: a FakeNvml's topology, clock and process table."""

    topology: Topology
    t0: float
    # The fake tells its host when processes are listed, so /proc matches what NVML reports.
    host: FakeHost | None

    def now(self) -> float:
        """Seconds since the fake started."""

    def alive(self, t: float | None = None) -> list[ProcessSpec]:
        """Processes running at `t`."""

    def gpu_spec(self, index: int) -> GpuSpec:
        """The topology entry of a GPU."""


class FakeHost:
    """The files a node agent reads besides NVML, generated for a FakeNvml's processes under one directory.

    `proc/<pid>/{stat,cgroup,environ}` follow the process table (a reused pid gets a new start time),
    `proc/loadavg` ends with the pid allocation cursor (moved forward, cyclically, past every pid written since),
    and `pods.json` has kubelet's `/pods` shape. Entries are rewritten only when the set of live processes changes.
    """

    def __init__(self, fake: SimulatedNode, root: str | Path) -> None:
        self.fake = fake
        self.root = Path(root)
        self.proc_root = self.root / "proc"
        self.pods_file = self.root / "pods.json"
        self._written: dict[int, float] = {}
        self._lock = threading.Lock()
        self.last_pid = RESERVED_PIDS
        self.proc_root.mkdir(parents=True, exist_ok=True)
        # The boot time a process's start ticks count from (gpufarm_node.squatter_stops reads it).
        (self.proc_root / "stat").write_text(f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(BOOT_TIME)}\n")
        self._write_loadavg()
        self._write_pods()
        fake.host = self
        self.sync(fake.now())

    def sync(self, t: float) -> None:
        """Make /proc match the processes alive at t."""
        wanted = {p.pid: p for p in self.fake.alive(t) if p.proc}
        with self._lock:
            if {pid: p.start for pid, p in wanted.items()} == self._written:
                return
            for pid, start in list(self._written.items()):
                if pid not in wanted or wanted[pid].start != start:
                    shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)
                    del self._written[pid]
            started = []
            for pid, proc in wanted.items():
                if pid not in self._written:
                    self._write_process(proc)
                    self._written[pid] = proc.start
                    started.append(pid)
            if started:
                # The kernel's cursor moves forward through the pid space, wrapping at pid_max: it passed each
                # of these, up to the one furthest ahead of where it was. A node forks other things too, so it
                # rests one further on, unless that is where it started (a whole circle reads as no move).
                cursor = self.last_pid
                furthest = max(started, key=lambda pid: (pid - cursor - 1) % PID_MAX)
                after = furthest + 1 if furthest + 1 < PID_MAX else RESERVED_PIDS
                self.last_pid = furthest if after == cursor else after
                self._write_loadavg()

    def pod_resources(self) -> list[tuple[str, str, str, str, list[str]]]:
        """kubelet pod-resources List(): (namespace, pod, container, resource name, device ids)."""
        out = []
        for pod in self.fake.topology.pods:
            for container in pod.containers:
                by_resource: dict[str, list[str]] = {}
                for gpu_index, mig in container.devices:
                    gpu = self.fake.gpu_spec(gpu_index)
                    if mig is None or gpu.mig is None:
                        by_resource.setdefault("nvidia.com/gpu", []).append(gpu.uuid)
                    else:
                        resource = f"nvidia.com/mig-{gpu.mig[mig].profile}"
                        by_resource.setdefault(resource, []).append(gpu.mig_uuids[mig])
                for resource, ids in by_resource.items():
                    out.append((pod.namespace, pod.name, container.name, resource, ids))
        return out

    def _write_loadavg(self) -> None:
        running = len(self._written)
        (self.proc_root / "loadavg").write_text(f"0.50 0.40 0.30 1/{running + 1} {self.last_pid}\n")

    def _write_process(self, proc: ProcessSpec) -> None:
        directory = self.proc_root / str(proc.pid)
        directory.mkdir(parents=True, exist_ok=True)
        start_ticks = int((self.fake.t0 + proc.start - BOOT_TIME) * CLK_TCK)
        # Fields 3-9 (state .. flags), 10-17 (fault counts and times), 18-21 (priority, nice, threads,
        # itrealvalue), 22 starttime, then the rest up to field 52 (proc(5)).
        fields = ["S", "1", str(proc.pid), str(proc.pid), "0", "-1", "4194560"] + ["0"] * 8
        fields += ["20", "0", "1", "0", str(start_ticks)] + ["0"] * 30
        (directory / "stat").write_text(f"{proc.pid} ({proc.comm}) {' '.join(fields)}\n")
        (directory / "cgroup").write_text(self._cgroup(proc))
        env = {"PATH": "/usr/local/bin:/usr/bin", "HOME": "/root", **proc.env}
        (directory / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))

    def _cgroup(self, proc: ProcessSpec) -> str:
        if proc.pod is not None:
            pod = self.fake.topology.pod(proc.pod)
            cid = next(c.id for c in pod.containers if c.name == proc.container)
            return _kube_cgroup(pod, cid, proc.cgroup)
        if proc.docker is not None:
            if proc.cgroup == "v1":
                return "".join(f"{n}:{c}:/docker/{proc.docker}\n" for n, c in _V1_CONTROLLERS)
            return f"0::/system.slice/docker-{proc.docker}.scope\n"
        return f"0::/system.slice/slurmstepd.scope/job_{proc.pid}/step_0/user/task_0\n"

    def _write_pods(self) -> None:
        pods = self.fake.topology.pods
        items = [_pod_json(pod) for pod in pods]
        self.pods_file.write_text(json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items}))


_V1_CONTROLLERS = ((12, "memory"), (11, "cpu,cpuacct"), (4, "devices"), (1, "name=systemd"))


def _kube_cgroup(pod: PodSpec, cid: str, version: str) -> str:
    if version == "v1":
        qos = "" if pod.qos == "guaranteed" else f"/{pod.qos}"
        return "".join(f"{n}:{c}:/kubepods{qos}/pod{pod.uid}/{cid}\n" for n, c in _V1_CONTROLLERS)
    uid = pod.uid.replace("-", "_")
    if pod.qos == "guaranteed":
        path = f"/kubepods.slice/kubepods-pod{uid}.slice"
    else:
        path = f"/kubepods.slice/kubepods-{pod.qos}.slice/kubepods-{pod.qos}-pod{uid}.slice"
    return f"0::{path}/cri-containerd-{cid}.scope\n"


def _pod_json(pod: PodSpec) -> dict[str, Any]:
    return {
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "labels": dict(pod.labels),
            "annotations": dict(pod.annotations),
        },
        "spec": {"containers": [{"name": c.name} for c in pod.containers]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": c.name, "containerID": f"containerd://{c.id}"} for c in pod.containers],
        },
    }
