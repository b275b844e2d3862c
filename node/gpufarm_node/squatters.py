"""Squatters: busy devices whose process (or pod) belongs to no lease, or to another lease than the device's.

The rules, decided every cycle from what the agent already reads:
- A device's lease is the allocator's: its `gpu_assign:ir-<N>/<uuid>` tag, else, on a dedicated host, the lease
  holding the whole host (its one `ir:` tag, gpufarm_node.tags.host_lease). The processes running on a device never
  make its lease: a device no lease holds has none, whoever runs on it.
- Only a *busy* device (the idle taxonomy's `busy`, gpufarm_node.collect) can be squatted: a process that holds a
  few bytes and computes nothing hurts nobody.
- On a busy device a lease holds, a process whose own IR (`GPUFARM_IR` in its environment, else its pod's
  `gpufarm.io/ir` label, gpufarm_node.attribution) names another lease is a squatter. One that names none is the
  holder's own job that did not set its IR (attribution charges it to the device's lease, as the ledger does), not
  a squatter: flagging every such job would bury the real ones. On a busy device no lease holds, every process is
  a squatter, whatever it claims.

What comes out is a list of `Squatter` records; a pod found on a device of another lease by other means (the
pod-resources API on shared pools) is the same record with its `pod` set and no pid. `squatter_rows` turns them
into series: one `gpufarm.gpu.squatters` value per device (0 when clean, so a monitor's alert recovers on the
next cycle), and one `gpufarm.process.squatter` per squatting process or pod with who it is.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Protocol

from gpufarm_node.attribution import DeviceOwner, Workload
from gpufarm_node.enforce.pod_leases import PodMismatch, pod_mismatches
from gpufarm_node.model import ProcessSample
from gpufarm_node.series_tags import NO_IR, pod_tags
from gpufarm_node.tags import normalize_tag

_PID = attrgetter("pid")
SQUATTERS_METRIC = "gpufarm.gpu.squatters"
SQUATTER_METRIC = "gpufarm.process.squatter"
# Per device and cycle, the squatting processes reported one by one; past this many the rest are counted only.
MAX_PER_DEVICE = 16
# Cached user names (uid -> name); a uid table is small, this bounds a pathological one.
_MAX_USERS = 4096


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod a squatter runs in, as far as it is known."""

    namespace: str | None = None
    name: str | None = None
    uid: str | None = None
    container: str | None = None


@dataclass(frozen=True, slots=True)
class Squatter:
    """One process (or pod) running on a device of another lease, or of none.

    `device_ir` is the lease holding the device (None: no lease); `claimed_ir` the lease the process says it is of
    (None: it claims none). `pid` is None for a pod found through pod-resources rather than a process.
    """

    device: str
    device_ir: str | None
    claimed_ir: str | None
    pid: int | None = None
    pod: PodRef | None = None


def device_lease(device_key: str, assigned: Mapping[str, str], host_ir: str | None) -> str | None:
    """The lease holding a device: its `gpu_assign` tag's, else the whole host's (dedicated hosts only), else None."""
    return assigned.get(device_key) or host_ir


def find(
    device_key: str,
    lease: str | None,
    processes: Sequence[ProcessSample],
    workloads: Mapping[int, Workload | None],
) -> list[Squatter]:
    """The squatters among a busy device's processes (the caller checks the device is busy)."""
    found: list[Squatter] = []
    get = workloads.get
    for proc in processes:
        workload = get(proc.pid)
        claimed = workload.ir if workload is not None else None
        if lease is not None and claimed in (lease, None):
            continue
        found.append(Squatter(device_key, lease, claimed, proc.pid, _pod_of(workload)))
    return found


def from_pod_mismatch(mismatch: PodMismatch) -> Squatter:
    """A pod on a device of another lease, as gpufarm_node.enforce.pod_leases finds it, as a squatter record."""
    return Squatter(mismatch.device, mismatch.device_ir, mismatch.pod_ir, pod=PodRef(mismatch.namespace, mismatch.pod))


class HostLeases(Protocol):
    """The host's leases as the agent read them this cycle (gpufarm_node.hosttags.HostTagWatch)."""

    @property
    def known(self) -> bool: ...

    @property
    def assignments(self) -> Mapping[str, str]: ...

    @property
    def host_ir(self) -> str | None: ...


def pod_squatters(owners: Callable[[], Mapping[str, DeviceOwner]], leases: HostLeases) -> Callable[[], list[Squatter]]:
    """The agent's squatter source on a Kubernetes node (`--enforce kubernetes`): each pod on a device of another
    lease (the device owners kubelet's pod-resources gave this cycle, gpufarm_node.enforce.pod_leases), from a good
    read of the host's tags only."""

    def source() -> list[Squatter]:
        if not leases.known:
            return []
        return [from_pod_mismatch(m) for m in pod_mismatches(owners(), leases.assignments, leases.host_ir)]

    return source


def _pod_of(workload: Workload | None) -> PodRef | None:
    if workload is None or (workload.pod_uid is None and workload.pod_name is None):
        return None
    return PodRef(workload.namespace, workload.pod_name, workload.pod_uid, workload.container_name)


class UserNames:
    """The user a squatting process runs as: the owner of its /proc entry (the process's effective uid), by name.

    Only squatters are looked up, so a clean cycle costs nothing here. A uid without a name reads `uid-<n>`; a
    process gone from /proc reads None.
    """

    def __init__(self, proc_root: str = "/proc", lookup: Callable[[int], str] | None = None) -> None:
        self.root = proc_root.rstrip("/") or "/"
        self._lookup = lookup or _passwd_name
        self._names: dict[int, str] = {}

    def of(self, pid: int) -> str | None:
        """The user name of a process, normalised as a tag value."""
        try:
            uid = Path(f"{self.root}/{pid}").stat().st_uid
        except OSError:
            return None
        name = self._names.get(uid)
        if name is None:
            if len(self._names) >= _MAX_USERS:
                self._names.clear()
            name = self._names[uid] = user_tag_value(self._lookup(uid), uid)
        return name


def _passwd_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def user_tag_value(name: str, uid: int) -> str:
    """A POSIX user name as a tag value; `uid-<n>` when there is none or it is not a plain user name."""
    value = normalize_tag(name)[:32]
    if not value or not ("a" <= value[0] <= "z" or value[0] == "_") or value != name.lower()[:32]:
        return f"uid-{uid}"
    return value


def squatter_rows(
    common: tuple[str, ...], squatters: Iterable[Squatter], user_of: Callable[[int], str | None]
) -> list[tuple[str, float, tuple[str, ...]]]:
    """One `gpufarm.process.squatter` series per squatter (at most MAX_PER_DEVICE per device): its device's uuid,
    the two leases, pid, user and pod. The per-device count, `gpufarm.gpu.squatters`, is the caller's
    (gpufarm_node.collect), as it carries the device's own tags."""
    out: list[tuple[str, float, tuple[str, ...]]] = []
    per_device: dict[str, int] = {}
    for squatter in squatters:
        count = per_device.get(squatter.device, 0)
        if count >= MAX_PER_DEVICE:
            continue
        per_device[squatter.device] = count + 1
        out.append((SQUATTER_METRIC, 1.0, (*common, *squatter_tags(squatter, user_of))))
    return out


def squatter_tags(squatter: Squatter, user_of: Callable[[int], str | None]) -> tuple[str, ...]:
    """Who squats where: the device, the lease holding it, the lease claimed, pid, user and pod."""
    tags = [
        f"gpu_uuid:{squatter.device}",
        f"gpu_ir:{squatter.device_ir or NO_IR}",
        f"claimed_ir:{squatter.claimed_ir or NO_IR}",
    ]
    if squatter.pid is not None:
        tags.append(f"pid:{squatter.pid}")
        user = user_of(squatter.pid)
        if user:
            tags.append(f"user:{user}")
    pod = squatter.pod
    if pod is not None:
        tags.extend(pod_tags(pod.uid, pod.name, pod.namespace, pod.container))
    return tuple(tags)


Row = tuple[str, float, tuple[str, ...]]
# Cached plans; past this many (process churn) they start over rather than grow.
_MAX_PLANS = 4096


class SquatterPlans:
    """What a busy device's processes come to as squatters, with their series, cached per device.

    As the container plan of gpufarm_node.collect, a plan is keyed by the device, its lease, its processes' pids
    and their workload objects (which the attributor keeps while a process lives, so a new process is a new key),
    or by an object standing for exactly those processes (that container plan, when every process is known): a
    squatter's user is looked up once, and a cycle that finds what the last one found costs a lookup.
    """

    def __init__(self, common: tuple[str, ...], user_of: Callable[[int], str | None]) -> None:
        self.common = common
        self._user_of = user_of
        self._plans: dict[tuple[object, ...], tuple[object, list[Squatter], list[Row]]] = {}

    def device(
        self,
        device_key: str,
        lease: str | None,
        device_tags: tuple[str, ...],
        processes: Sequence[ProcessSample] | None,
        workloads: Mapping[int, Workload | None],
        *,
        reported: Sequence[Squatter] = (),
        processes_token: object | None = None,
    ) -> tuple[list[Squatter], list[Row]]:
        """A device's squatters and rows: its count (tagged `device_tags`) first, then each squatter's.

        `processes` are those of a busy device (None: not busy, so none of them squats); `reported` holds what
        another source found on this device (a pod of another lease through pod-resources, whether or not the
        device is busy), merged in unless a process of the same pod (namespace and name) was found already.
        `processes_token`: an object that stands for exactly these processes while it lives (gpufarm_node.collect's
        container plan), a cheaper key.
        """
        found, rows = (
            self.plan(device_key, lease, device_tags, processes, workloads, processes_token=processes_token)
            if processes
            else ([], [])
        )
        if not reported:
            return found, rows or [(SQUATTERS_METRIC, 0.0, device_tags)]
        pods = {(s.pod.namespace, s.pod.name) for s in found if s.pod is not None and s.pod.name}
        extra = [s for s in reported if s.pod is None or (s.pod.namespace, s.pod.name) not in pods]
        merged = [*found, *extra]
        count: Row = (SQUATTERS_METRIC, float(len(merged)), device_tags)
        return merged, [count, *squatter_rows(self.common, merged, self._user_of)]

    def plan(
        self,
        device_key: str,
        lease: str | None,
        device_tags: tuple[str, ...],
        processes: Sequence[ProcessSample],
        workloads: Mapping[int, Workload | None],
        *,
        processes_token: object | None = None,
    ) -> tuple[list[Squatter], list[Row]]:
        """A busy device's squatters and its rows: its count (tagged `device_tags`) first, then each squatter's."""
        if processes_token is not None:
            key: tuple[object, ...] = (device_key, lease, id(device_tags), id(processes_token))
            held: object = (device_tags, processes_token)
        else:
            pids = list(map(_PID, processes))
            found = list(map(workloads.get, pids))
            key = (device_key, lease, id(device_tags), *pids, *map(id, found))
            held = (device_tags, found)
        entry = self._plans.get(key)
        if entry is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            squatters = find(device_key, lease, processes, workloads)
            count: Row = (SQUATTERS_METRIC, float(len(squatters)), device_tags)
            # The objects whose ids are in the key are held by the entry, so their ids stay theirs.
            entry = self._plans[key] = (
                held,
                squatters,
                [count, *squatter_rows(self.common, squatters, self._user_of)],
            )
        return entry[1], entry[2]
