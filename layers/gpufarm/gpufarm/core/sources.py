"""The inventory ledger: every source's nodes and quotas merged into what exists per environment, model and region.

gpufarm-node's registrations (the managed hosts of Datadog's host list) are what allocation places on; the other
sources (gpufarm.core.ports.InventorySource: AWS, Azure, the farm file's static list) say what exists besides.
The merge is pure and decides:

- a node a cloud or static source sees that no registered host answers to (by instance id, DNS or computer
  name, or the host's `instance-id:` tag) is **no agent**: counted per environment and model, listed with its id;
- a registered host silent for longer than `inventory.down_after_minutes` is **down**: counted, and left out of
  allocation (`down_hosts`). Only the host list's own report time decides that, never a source's silence: a
  source that fails or throttles is skipped and reported, and nothing is marked down or untagged because of it;
- a node whose source could not say its GPU model (an unknown instance type, an answer without GPU information)
  is **unknown**: listed, never counted as a GPU of some other model;
- per cloud region and quota family: the quota's limit, what is in use, and what gpufarm holds (the vCPUs or
  cores of the registered instances that carry a lease).

The gauges it publishes are declared in LEDGER_GAUGES (names, tags, units) for the dashboards to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpufarm.core.inventory import GpuHost, normalize_tag, tag_values
from gpufarm.core.inventory_config import StaticHost
from gpufarm.core.ports import (
    CapacityReservation,
    CloudQuota,
    HostInfo,
    InventorySource,
    MetricPoint,
    MetricSeries,
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


@dataclass(frozen=True)
class GaugeSpec:
    """A gauge the sync publishes: its name, the tags it carries, its unit and what it means."""

    name: str
    tags: tuple[str, ...]
    unit: str
    description: str


LEDGER_GAUGES = (
    GaugeSpec(
        "gpufarm.inventory.gpus.down",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs of registered nodes silent past inventory.down_after_minutes (excluded from allocation)",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.no_agent",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs of nodes a cloud or static source lists that no registered host answers to",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.cloud",
        ("environment", "gpu_model", "source"),
        "gpu",
        "GPUs of the nodes each cloud or static source lists, with or without an agent",
    ),
    GaugeSpec(
        "gpufarm.inventory.nodes.unknown",
        ("source", "region"),
        "host",
        "nodes whose GPU model the source could not say (unknown instance type or no GPU information)",
    ),
    GaugeSpec(
        "gpufarm.cloud.quota.limit",
        ("source", "region", "family", "unit"),
        "cpu",
        "a cloud region's quota for a family of GPU instances (EC2 vCPUs, Azure cores)",
    ),
    GaugeSpec(
        "gpufarm.cloud.quota.used",
        ("source", "region", "family", "unit"),
        "cpu",
        "what is in use against that quota (EC2: the vCPUs of the instances found; Azure: the usage API)",
    ),
    GaugeSpec(
        "gpufarm.cloud.quota.held",
        ("source", "region", "family", "unit"),
        "cpu",
        "the part of that quota held by gpufarm leases (instances whose registered host carries an ir: tag)",
    ),
    GaugeSpec(
        "gpufarm.cloud.reservation.instances",
        ("source", "region", "instance_type", "kind", "gpu_model"),
        "instance",
        "instances reserved (EC2 capacity reservations and capacity blocks)",
    ),
    GaugeSpec(
        "gpufarm.cloud.reservation.available",
        ("source", "region", "instance_type", "kind", "gpu_model"),
        "instance",
        "reserved instances not running yet",
    ),
    GaugeSpec(
        "gpufarm.inventory.source.errors",
        ("source",),
        "error",
        "parts of a source (regions, subscriptions) that failed or throttled in the last sync and were skipped",
    ),
    GaugeSpec(
        "gpufarm.inventory.source.calls",
        ("source",),
        "request",
        "API calls a source made in the last sync",
    ),
    # The measured ledger (gpufarm.core.accounting) and the GPU-hour budgets (gpufarm.core.budgets).
    GaugeSpec(
        "gpufarm.ledger.gpus.allocated",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "GPUs held by live leases (whole hosts on dedicated pools, units on shared ones)",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.used",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "held GPUs the agents saw busy (gpufarm.ir.gpus_busy, averaged over ledger.window_minutes)",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.idle",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "held GPUs the agents saw not busy",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.unmeasured",
        ("team", "project", "environment", "gpu_model"),
        "gpu",
        "held GPUs no metrics measured (agent silent or the query failed): never counted idle",
    ),
    GaugeSpec(
        "gpufarm.inventory.gpus.allocated",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs held by live leases per environment and model",
    ),
    GaugeSpec(
        "gpufarm.ledger.gpus.unattributed",
        ("host", "team", "environment"),
        "gpu",
        "busy GPUs no lease claims (gpu_ir:none), per host and the team its tags name (none without one)",
    ),
    GaugeSpec(
        "gpufarm.ledger.measured",
        (),
        "",
        "1 when the sync's busy-GPU query answered, 0 when every held GPU counts as unmeasured",
    ),
    GaugeSpec(
        "gpufarm.budget.gpu_hours",
        ("team", "project", "period"),
        "hour",
        "a GPU-hour budget for its current period (project:all for a team's own budget)",
    ),
    GaugeSpec(
        "gpufarm.budget.burned",
        ("team", "project", "period"),
        "hour",
        "GPU-hours the budget's leases held in the current period",
    ),
    GaugeSpec(
        "gpufarm.budget.remaining",
        ("team", "project", "period"),
        "hour",
        "GPU-hours left in the budget's current period",
    ),
)
GAUGE_NAMES = frozenset(g.name for g in LEDGER_GAUGES)


@dataclass
class PoolCount:
    """GPUs of one environment and model: registered, down, and seen without an agent."""

    total: int = 0
    down: int = 0
    no_agent: int = 0


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
    by_name: dict[str, SeenNode] = {}
    for node in agents:
        for name in node.names:
            by_name.setdefault(name.lower(), node)
        pool = ledger.pools.setdefault((node.environment or UNASSIGNED, node.gpu_model or "UNKNOWN"), PoolCount())
        pool.total += node.gpu_count
        if is_down(node.last_reported, now, down_after_minutes):
            pool.down += node.gpu_count
            ledger.down.append(node.id)
    held: dict[tuple[str, str, str], float] = {}
    counted: set[str] = set()
    for reading in readings:
        ledger.calls[reading.source] = ledger.calls.get(reading.source, 0) + reading.calls
        ledger.errors += reading.errors
        ledger.reservations += reading.reservations
        for node in reading.nodes:
            env = (
                node.environment
                if node.environment and (environments is None or node.environment in environments)
                else UNASSIGNED
            )
            if node.gpu_model is None:
                ledger.unknown.append(node)
            else:
                key = (env, node.gpu_model, node.source)
                ledger.cloud_gpus[key] = ledger.cloud_gpus.get(key, 0) + node.gpu_count
            match = next((by_name[n.lower()] for n in node.names if n.lower() in by_name), None)
            if match is not None:
                if match.irs and node.family:
                    quota_key = (node.source, node.region, node.family)
                    held[quota_key] = held.get(quota_key, 0.0) + node.vcpus
                continue
            names = {n.lower() for n in node.names} or {node.id.lower()}
            if names & counted:
                continue  # the same host listed by two sources (a static entry for a cloud instance)
            counted |= names
            ledger.no_agent.append(node)
            if node.gpu_model is not None:
                ledger.pools.setdefault((env, node.gpu_model), PoolCount()).no_agent += node.gpu_count
        for quota in reading.quotas:
            ledger.quotas.append(_quota_line(quota, held))
    ledger.no_agent.sort(key=lambda n: (n.source, n.region, n.id))
    ledger.unknown.sort(key=lambda n: (n.source, n.region, n.id))
    ledger.down.sort()
    return ledger


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


def ledger_series(ledger: Ledger, timestamp: int, sources: Iterable[str] = ()) -> list[MetricSeries]:
    """The ledger as the gauges of LEDGER_GAUGES (sources named with no error still get a 0 error gauge)."""
    series: list[MetricSeries] = []

    def gauge(name: str, value: float, **tags: object) -> None:
        tag_list = tuple(normalize_tag(f"{k}:{v}") for k, v in tags.items())
        series.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tag_list, type=3))

    for (env, model), count in sorted(ledger.pools.items()):
        gauge("gpufarm.inventory.gpus.down", count.down, environment=env, gpu_model=model)
        gauge("gpufarm.inventory.gpus.no_agent", count.no_agent, environment=env, gpu_model=model)
    for (env, model, source), gpus in sorted(ledger.cloud_gpus.items()):
        gauge("gpufarm.inventory.gpus.cloud", gpus, environment=env, gpu_model=model, source=source)
    unknown: dict[tuple[str, str], int] = {}
    for node in ledger.unknown:
        unknown[(node.source, node.region)] = unknown.get((node.source, node.region), 0) + 1
    for (source, region), n in sorted(unknown.items()):
        gauge("gpufarm.inventory.nodes.unknown", n, source=source, region=region or "none")
    for q in sorted(ledger.quotas, key=lambda q: (q.source, q.region, q.family)):
        tags = {"source": q.source, "region": q.region, "family": q.family, "unit": q.unit}
        gauge("gpufarm.cloud.quota.limit", q.limit, **tags)
        gauge("gpufarm.cloud.quota.used", q.used, **tags)
        gauge("gpufarm.cloud.quota.held", q.held, **tags)
    for r in sorted(ledger.reservations, key=lambda r: (r.source, r.region, r.id)):
        tags = {
            "source": r.source,
            "region": r.region,
            "instance_type": r.instance_type,
            "kind": r.kind,
            "gpu_model": r.gpu_model or "unknown",
        }
        gauge("gpufarm.cloud.reservation.instances", r.total, **tags)
        gauge("gpufarm.cloud.reservation.available", r.available, **tags)
    errors: dict[str, int] = dict.fromkeys(sources, 0) | dict.fromkeys(ledger.calls, 0)
    for error in ledger.errors:
        errors[error.source] = errors.get(error.source, 0) + 1
    for source, n in sorted(errors.items()):
        gauge("gpufarm.inventory.source.errors", n, source=source)
    for source, calls in sorted(ledger.calls.items()):
        gauge("gpufarm.inventory.source.calls", calls, source=source)
    return series


def _short(exc: BaseException) -> str:
    """An error's type and first line, bounded (never a whole response body)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]
