"""The inventory ledger: every source's nodes and quotas merged into what exists per environment, model and region.

gpufarm-node's registrations (the managed hosts of Datadog's host list) are what allocation places on; the other
sources (gpufarm.core.kernel.ports.InventorySource: AWS, Azure, the farm file's static list, the Datadog Agent's GPU
check in gpufarm.core.inventory.agent_source) say what exists besides. The merge is pure and decides:

- a node a cloud or static source sees that no registered host answers to (by instance id, DNS or computer
  name, or the host's `instance-id:` tag) is **no agent**: counted per environment and model, listed with its id;
- a registered host silent for longer than `inventory.down_after_minutes` is **down**: counted, and left out of
  allocation (`down_hosts`). Only the host list's own report time decides that, never a source's silence: a
  source that fails or throttles is skipped and reported, and nothing is marked down or untagged because of it;
- a host the Datadog Agent's GPU check reports that gpufarm has no registration for is still inventory
  (**unregistered**: counted per environment and model, never allocated), has an agent (a cloud instance that is
  that host is not "no agent"), and is down when its check fell silent for as long (the source's own answer says
  so; a registered host's silence is still the host list's to say);
- a node whose source could not say its GPU model (an unknown instance type, an answer without GPU information)
  is **unknown**: listed, never counted as a GPU of some other model;
- per cloud region and quota family: the quota's limit, what is in use, and what gpufarm holds (the vCPUs or
  cores of the registered instances that carry a lease).

The gauges it publishes are declared in gpufarm.core.inventory.ledger_gauges.LEDGER_GAUGES (names, tags, units) for
the dashboards to read. Each sync also posts one Datadog event per source it skipped
(gpufarm.core.inventory.source_events), grouped in the event stream by source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpufarm.core.config.inventory import StaticHost
from gpufarm.core.kernel.hosts import GpuHost, tag_values
from gpufarm.core.kernel.ports import (
    CapacityReservation,
    CloudQuota,
    HostInfo,
    InventorySource,
    SeenNode,
    SourceError,
    SourceReading,
)

log = logging.getLogger(__name__)

AGENT_SOURCE = "gpufarm-node"
STATIC_SOURCE = "static"
# The environment of a node no tag or default places.
UNASSIGNED = "unassigned"
# The host tag Datadog's cloud integrations put on a host, naming its instance.
INSTANCE_ID_KEY = "instance-id"
# A report longer than this is cut (the sync report is logged and returned by the function).
MAX_LISTED = 200
# How long the sync waits for a source read in the background, from the start of the read: a cloud that has not
# answered by then is one error of that sync, so a hung API never runs the sync into its timeout (template.yaml).
SOURCE_WAIT_S = 45.0


@dataclass
class PoolCount:
    """GPUs of one environment and model: registered, down, seen without an agent, and reported by the Datadog
    Agent's GPU check on hosts gpufarm has no registration for."""

    total: int = 0
    down: int = 0
    no_agent: int = 0
    unregistered: int = 0


@dataclass(frozen=True)
class QuotaLine:
    """One cloud quota with what gpufarm holds of it."""

    source: str
    region: str
    family: str
    unit: str
    limit: float
    used: float
    held: float


@dataclass
class Ledger:
    """What the sources say exists, merged (see the module docstring)."""

    pools: dict[tuple[str, str], PoolCount] = field(default_factory=dict)
    cloud_gpus: dict[tuple[str, str, str], int] = field(default_factory=dict)
    quotas: list[QuotaLine] = field(default_factory=list)
    reservations: list[CapacityReservation] = field(default_factory=list)
    no_agent: list[SeenNode] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    unknown: list[SeenNode] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """The sync report's inventory part: lists cut at MAX_LISTED, with the full counts."""
        return {
            "no_agent": [_describe(n) for n in self.no_agent[:MAX_LISTED]],
            "no_agent_count": len(self.no_agent),
            "down": self.down[:MAX_LISTED],
            "down_count": len(self.down),
            "unknown": [_describe(n) for n in self.unknown[:MAX_LISTED]],
            "source_errors": [f"{e.source} {e.where}: {e.message}" for e in self.errors[:MAX_LISTED]],
            "source_calls": dict(sorted(self.calls.items())),
        }


def _describe(node: SeenNode) -> str:
    parts = [node.source, node.region, node.id] if node.region else [node.source, node.id]
    kind = node.instance_type or "static"
    model = f"{node.gpu_count}x{node.gpu_model}" if node.gpu_model else "unknown GPU"
    return f"{':'.join(parts)} ({kind}, {model}, {node.environment or UNASSIGNED})"


# -- what the registered hosts are -----------------------------------------------------------------------------


def agent_node(host: GpuHost, info: HostInfo | None) -> SeenNode:
    """A registered host (gpufarm-node) as a node of the ledger."""
    names = (host.name, *tag_values(host.tags, INSTANCE_ID_KEY))
    return SeenNode(
        source=AGENT_SOURCE,
        id=host.name,
        names=names,
        gpu_model=host.gpu_model,
        gpu_count=host.gpu_count,
        environment=host.environment,
        cluster=host.cluster,
        agent=True,
        last_reported=info.last_reported if info is not None else None,
        irs=tuple(host.irs),
    )


def is_down(last_reported: float | None, now: float, down_after_minutes: int | None) -> bool:
    """True when a registered host has been silent longer than the policy allows (never without a policy)."""
    if down_after_minutes is None or last_reported is None:
        return False
    return now - last_reported > down_after_minutes * 60


def down_hosts(infos: Iterable[HostInfo], now: float, down_after_minutes: int | None) -> set[str]:
    """Names of the listed hosts that are down (allocation leaves them out)."""
    if down_after_minutes is None:
        return set()
    return {i.name for i in infos if is_down(i.last_reported, now, down_after_minutes)}


# -- the static list -------------------------------------------------------------------------------------------


class StaticSource:
    """The farm file's `inventory.static` hosts: nodes known by hand, with no agent yet."""

    name = STATIC_SOURCE

    def __init__(self, hosts: Sequence[StaticHost]) -> None:
        self.hosts = tuple(hosts)

    def read(self) -> SourceReading:
        """Every listed host as a node (no call made)."""
        nodes = tuple(
            SeenNode(
                source=STATIC_SOURCE,
                id=h.name,
                names=(h.name,),
                gpu_model=h.gpu_model,
                gpu_count=h.gpu_count,
                environment=h.environment,
                cluster=h.cluster,
            )
            for h in self.hosts
        )
        return SourceReading(STATIC_SOURCE, nodes=nodes)


# -- reading and merging ---------------------------------------------------------------------------------------


def read_all(sources: Sequence[InventorySource]) -> list[SourceReading]:
    """Each source's reading; a source that raises anyway is one error of its own, and the others still read."""
    readings = []
    for source in sources:
        started = time.perf_counter()
        try:
            reading = source.read()
        except Exception as exc:  # one broken source must not stop the sync
            log.exception("inventory source %s failed", source.name)
            reading = SourceReading(source.name, errors=(SourceError(source.name, "*", _short(exc)),))
        log.info(
            "inventory source %s: %d nodes, %d quotas, %d errors, %d calls in %.2f s",
            source.name,
            len(reading.nodes),
            len(reading.quotas),
            len(reading.errors),
            reading.calls,
            time.perf_counter() - started,
        )
        for error in reading.errors:
            log.warning("inventory source %s skipped %s: %s", error.source, error.where, error.message)
        readings.append(reading)
    return readings


def read_in_background(
    sources: Sequence[InventorySource], wait_s: float = SOURCE_WAIT_S
) -> Callable[[], list[SourceReading]]:
    """Start reading every source, each on its own thread; the result waits for them (read_all's readings).

    The sync reads Datadog meanwhile: a cloud's answers take as long as the cloud takes, and need not add to it,
    up to `wait_s` from now: a source still reading then is an error of its own and its nodes are not counted
    (nothing is marked down or missing for it), as when it fails.
    """
    if not sources:
        return list
    deadline = time.monotonic() + wait_s
    pool = ThreadPoolExecutor(max_workers=len(sources), thread_name_prefix="inventory-source")
    futures = [(source.name, pool.submit(read_all, [source])) for source in sources]
    pool.shutdown(wait=False)

    def result() -> list[SourceReading]:
        readings: list[SourceReading] = []
        for name, future in futures:
            try:
                readings += future.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:  # concurrent.futures' own since Python 3.11
                log.warning("inventory source %s skipped: no answer within %.0f s", name, wait_s)
                late = SourceError(name, "*", f"no answer within {wait_s:.0f} s")
                readings.append(SourceReading(name, errors=(late,)))
        return readings

    return result


def merge(
    agents: Sequence[SeenNode],
    readings: Sequence[SourceReading],
    *,
    now: float,
    down_after_minutes: int | None,
    environments: Mapping[str, object] | None = None,
) -> Ledger:
    """Registered hosts and every source's reading as one ledger (see the module docstring)."""
    ledger = Ledger()
    by_name = _merge_registered(ledger, agents, now, down_after_minutes)
    # Hosts that report for themselves (the Agent's GPU check) first, so a cloud instance that is one has an agent.
    _merge_self_reporting(ledger, readings, by_name, environments, now=now, down_after_minutes=down_after_minutes)
    # Both carry across readings: a quota counts what gpufarm holds in the readings merged so far, and a host two
    # sources list is one host without an agent.
    held: dict[tuple[str, str, str], float] = {}
    counted: set[str] = set()
    for reading in readings:
        ledger.calls[reading.source] = ledger.calls.get(reading.source, 0) + reading.calls
        ledger.errors += reading.errors
        ledger.reservations += reading.reservations
        for node in reading.nodes:
            if not node.agent:  # self-reporting hosts were merged above
                _merge_seen(ledger, node, _environment(node, environments), by_name, held=held, counted=counted)
        for quota in reading.quotas:
            ledger.quotas.append(_quota_line(quota, held))
    ledger.no_agent.sort(key=lambda n: (n.source, n.region, n.id))
    ledger.unknown.sort(key=lambda n: (n.source, n.region, n.id))
    ledger.down.sort()
    return ledger


def _merge_registered(
    ledger: Ledger, agents: Sequence[SeenNode], now: float, down_after_minutes: int | None
) -> dict[str, SeenNode]:
    """Count the registered hosts into the ledger (down when silent); every name they answer to."""
    by_name: dict[str, SeenNode] = {}
    for node in agents:
        for name in node.names:
            by_name.setdefault(name.lower(), node)
        pool = ledger.pools.setdefault((node.environment or UNASSIGNED, node.gpu_model or "UNKNOWN"), PoolCount())
        pool.total += node.gpu_count
        if is_down(node.last_reported, now, down_after_minutes):
            pool.down += node.gpu_count
            ledger.down.append(node.id)
    return by_name


def _merge_self_reporting(
    ledger: Ledger,
    readings: Sequence[SourceReading],
    by_name: dict[str, SeenNode],
    environments: Mapping[str, object] | None,
    *,
    now: float,
    down_after_minutes: int | None,
) -> None:
    """Count the self-reporting hosts no registration covers, and add the names they answer to into `by_name`."""
    registered = set(by_name)
    for node in (n for r in readings for n in r.nodes if n.agent):
        if any(n.lower() in registered for n in node.names):
            continue  # gpufarm's registration of the same host counts it, and its host list entry says if it is down
        for name in node.names:
            by_name.setdefault(name.lower(), node)
        _merge_unregistered(ledger, node, _environment(node, environments), now, down_after_minutes)


def _merge_seen(
    ledger: Ledger,
    node: SeenNode,
    env: str,
    by_name: Mapping[str, SeenNode],
    *,
    held: dict[tuple[str, str, str], float],
    counted: set[str],
) -> None:
    """Count a node a cloud or static source sees: its GPUs per source, and what gpufarm holds or lacks an agent.

    A node a host with an agent answers to adds its vCPUs to `held` when that host carries a lease; any other is
    no agent.
    """
    if node.gpu_model is None:
        ledger.unknown.append(node)
    else:
        key = (env, node.gpu_model, node.source)
        ledger.cloud_gpus[key] = ledger.cloud_gpus.get(key, 0) + node.gpu_count
    match = next((by_name[n.lower()] for n in node.names if n.lower() in by_name), None)
    if match is None:
        _merge_no_agent(ledger, node, env, counted)
    elif match.irs and node.family:
        quota_key = (node.source, node.region, node.family)
        held[quota_key] = held.get(quota_key, 0.0) + node.vcpus


def _merge_no_agent(ledger: Ledger, node: SeenNode, env: str, counted: set[str]) -> None:
    """Count a node no host with an agent answers to, once across sources (`counted` holds the names seen)."""
    names = {n.lower() for n in node.names} or {node.id.lower()}
    if names & counted:
        return  # the same host listed by two sources (a static entry for a cloud instance)
    counted.update(names)
    ledger.no_agent.append(node)
    if node.gpu_model is not None:
        ledger.pools.setdefault((env, node.gpu_model), PoolCount()).no_agent += node.gpu_count


def _merge_unregistered(ledger: Ledger, node: SeenNode, env: str, now: float, down_after_minutes: int | None) -> None:
    """Count a self-reporting host gpufarm has no registration for: inventory, down when its reports stopped."""
    if node.gpu_model is None:
        ledger.unknown.append(node)
        return
    pool = ledger.pools.setdefault((env, node.gpu_model), PoolCount())
    pool.unregistered += node.gpu_count
    if node.silent or is_down(node.last_reported, now, down_after_minutes):
        pool.down += node.gpu_count
        ledger.down.append(node.id)


def _environment(node: SeenNode, environments: Mapping[str, object] | None) -> str:
    """The node's environment when the farm has it, else UNASSIGNED."""
    if node.environment and (environments is None or node.environment in environments):
        return node.environment
    return UNASSIGNED


def _quota_line(quota: CloudQuota, held: Mapping[tuple[str, str, str], float]) -> QuotaLine:
    return QuotaLine(
        quota.source,
        quota.region,
        quota.family,
        quota.unit,
        quota.limit,
        quota.used,
        held.get((quota.source, quota.region, quota.family), 0.0),
    )


# -- gauges ----------------------------------------------------------------------------------------------------


# -- source failures as Datadog events -------------------------------------------------------------------------


def _short(exc: BaseException) -> str:
    """An error's type and first line, bounded (never a whole response body)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]
