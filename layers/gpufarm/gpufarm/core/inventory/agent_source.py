"""The Datadog Agent's GPU check as an inventory source: the hosts it reports, on pools whose `metrics_source` is
`datadog-agent`, whether or not they carry gpufarm's tags.

The check sends `gpu.device.total` (1 per device) for every GPU, tagged with the device tagset (`gpu_uuid`,
`gpu_device`, ...) and the host it runs on; it knows nothing of gpufarm. So a host is read from its series:

- **one query per pool**, `sum:gpu.device.total{<pool scope>} by {host,gpu_device}` over
  `inventory.datadog_agent.lookback_minutes`, reduced by max: per host and device name, how many GPUs it has. The
  scope is the pool's host tags (`environment:<pool>` unless the farm file names others);
- **one query per sync** over `inventory.down_after_minutes` (only with that policy), every pool's scope OR-ed,
  `by {host}`: which of those hosts still report. A host seen in the lookback but not in that window is silent
  and so down, by the same rule as a registered host (gpufarm.core.inventory.sources). When that query fails, nothing is
  marked silent: a missing answer never makes a host down.

The model is read from the device name (`nvidia_h100_80gb_hbm3` names the farm's H100: one of the name's `_`
parts, or a run of them, is the model) or from `inventory.datadog_agent.device_models`; a device that names no
model of the farm, or two, is unknown and never counted as another model. Calls stay the pools' count plus one,
whatever the number of hosts; answers are bounded (groups, GPUs per host, names).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from gpufarm.core.config.farm import FarmConfig, MetricsSource
from gpufarm.core.config.inventory import DatadogAgentInventory
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.ports import Clock, MetricsQuery, ScalarResult, SeenNode, SourceError, SourceReading

log = logging.getLogger(__name__)

SOURCE = "datadog-agent"
DEVICE_METRIC = "gpu.device.total"
DEVICE_KEY = "gpu_device"
HOST_KEY = "host"
# One pool's answer is cut past this many (host, device) groups; a GPU count beyond MAX_GPUS is not a reading.
MAX_GROUPS = 100_000
MAX_GPUS = 64
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$")
_DEVICE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


def pool_query(scope: Sequence[str]) -> str:
    """The query that reads one pool's hosts: GPUs per host and device name."""
    return f"sum:{DEVICE_METRIC}{{{' AND '.join(scope)}}} by {{{HOST_KEY},{DEVICE_KEY}}}"


def recent_query(scopes: Iterable[Sequence[str]]) -> str:
    """The query that says which hosts of every agent pool still report."""
    either = " OR ".join(f"({' AND '.join(scope)})" for scope in scopes)
    return f"max:{DEVICE_METRIC}{{{either}}} by {{{HOST_KEY}}}"


def device_model(device: str, models: Collection[str], overrides: Mapping[str, str]) -> str | None:
    """The farm model a `gpu_device` value names, or None when it names none of them, or more than one."""
    if device in overrides:
        return overrides[device]
    parts = f"_{_SEPARATORS.sub('_', device.lower())}_"
    named = {m for m in models if f"_{_SEPARATORS.sub('_', m.lower()).strip('_')}_" in parts}
    return next(iter(named)) if len(named) == 1 else None


class AgentCheckSource:
    """Hosts the Datadog Agent's GPU check reports on the farm's `datadog-agent` pools (see the module docstring)."""

    name = SOURCE

    def __init__(
        self,
        settings: DatadogAgentInventory,
        pools: Sequence[str],
        models: Collection[str],
        query: MetricsQuery,
        clock: Clock,
        *,
        down_after_minutes: int | None,
    ) -> None:
        self.settings = settings
        self.pools = tuple(sorted(pools))
        self.models = frozenset(models)
        self.query = query
        self.clock = clock
        self.down_after_minutes = down_after_minutes

    def read(self) -> SourceReading:
        """Every pool's hosts (one query each) and, with a down policy, which of them still report (one more)."""
        now = self.clock.now()
        nodes: list[SeenNode] = []
        errors: list[SourceError] = []
        calls = 0
        for pool in self.pools:
            calls += 1
            answer = self._scalar(pool_query(self.settings.scope(pool)), now, self.settings.lookback_minutes)
            if isinstance(answer, SourceError):
                errors.append(SourceError(SOURCE, pool, answer.message, throttled=answer.throttled))
                continue
            nodes += self._pool_nodes(pool, answer)
        if nodes and self.down_after_minutes is not None:
            calls += 1
            scopes = [self.settings.scope(p) for p in self.pools]
            answer = self._scalar(recent_query(scopes), now, self.down_after_minutes)
            if isinstance(answer, SourceError):
                errors.append(answer)  # nobody is marked silent on a missing answer
            else:
                recent = {values[0] for values, _ in _groups(answer, (HOST_KEY,))}
                nodes = [n if n.names[0] in recent else replace(n, silent=True) for n in nodes]
        return SourceReading(SOURCE, nodes=tuple(nodes), errors=tuple(errors), calls=calls)

    def _scalar(self, text: str, now: datetime, minutes: int) -> list[ScalarResult] | SourceError:
        try:
            return self.query.scalar(text, now - timedelta(minutes=minutes), now, aggregator="max")
        except GpufarmError as exc:
            message = f"query: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            log.warning("datadog-agent inventory query skipped: %s", message)
            return SourceError(SOURCE, "*", message, throttled="429" in message or "rate limit" in message.lower())

    def _pool_nodes(self, pool: str, results: Sequence[ScalarResult]) -> list[SeenNode]:
        gpus: dict[str, dict[str, int]] = {}
        for (host, device), value in _groups(results, (HOST_KEY, DEVICE_KEY)):
            if not _DEVICE_RE.match(device) or value <= 0 or value > MAX_GPUS:
                continue
            per_host = gpus.setdefault(host, {})
            per_host[device] = min(MAX_GPUS, per_host.get(device, 0) + round(value))
        nodes: list[SeenNode] = []
        for host, devices in sorted(gpus.items()):
            # A host with two device names is two nodes under one name: the merge counts both, matches both.
            for i, (device, count) in enumerate(sorted(devices.items())):
                nodes.append(
                    SeenNode(
                        source=SOURCE,
                        id=host if i == 0 else f"{host}/{device}",
                        names=(host,),
                        instance_type=device,
                        gpu_model=device_model(device, self.models, self.settings.device_models),
                        gpu_count=count,
                        environment=pool,
                        agent=True,
                    )
                )
        return nodes


def _groups(results: Sequence[ScalarResult], keys: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], float]]:
    """(values of `keys`, value) of each well-formed group, at most MAX_GROUPS of them."""
    if len(results) > MAX_GROUPS:
        log.warning("datadog-agent inventory answer cut at %d groups of %d", MAX_GROUPS, len(results))
    for result in results[:MAX_GROUPS]:
        tags = dict(t.partition(":")[::2] for t in result.group_tags)
        values = tuple(tags.get(k, "") for k in keys)
        if result.value is None or not math.isfinite(result.value) or not _HOST_RE.match(values[0]):
            continue
        yield values, result.value


def for_farm(farm: FarmConfig, query: MetricsQuery | None, clock: Clock) -> AgentCheckSource | None:
    """The source the farm file's `inventory.datadog_agent` enables on its `datadog-agent` pools, or None."""
    settings = farm.inventory.datadog_agent
    if settings is None or not settings.enabled or query is None:
        return None
    pools = [n for n, e in farm.environments.items() if e.metrics_source is MetricsSource.DATADOG_AGENT]
    if not pools:
        return None
    return AgentCheckSource(
        settings, pools, farm.gpu_models, query, clock, down_after_minutes=farm.inventory.down_after_minutes
    )
