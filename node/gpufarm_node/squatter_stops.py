"""Stops gpufarm decided: SIGTERM to a squatter that outlasted its grace, carried out by the host's agent.

gpufarm (not the agent) decides a stop, from the lease's squatting episode and its pool's `stop-after` policy
(gpufarm.core.squatters), and publishes it where the agent already learns its leases, the host's tags:
`gpufarm_stop:<gpu-uuid>/<unix seconds>`, removed when the episode ends. Each cycle the agent sends SIGTERM to a
process only when all of these hold:

- the host does not carry `gpufarm_exempt:squatters` (an operator's exemption);
- the process is a squatter on that device this cycle (gpufarm_node.squatters: busy device, not of its lease);
- it started no later than the stop's time, the start of the episode gpufarm told about (a pid reused by a newer
  process is never hit), read from /proc as the attribution reads it.

Each process (pid and start time) is signalled once. Where the agent has an eviction hook (`evict`: the Kubernetes
step, gpufarm_node.enforce.kube_evict), a squatter in a known pod (namespace and name) is not signalled: its pod is
handed to the hook, as a `PodStop` naming the episode, and evicted through the Kubernetes API (a process of it under
a pid is still held to the start-time rule). The hook is told every cycle the whole set of pods to stop, an empty
one on an exempt host or once the episode's tag is gone, so it drops what no longer stands. Without a hook a pod
found with no pid (pod-resources) is logged once per episode and left. At most MAX_STOPS stop tags are read.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpufarm_node.enforce.pod_stops import PodStop
from gpufarm_node.squatters import PodRef, Squatter

log = logging.getLogger(__name__)

STOP_KEY = "gpufarm_stop"
EXEMPT_TAG = "gpufarm_exempt:squatters"
MAX_STOPS = 16
_STOP_RE = re.compile(r"^(?P<device>(?:gpu|mig)-[0-9a-f-]{8,80})/(?P<since>[0-9]{9,11})$")
_STAT_STARTTIME = 19  # field 22 of /proc/<pid>/stat, counted after the comm's closing parenthesis
# Signalled processes (pid, start) and pods told of without a hook, remembered; past this many the memory starts over.
_MAX_DONE = 4096


class EvictHook(Protocol):
    """The Kubernetes side (gpufarm_node.enforce.kube_evict.PodEvictor): told each cycle which pods gpufarm's stops
    name now, without I/O; it evicts each once per episode in its own thread and forgets the ones no longer named."""

    def want(self, stops: Sequence[PodStop]) -> None: ...


@dataclass(frozen=True)
class StopOrder:
    """Stop the squatters of `device` that started by `since` (unix seconds)."""

    device: str
    since: int


def stop_orders(tags: Iterable[str]) -> list[StopOrder]:
    """The stop tags among a host's tags, well-formed ones only, at most MAX_STOPS."""
    prefix = f"{STOP_KEY}:"
    out: list[StopOrder] = []
    for tag in tags:
        if not tag.startswith(prefix):
            continue
        match = _STOP_RE.match(tag[len(prefix) :])
        if match is not None:
            out.append(StopOrder(match.group("device"), int(match.group("since"))))
            if len(out) >= MAX_STOPS:
                break
    return out


class ProcessStarts:
    """When a process started, in unix seconds, from /proc (`stat` starttime and the boot time `btime`)."""

    def __init__(self, proc_root: str = "/proc", ticks: int | None = None) -> None:
        self.root = proc_root.rstrip("/") or "/"
        self.ticks = ticks or os.sysconf("SC_CLK_TCK")
        self._boot: float | None = None

    def boot_time(self) -> float | None:
        """The host's boot time (`btime` of /proc/stat), read once."""
        if self._boot is None:
            try:
                lines = Path(f"{self.root}/stat").read_bytes()[: 1 << 20].splitlines()
                btime = next((line for line in lines if line.startswith(b"btime ")), None)
                self._boot = float(btime.split()[1]) if btime is not None else None
            except (OSError, ValueError, IndexError):
                return None
        return self._boot

    def of(self, pid: int) -> tuple[int, float] | None:
        """(start ticks, start in unix seconds) of a process; None when it is gone or unreadable."""
        boot = self.boot_time()
        try:
            data = Path(f"{self.root}/{pid}/stat").read_bytes()[:4096]
            ticks = int(data.rpartition(b")")[2].split()[_STAT_STARTTIME])
        except (OSError, ValueError, IndexError):
            return None
        return None if boot is None else (ticks, boot + ticks / self.ticks)


class SquatterStopper:
    """Carries out the host's stop tags on this cycle's squatters (see the module docstring)."""

    def __init__(
        self,
        starts: ProcessStarts,
        *,
        kill: Callable[[int, int], None] = os.kill,
        evict: EvictHook | None = None,
    ) -> None:
        self.starts = starts
        self._kill = kill
        self.evict = evict
        self._done: set[tuple[int, int]] = set()
        self._told: set[tuple[str | None, str | None, int]] = set()

    def apply(self, host_tags: Sequence[str], squatters: Sequence[Squatter]) -> list[int]:
        """Signal the squatters the host's stop tags name, hand their pods to the eviction hook; the pids signalled
        this call."""
        pods: list[PodStop] = []
        stopped: list[int] = []
        orders = {o.device: o for o in stop_orders(host_tags)} if squatters and EXEMPT_TAG not in host_tags else {}
        for squatter in squatters if orders else ():
            order = orders.get(squatter.device.lower())
            if order is None or (squatter.device_ir is not None and squatter.claimed_ir == squatter.device_ir):
                continue
            pod = self._pod_to_evict(squatter, order)
            if pod is not None:
                pods.append(pod)
            elif squatter.pid is None:
                self._unhooked(squatter.pod, order)
            elif self._stop(squatter.pid, order):
                stopped.append(squatter.pid)
        if self.evict is not None:
            self.evict.want(pods)
        return stopped

    def _pod_to_evict(self, squatter: Squatter, order: StopOrder) -> PodStop | None:
        """The squatter's pod when the eviction hook takes it (its process, if known, began by the episode's start);
        None when it is no pod the hook can evict, and its process is signalled (or said) instead."""
        pod = squatter.pod
        if self.evict is None or pod is None or not (pod.namespace and pod.name):
            return None
        if squatter.pid is not None and self._started_by(squatter.pid, order) is None:
            return None
        return PodStop(pod.namespace, pod.name, order.device, order.since)

    def _started_by(self, pid: int, order: StopOrder) -> tuple[int, float] | None:
        """The process's start when it began no later than the episode; None when gone, unreadable or newer."""
        start = self.starts.of(pid)
        return None if start is None or start[1] > order.since else start

    def _stop(self, pid: int, order: StopOrder) -> bool:
        start = self._started_by(pid, order)
        if start is None:
            return False  # gone, unreadable, or a newer process under a reused pid
        key = (pid, start[0])
        if key in self._done:
            return False
        if len(self._done) >= _MAX_DONE:
            self._done.clear()
        self._done.add(key)
        try:
            self._kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        except PermissionError:
            log.warning("squatter %d on %s: no permission to stop it", pid, order.device)
            return False
        log.warning("stopped squatter %d on %s (SIGTERM), as gpufarm decided", pid, order.device)
        return True

    def _unhooked(self, pod: PodRef | None, order: StopOrder) -> None:
        key = (pod.namespace if pod else None, pod.name if pod else None, order.since)
        if key in self._told:
            return
        if len(self._told) >= _MAX_DONE:
            self._told.clear()
        self._told.add(key)
        log.warning(
            "squatting pod %s/%s on %s: no eviction hook (the Kubernetes step is off); left running",
            key[0],
            key[1],
            order.device,
        )
