"""Who squats a device, as the node agent's `gpufarm.process.squatter` series name them (pid, user, claimed lease,
pod). Read once when an episode starts, to name them in its posts; every value is checked against the shape the
agent writes (spec/metrics.yaml) and a read that fails names nobody rather than failing the step."""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta

from gpufarm.core.chat.squatter_notices import SquatterSeen
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.ports import MetricsQuery

log = logging.getLogger(__name__)

METRIC = "gpufarm.process.squatter"
WINDOW_MINUTES = 10
MAX_SEEN = 16  # the agent names at most 16 squatters per device and cycle (gpufarm_node.squatters.MAX_PER_DEVICE)
_VALUE = re.compile(r"^[^\s,]{1,200}$")  # shown inert (gpufarm.core.chat.escape), whatever it holds
NO_VALUE = "N/A"
_PID = re.compile(r"^[0-9]{1,10}$")


def query_for(host: str, device: str) -> str:
    """The scalar query of one device's squatters, one group per process or pod."""
    return f"max:{METRIC}{{host:{host},gpu_uuid:{device}}} by {{pid,user,claimed_ir,kube_namespace,pod_name}}"


def seen_on(query: MetricsQuery | None, host: str, device: str, now: datetime) -> list[SquatterSeen]:
    """The squatters the agent reported on the device over the last minutes; [] when they cannot be read."""
    if query is None:
        return []
    try:
        results = query.scalar(query_for(host, device), now - timedelta(minutes=WINDOW_MINUTES), now, "max")
    except GpufarmError as exc:
        log.warning("squatters on %s %s could not be read: %s", host, device, exc)
        return []
    seen: list[SquatterSeen] = []
    for result in results[:MAX_SEEN]:
        if result.value is None or result.value <= 0:
            continue
        # A series without one of the group's keys reads `key:N/A` (a process has no pod, a pod no pid).
        tags = {k: v for k, _, v in (t.partition(":") for t in result.group_tags) if v != NO_VALUE and _VALUE.match(v)}
        namespace, name = tags.get("kube_namespace"), tags.get("pod_name")
        pid = tags.get("pid")
        seen.append(
            SquatterSeen(
                pid=pid if pid and _PID.match(pid) else None,
                user=tags.get("user"),
                claimed_ir=tags.get("claimed_ir"),
                pod=f"{namespace or 'default'}/{name}" if name else None,
            )
        )
    return seen
