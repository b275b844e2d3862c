"""Who a GPU process belongs to: PID -> container / pod (cgroup) -> IR (environment, pod label, device owner).

Sources, in the order they win for a process's IR:
1. `GPUFARM_IR` in `/proc/<pid>/environ` (the environment the process started with; readable with hostPID and
   CAP_SYS_PTRACE or the same uid);
2. the `gpufarm.io/ir` label or annotation of its pod, from a kubelet-style pod list JSON file (GPUFARM_POD_METADATA,
   the shape of kubelet's `/pods` or `kubectl get pods -o json`); the pod is found through the pod UID in the
   process's cgroup path;
3. the owner of the device it runs on (kubelet pod-resources, or an assignment made by the simulation);
4. on a dedicated host, the lease holding the whole host, its one `ir:` tag (the caller supplies it; see `collect`
   and gpufarm_node.tags.host_lease).

/proc reads go through a configurable root (GPUFARM_PROC_ROOT) so tests run on a generated tree. What /proc
tells about a process is cached by (pid, start time), so a reused pid is re-read (dcgm-exporter's cache is keyed
by pid alone and mis-attributes reused pids, docs/nvml.md §5).

Reading every GPU process's start time every cycle was the agent's largest /proc cost (three system calls per
process). The kernel hands out pids cyclically: a pid is reused only when the allocation cursor passes it, and the
last field of /proc/loadavg is that cursor (the last pid allocated in the reader's pid namespace, the host's with
hostPID). So each cycle reads it once, and re-reads a cached process's start time only when the cursor moved
over its pid since the last cycle, or on its turn in a slow rotation (every `VERIFY_EVERY` cycles per pid, which
bounds the cost of a cursor that went once round the whole pid space between two cycles). Without a readable
loadavg every start time is read every cycle.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

from gpufarm_node.tags import ir_tag_value

log = logging.getLogger("gpufarm_node.attribution")

IR_ENV = "GPUFARM_IR"
IR_LABEL = "gpufarm.io/ir"
# Cgroup path patterns, after dd-trace-py's container.py and dcgm-exporter's pidmapper (docs/nvml.md §5).
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_LINE = re.compile(r"^(\d+):([^:]*):(.+)$")
_POD = re.compile(rf"pod({_UUID})(?:\.slice)?$")
_CONTAINER = re.compile(r"(?:.+)?([0-9a-f]{64}|[0-9a-f]{32}-\d+)(?:\.scope)?$")
_STAT_STARTTIME = 19  # field 22 of /proc/<pid>/stat, counted after the `(comm)` field
_ENVIRON_LIMIT = 1 << 20
# A cached process's start time is re-read on its turn once in this many cycles even when the pid cursor says
# its pid was not handed out again (a cursor that went round the whole pid space between two cycles).
VERIFY_EVERY = 20


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """The container and pod a cgroup path names (either may be None: bare metal, systemd services)."""

    container_id: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod as the pod list describes it."""

    uid: str
    name: str
    namespace: str
    ir: str | None
    # container id -> container name
    containers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class DeviceOwner:
    """Who holds a GPU or MIG slice (kubelet pod-resources, or a simulation's assignment)."""

    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    pod_uid: str | None = None
    ir: str | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """What a process is part of; `ir` is a tag value such as `ir-123`."""

    container_id: str | None = None
    pod_uid: str | None = None
    pod_name: str | None = None
    namespace: str | None = None
    container_name: str | None = None
    ir: str | None = None


UNKNOWN = Workload()


class DeviceOwners(Protocol):
    """Maps device UUIDs (as NVML spells them) to owners."""

    def owners(self) -> Mapping[str, DeviceOwner]:
        """Current owners; devices without an owner are absent."""


def parse_cgroup(text: str) -> CgroupIdentity:
    """Container id and pod UID from /proc/<pid>/cgroup (v1 and v2, cgroupfs and systemd drivers)."""
    container: str | None = None
    pod: str | None = None
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        segments = [s for s in match.group(3).split("/") if s]
        if not segments:
            continue
        if pod is None:
            for segment in segments:
                found = _POD.search(segment)
                if found:
                    pod = found.group(1).replace("_", "-")
        if container is None:
            found = _CONTAINER.match(segments[-1])
            if found:
                container = found.group(1)
        if container is not None and pod is not None:
            break
    return CgroupIdentity(container, pod)


def ir_value(text: str | None) -> str | None:
    """`IR-123`, `ir-123`, `123` -> `ir-123`; None for anything else."""
    if not text:
        return None
    return ir_tag_value(text)


class ProcFs:
    """Reads the few /proc files attribution needs; missing or unreadable files read as None."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = str(root).rstrip("/") or "/"

    def _read(self, pid: int, name: str, limit: int) -> bytes | None:
        try:
            fd = os.open(f"{self.root}/{pid}/{name}", os.O_RDONLY)
        except OSError:
            return None
        try:
            chunks = []
            size = 0
            while size < limit:
                chunk = os.read(fd, min(65536, limit - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError:
            # The process exited between open and read, or the kernel refused (ESRCH, EACCES).
            return None
        finally:
            os.close(fd)

    def starttime(self, pid: int) -> int | None:
        """Start time in clock ticks after boot; None when the process is gone."""
        # Read every cycle for every GPU process (PID reuse), so one read() call: procfs hands a file this
        # small over whole.
        data = _read_once(f"{self.root}/{pid}/stat", 4096)
        if data is None:
            return None
        # comm may hold spaces and parentheses: the fields start after the last ')'.
        fields = data.rpartition(b")")[2].split()
        try:
            return int(fields[_STAT_STARTTIME])
        except (IndexError, ValueError):
            return None

    def last_pid(self) -> int | None:
        """The pid allocation cursor: the last pid handed out (the last field of /proc/loadavg); None if unknown."""
        data = _read_once(f"{self.root}/loadavg", 256)
        if data is None:
            return None
        fields = data.split()
        try:
            return int(fields[4]) if len(fields) == 5 else None
        except ValueError:
            return None

    def cgroup(self, pid: int) -> CgroupIdentity | None:
        """Container and pod of a process."""
        data = self._read(pid, "cgroup", 65536)
        return None if data is None else parse_cgroup(data.decode(errors="replace"))

    def environ_value(self, pid: int, name: str) -> str | None:
        """One variable of the environment the process started with."""
        data = self._read(pid, "environ", _ENVIRON_LIMIT)
        if not data:
            return None
        key = name.encode() + b"="
        for entry in data.split(b"\0"):
            if entry.startswith(key):
                return entry[len(key) :].decode(errors="replace").strip()
        return None


class PodMetadataFile:
    """Pods from a kubelet `/pods`-shaped JSON file, re-read when it changes (checked at most every few seconds)."""

    def __init__(
        self,
        path: str | Path,
        *,
        ir_key: str = IR_LABEL,
        check_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.ir_key = ir_key
        self._check_every = check_every
        self._clock = clock
        self._checked_at: float | None = None
        self._mtime: float | None = None
        self._by_uid: dict[str, PodInfo] = {}
        self._by_name: dict[tuple[str, str], PodInfo] = {}
        self._warned = False
        # Bumped on every reload, so callers can cache what they joined with the pod list.
        self.generation = 0

    def refresh(self) -> None:
        """Reload when the file changed; a broken file keeps the last good pod list."""
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < self._check_every:
            return
        self._checked_at = now
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            self._warn(f"pod metadata file {self.path} is missing")
            return
        if mtime == self._mtime:
            return
        try:
            pods = parse_pod_list(json.loads(self.path.read_bytes()), self.ir_key)
        except (OSError, ValueError) as exc:
            self._warn(f"pod metadata file {self.path} is unreadable: {exc}")
            return
        self._mtime = mtime
        self._by_uid = {p.uid: p for p in pods}
        self._by_name = {(p.namespace, p.name): p for p in pods}
        self._warned = False
        self.generation += 1

    def by_uid(self, uid: str) -> PodInfo | None:
        """A pod by UID."""
        return self._by_uid.get(uid)

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        """A pod by namespace and name."""
        return self._by_name.get((namespace, name))

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(message)


def parse_pod_list(doc: Any, ir_key: str = IR_LABEL) -> list[PodInfo]:
    """PodInfo for each item of a PodList document; malformed items are skipped."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a pod list (expected an object with an `items` list)")  # noqa: TRY004 - a bad file
    pods = []
    for item in doc["items"]:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) for k in ("uid", "name", "namespace")):
            continue
        labels = _dict(meta.get("labels"))
        annotations = _dict(meta.get("annotations"))
        ir = ir_value(str(labels.get(ir_key) or annotations.get(ir_key) or ""))
        containers: dict[str, str] = {}
        status = item.get("status")
        statuses = status.get("containerStatuses") if isinstance(status, dict) else None
        for entry in statuses if isinstance(statuses, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("containerID"), str):
                # `containerd://<id>`, `docker://<id>`, `cri-o://<id>`
                containers[entry["containerID"].rpartition("://")[2]] = str(entry.get("name", ""))
        pods.append(PodInfo(meta["uid"], meta["name"], meta["namespace"], ir, containers))
    return pods


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class StaticOwners:
    """Device owners set by the caller (a simulation's assignments, or a fixed map)."""

    def __init__(self, owners: Mapping[str, DeviceOwner] | None = None) -> None:
        self._owners: dict[str, DeviceOwner] = dict(owners or {})

    def set(self, device_uuid: str, owner: DeviceOwner | None) -> None:
        """Give a device an owner (None frees it)."""
        if owner is None:
            self._owners.pop(device_uuid, None)
        else:
            self._owners[device_uuid] = owner

    def owners(self) -> Mapping[str, DeviceOwner]:
        """Current owners."""
        return self._owners


# (namespace, pod, container, resource name, device ids), as kubelet's pod-resources List() has them.
PodDevices = tuple[str, str, str, str, list[str]]


class PodResourcesOwners:
    """Device owners from kubelet's pod-resources API, joined with pod metadata for the UID and IR label."""

    def __init__(
        self,
        lister: Callable[[], Iterable[PodDevices]],
        pods: PodMetadataFile | None = None,
        *,
        refresh_every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lister = lister
        self._pods = pods
        self._refresh_every = refresh_every
        self._clock = clock
        self._at: float | None = None
        self._owners: dict[str, DeviceOwner] = {}

    def owners(self) -> Mapping[str, DeviceOwner]:
        """Owners, refreshed every `refresh_every` seconds; on a failed refresh the last answer stands."""
        now = self._clock()
        if self._at is not None and now - self._at < self._refresh_every:
            return self._owners
        self._at = now
        try:
            listing = list(self._lister())
        except Exception as exc:  # noqa: BLE001 - kubelet errors vary by transport; keep the last good map
            log.warning("kubelet pod-resources listing failed: %s", exc)
            return self._owners
        owners: dict[str, DeviceOwner] = {}
        for namespace, pod, container, resource, device_ids in listing:
            if resource != "nvidia.com/gpu" and not resource.startswith("nvidia.com/mig-"):
                continue
            info = self._pods.by_name(namespace, pod) if self._pods else None
            owner = DeviceOwner(namespace, pod, container, info.uid if info else None, info.ir if info else None)
            for device_id in device_ids:
                # EKS time-slicing appends `::<n>` to the UUID (dcgm-exporter stripVGPUSuffix).
                owners[device_id.partition("::")[0]] = owner
        self._owners = owners
        return owners


class Attributor:
    """Resolves processes to workloads, once per (pid, start time), and exposes device owners."""

    def __init__(
        self,
        proc: ProcFs | None = None,
        *,
        pods: PodMetadataFile | None = None,
        owners: DeviceOwners | None = None,
        ir_env: str = IR_ENV,
        cache_size: int = 16384,
    ) -> None:
        self.proc = proc or ProcFs()
        self.pods = pods
        self._owners_source = owners
        self._ir_env = ir_env
        self._cache_size = cache_size
        # pid -> (start time, what /proc said (container id, pod uid), IR from the environment)
        self._cache: dict[int, tuple[int, CgroupIdentity, str | None]] = {}
        # pid -> (start time, pod list generation, the joined workload): the per-cycle fast path.
        self._joined: dict[int, tuple[int, int, Workload]] = {}
        self._seen: set[int] = set()
        self._bad_ir: set[int] = set()
        self.device_owners: Mapping[str, DeviceOwner] = {}
        # The pid cursor at the last two cycles: pids in (previous, current] may have been handed out again.
        self._cursor: int | None = None
        self._window: tuple[int, int] | None = None
        self._turn = 0
        # The last workloads() call of this cycle and of the cycle before: while a node's processes stay the
        # same, a cycle starts from the last one's answers (_Steady).
        self._last: _Steady | None = None
        self._previous: _Steady | None = None
        self._evicted = False

    def begin_cycle(self) -> None:
        """Refresh the pod list and the device owners; read the pid cursor."""
        if self.pods is not None:
            self.pods.refresh()
        self.device_owners = self._owners_source.owners() if self._owners_source else {}
        self._seen = set()
        cursor = self.proc.last_pid()
        previous, self._cursor = self._cursor, cursor
        self._window = None if cursor is None or previous is None else (previous, cursor)
        self._turn = (self._turn + 1) % VERIFY_EVERY
        self._previous, self._last = self._last, None

    def workload(self, pid: int) -> Workload | None:
        """The process's workload; None when the process is gone from /proc."""
        return self.workloads((pid,))[pid]

    def workloads(self, pids: Iterable[int]) -> dict[int, Workload | None]:
        """`workload` of each pid; a cached process the pid cursor did not pass costs a lookup, not a call."""
        pids = pids if isinstance(pids, list) else list(pids)
        generation = self.pods.generation if self.pods is not None else 0
        steady = self._previous
        self._previous = None
        if steady is not None and not self._seen and steady.holds(pids, generation, self._window):
            self._seen = set(steady.seen)
            last = self._steady(steady, generation)
        else:
            self._seen.update(pids)
            last = _Steady(pids, generation, self._each(pids, generation))
        self._last = None if self._evicted else last
        self._evicted = False
        return last.found

    def _steady(self, steady: _Steady, generation: int) -> _Steady:
        """The last cycle's answers for the same pids, the pid cursor unmoved and the pod list unchanged: only the
        pids on their rotation turn, and those that were gone, are read again; what _each would answer."""
        found = dict(steady.found)
        checked = self._checked
        joined = self._joined.get
        again = list(dict.fromkeys(chain(steady.turn(self._turn), steady.gone)))
        for pid in again:
            found[pid] = checked(pid, joined(pid), generation)
        return steady.next(found, [pid for pid in again if found[pid] is None])

    def _each(self, pids: list[int], generation: int) -> dict[int, Workload | None]:
        found: dict[int, Workload | None] = {}
        window, turn = self._window, self._turn
        # Pids in (low, high] may have been handed out again since the last cycle (the cursor may have wrapped
        # round pid_max: then (low, pid_max) and [0, high]).
        low, high = window if window is not None else (0, 0)
        wrapped = low > high
        for pid, joined in zip(pids, map(self._joined.get, pids), strict=True):
            if joined is not None and window is not None and (pid + turn) % VERIFY_EVERY:
                passed = (pid > low or pid <= high) if wrapped else low < pid <= high
                if not passed:
                    if joined[1] == generation:
                        found[pid] = joined[2]
                    else:  # the same process: only the pod list changed
                        found[pid] = self._resolve(pid, joined[0], generation)
                    continue
            found[pid] = self._checked(pid, joined, generation)
        return found

    def _checked(self, pid: int, joined: tuple[int, int, Workload] | None, generation: int) -> Workload | None:
        """Read the start time, then the cached workload if it is the same process, else read and join."""
        start = self.proc.starttime(pid)
        if start is None:
            self._cache.pop(pid, None)
            self._joined.pop(pid, None)
            return None
        if joined is not None and joined[0] == start and joined[1] == generation:
            return joined[2]
        return self._resolve(pid, start, generation)

    def _resolve(self, pid: int, start: int, generation: int) -> Workload:
        cached = self._cache.get(pid)
        if cached is None or cached[0] != start:
            cached = (start, *self._read_process(pid))
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[pid] = cached
        _, cgroup, ir = cached
        workload = self._join(cgroup, ir)
        if len(self._joined) >= self._cache_size:
            self._joined.pop(next(iter(self._joined)))
            self._evicted = True  # an answer of this call may have left the cache: no steady start next cycle
        self._joined[pid] = (start, generation, workload)
        return workload

    def _read_process(self, pid: int) -> tuple[CgroupIdentity, str | None]:
        cgroup = self.proc.cgroup(pid) or CgroupIdentity()
        raw_ir = self.proc.environ_value(pid, self._ir_env)
        env_ir = ir_value(raw_ir)
        if raw_ir and env_ir is None and pid not in self._bad_ir:
            self._bad_ir.add(pid)
            log.warning("pid %d: %s=%r is not an incident number; ignored", pid, self._ir_env, raw_ir[:40])
        return cgroup, env_ir

    def _join(self, cgroup: CgroupIdentity, ir: str | None) -> Workload:
        pod = self.pods.by_uid(cgroup.pod_uid) if self.pods is not None and cgroup.pod_uid else None
        if pod is None:
            return Workload(cgroup.container_id, cgroup.pod_uid, ir=ir)
        container_name = pod.containers.get(cgroup.container_id or "")
        return Workload(cgroup.container_id, pod.uid, pod.name, pod.namespace, container_name, ir or pod.ir)

    def end_cycle(self) -> None:
        """Forget processes not seen this cycle."""
        seen = self._seen
        for cache in (self._cache, self._joined):
            if len(cache) > len(seen) or not seen.issuperset(cache):
                for pid in cache.keys() - seen:
                    del cache[pid]
        self._bad_ir &= self._seen

    @property
    def cached(self) -> int:
        """Processes currently cached (for tests and the benchmark)."""
        return len(self._cache)


class _Steady:
    """One workloads() call's pids and answers, with what a cycle that starts from them needs: the pids by their
    turn in the start-time rotation and those that were gone."""

    __slots__ = ("found", "generation", "gone", "pids", "seen", "turns")

    def __init__(
        self,
        pids: list[int],
        generation: int,
        found: dict[int, Workload | None],
        *,
        seen: frozenset[int] | None = None,
        gone: list[int] | None = None,
        turns: dict[int, list[int]] | None = None,
    ) -> None:
        self.pids = pids
        self.generation = generation
        self.found = found
        self.seen = frozenset(pids) if seen is None else seen
        self.gone = [pid for pid, workload in found.items() if workload is None] if gone is None else gone
        # Made by the first cycle that starts from these pids, then handed on.
        self.turns = turns

    def next(self, found: dict[int, Workload | None], gone: list[int]) -> _Steady:
        """The same pids with this cycle's answers (`gone`: those that are None)."""
        return _Steady(self.pids, self.generation, found, seen=self.seen, gone=gone, turns=self.turns)

    def holds(self, pids: list[int], generation: int, window: tuple[int, int] | None) -> bool:
        """Whether a cycle may start from these answers: the same pids in the same order, the same pod list, and
        a pid cursor read at both cycles that did not move (so no pid was handed out again)."""
        return window is not None and window[0] == window[1] and generation == self.generation and pids == self.pids

    def turn(self, turn: int) -> list[int]:
        """The pids whose start time the rotation reads at `turn` (those with (pid + turn) % VERIFY_EVERY == 0)."""
        turns = self.turns
        if turns is None:
            turns = self.turns = {}
            for pid in self.seen:
                turns.setdefault(pid % VERIFY_EVERY, []).append(pid)
        return turns.get(-turn % VERIFY_EVERY, [])


def _read_once(path: str, size: int) -> bytes | None:
    """A small procfs file in one read() call (procfs hands a file this small over whole); None when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
