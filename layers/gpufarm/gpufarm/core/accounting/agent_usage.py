"""Busy GPUs on the pools whose `metrics_source` is `datadog-agent`: the ledger's **used** there
(core.accounting.gpu_hours).

Those hosts run the Datadog Agent's GPU check, not gpufarm-node, so `gpufarm.ir.gpus_busy` never comes from them.
The check sends `gpu.sm_active` (percent of time the SMs were active) per device (`gpu_uuid`), and Datadog stamps the
host's tags on every point, among them the `ir:ir-<n>` tag gpufarm writes on an allocated host. So the sync makes
**one more query**, whatever the number of hosts or leases:

    avg:gpu.sm_active{(<pool scope>) OR ...} by {host,ir,gpu_uuid}

over the ledger's window (`ledger.window_minutes`), every agent pool's scope OR-ed (its host tags, as the Agent
inventory source finds them: `environment:<pool>` unless `inventory.datadog_agent.scopes` names others). A device
whose average is at or above BUSY_PERCENT is busy: the threshold the idle monitors of those pools judge by
(gpufarm.setup.monitors reads the same constant), so a device the ledger calls busy is never one the monitors call
idle. Busy devices are counted per (`ir-<n>`, host), the keys gpufarm-node's series use; a device on a host with no
`ir` tag (Datadog groups it under `ir:N/A`) is unattributed (`none`). A host with any device in the answer is
measured (none busy: idle); one absent from it is unmeasured. A host gpufarm-node already measured keeps that
measurement (its per-device lease tag is exact).

On a shared host the `ir:` tags name every lease on it, so each device is counted for every one of them: the Agent
cannot say which lease a device serves (a sliced pool that needs exact attribution runs gpufarm-node, as its idle
monitors say too). A failed query measures nothing here: only these pools' hosts are unmeasured this sync, never
idle, and the node agent's measurement stands. The answer is bounded (MAX_GROUPS groups, MAX_GPUS per host).

The check reads activity, not the memory an idle process holds, so these pools cannot tell **idle-held** devices
from idle ones: their leases' idle-held GPU-hours stay 0 and all their idle hours count as idle (no process).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpufarm.core.config.farm import FarmConfig, MetricsSource
from gpufarm.core.config.inventory import DatadogAgentInventory
from gpufarm.core.inventory.agent_source import MAX_GPUS
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.ports import MetricsQuery, ScalarResult

log = logging.getLogger(__name__)

# The Agent GPU check's SM activity (percent), per device; at or above BUSY_PERCENT on average a device is busy, and
# the idle monitors of agent pools alert when it stays below it (`max(...) < BUSY_PERCENT`).
ACTIVITY_METRIC = "gpu.sm_active"
BUSY_PERCENT = 1.0
LEASE_KEY = "ir"  # the host tag gpufarm writes on allocation (`ir:ir-<n>`, gpufarm.core.kernel.ir)
HOST_KEY = "host"
DEVICE_KEY = "gpu_uuid"
NO_LEASE = "none"  # the lease value of unattributed devices, as gpufarm-node writes `gpu_ir:none`
# Device groups past this are cut (a farm of 20,000 hosts of 8 GPUs each, every one on the Agent, is 160,000).
MAX_GROUPS = 200_000
_LEASE_RE = re.compile(r"^ir-[1-9][0-9]{0,8}$", re.ASCII)
_MAX_NAME = 255


@dataclass(frozen=True)
class AgentPools:
    """The farm's `datadog-agent` pools, as the host tags that find each one's hosts."""

    scopes: tuple[tuple[str, ...], ...]

    def query(self) -> str:
        """The one query of a sync: SM activity per host, lease and device on every agent pool."""
        either = " OR ".join(f"({' AND '.join(scope)})" for scope in self.scopes)
        return f"avg:{ACTIVITY_METRIC}{{{either}}} by {{{HOST_KEY},{LEASE_KEY},{DEVICE_KEY}}}"


@dataclass(frozen=True)
class AgentBusy:
    """One answer: busy devices per (`ir-<n>` or `none`, host), and every host that reported."""

    busy: Mapping[tuple[str, str], float] = field(default_factory=dict)
    hosts: frozenset[str] = frozenset()


def for_farm(farm: FarmConfig) -> AgentPools | None:
    """The farm's agent pools, or None when every pool runs gpufarm-node (then no query is made)."""
    pools = sorted(n for n, e in farm.environments.items() if e.metrics_source is MetricsSource.DATADOG_AGENT)
    if not pools:
        return None
    settings = farm.inventory.datadog_agent or DatadogAgentInventory()
    return AgentPools(tuple(settings.scope(pool) for pool in pools))


def measure(
    query: MetricsQuery, pools: AgentPools, start: datetime, end: datetime, *, skip: Collection[str] = ()
) -> AgentBusy | None:
    """Busy devices of the agent pools over [start, end], or None when the query failed (nothing measured).

    `skip`: hosts already measured by gpufarm-node, whose devices are left to that measurement.
    """
    try:
        results = query.scalar(pools.query(), start, end)
    except GpufarmError as exc:
        log.warning("busy GPUs of the datadog-agent pools could not be measured (unmeasured this sync): %s", exc)
        return None
    return decode(results, skip=skip)


def decode(results: Sequence[ScalarResult], *, skip: Collection[str] = ()) -> AgentBusy:
    """The answer's busy devices per (lease, host) and the hosts in it; malformed groups (no percentage) dropped."""
    if len(results) > MAX_GROUPS:
        log.warning("datadog-agent busy GPU answer cut at %d groups of %d", MAX_GROUPS, len(results))
    busy: dict[tuple[str, str], float] = {}
    devices: dict[str, set[str]] = {}
    counted: set[tuple[str, str, str]] = set()
    for result in results[:MAX_GROUPS]:
        tags = dict(t.partition(":")[::2] for t in result.group_tags)
        host, device = tags.get(HOST_KEY, ""), tags.get(DEVICE_KEY, "")
        value = result.value
        if not _name(host) or not _name(device) or host in skip or value is None or not _percent(value):
            continue
        seen = devices.setdefault(host, set())
        if device not in seen and len(seen) >= MAX_GPUS:
            continue  # more devices than a host has: the rest is not a reading
        seen.add(device)
        lease = tags.get(LEASE_KEY, "")
        key = (lease if _LEASE_RE.match(lease) else NO_LEASE, host)
        if (*key, device) in counted:
            continue  # one device once per lease, however the answer repeats it
        counted.add((*key, device))
        busy[key] = busy.get(key, 0.0) + (1.0 if value >= BUSY_PERCENT else 0.0)
    return AgentBusy(busy, frozenset(devices))


def _percent(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 100.0


def _name(value: str) -> bool:
    return 0 < len(value) <= _MAX_NAME and value != "N/A"
