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

The gauges it publishes are declared in LEDGER_GAUGES (names, tags, units) for the dashboards to read. Each sync
also posts one Datadog event per source it skipped (`source_events`), grouped in the event stream by source.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpufarm.core.config.inventory import StaticHost
from gpufarm.core.kernel.errors import GpufarmError
from gpufarm.core.kernel.hosts import GpuHost, normalize_tag, tag_values
from gpufarm.core.kernel.ports import (
    CapacityReservation,
    CloudQuota,
    Event,
    EventSink,
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
        "gpufarm.inventory.gpus.unregistered",
        ("environment", "gpu_model"),
        "gpu",
        "GPUs the Datadog Agent's GPU check reports on hosts gpufarm has no registration for (never allocated)",
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
    # The measured ledger (gpufarm.core.accounting.gpu_hours) and the GPU-hour budgets
    # (gpufarm.core.accounting.budgets).
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
        "held GPUs seen busy over ledger.window_minutes (gpufarm.ir.gpus_busy; gpu.sm_active on datadog-agent pools)",
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
_SPECS = {g.name: g for g in LEDGER_GAUGES}


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
    registered = set(by_name)
    # Hosts that report for themselves (the Agent's GPU check) first, so a cloud instance that is one has an agent.
    for node in (n for r in readings for n in r.nodes if n.agent):
        if any(n.lower() in registered for n in node.names):
            continue  # gpufarm's registration of the same host counts it, and its host list entry says if it is down
        for name in node.names:
            by_name.setdefault(name.lower(), node)
        _merge_unregistered(ledger, node, _environment(node, environments), now, down_after_minutes)
    held: dict[tuple[str, str, str], float] = {}
    counted: set[str] = set()
    for reading in readings:
        ledger.calls[reading.source] = ledger.calls.get(reading.source, 0) + reading.calls
        ledger.errors += reading.errors
        ledger.reservations += reading.reservations
        for node in reading.nodes:
            if node.agent:
                continue  # merged above
            env = _environment(node, environments)
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

# A row of gauges: tag values by key, and the value of each gauge by name. A gauge's tags are those LEDGER_GAUGES
# declares for it, in that order, so the declaration is the one place a gauge's shape is said.
Row = tuple[Mapping[str, object], Mapping[str, float]]


def _pool_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for (env, model), count in sorted(ledger.pools.items()):
        yield (
            {"environment": env, "gpu_model": model},
            {
                "gpufarm.inventory.gpus.down": count.down,
                "gpufarm.inventory.gpus.no_agent": count.no_agent,
                "gpufarm.inventory.gpus.unregistered": count.unregistered,
            },
        )


def _cloud_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for (env, model, source), gpus in sorted(ledger.cloud_gpus.items()):
        yield {"environment": env, "gpu_model": model, "source": source}, {"gpufarm.inventory.gpus.cloud": gpus}


def _unknown_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    unknown: dict[tuple[str, str], int] = {}
    for node in ledger.unknown:
        unknown[(node.source, node.region)] = unknown.get((node.source, node.region), 0) + 1
    for (source, region), n in sorted(unknown.items()):
        yield {"source": source, "region": region or "none"}, {"gpufarm.inventory.nodes.unknown": n}


def _quota_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for q in sorted(ledger.quotas, key=lambda q: (q.source, q.region, q.family)):
        yield (
            {"source": q.source, "region": q.region, "family": q.family, "unit": q.unit},
            {
                "gpufarm.cloud.quota.limit": q.limit,
                "gpufarm.cloud.quota.used": q.used,
                "gpufarm.cloud.quota.held": q.held,
            },
        )


def _reservation_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    for r in sorted(ledger.reservations, key=lambda r: (r.source, r.region, r.id)):
        tags = {
            "source": r.source,
            "region": r.region,
            "instance_type": r.instance_type,
            "kind": r.kind,
            "gpu_model": r.gpu_model or "unknown",
        }
        yield tags, {"gpufarm.cloud.reservation.instances": r.total, "gpufarm.cloud.reservation.available": r.available}


def _source_rows(ledger: Ledger, sources: Iterable[str]) -> Iterable[Row]:
    # Every source named or read gets an error gauge, 0 when it answered: a source that recovers reads 0 again.
    errors: dict[str, int] = dict.fromkeys(sources, 0) | dict.fromkeys(ledger.calls, 0)
    for error in ledger.errors:
        errors[error.source] = errors.get(error.source, 0) + 1
    for source, n in sorted(errors.items()):
        values = {"gpufarm.inventory.source.errors": float(n)}
        if source in ledger.calls:
            values["gpufarm.inventory.source.calls"] = ledger.calls[source]
        yield {"source": source}, values


_ROWS: tuple[Callable[[Ledger, Iterable[str]], Iterable[Row]], ...] = (
    _pool_rows,
    _cloud_rows,
    _unknown_rows,
    _quota_rows,
    _reservation_rows,
    _source_rows,
)


def ledger_series(ledger: Ledger, timestamp: int, sources: Iterable[str] = ()) -> list[MetricSeries]:
    """The ledger as the gauges of LEDGER_GAUGES (sources named with no error still get a 0 error gauge)."""
    named = tuple(sources)
    series: list[MetricSeries] = []
    for rows in _ROWS:
        for tags, values in rows(ledger, named):
            for name, value in values.items():
                tag_list = tuple(normalize_tag(f"{key}:{tags[key]}") for key in _SPECS[name].tags)
                series.append(MetricSeries(name, (MetricPoint(timestamp, float(value)),), tag_list, type=3))
    return series


# -- source failures as Datadog events -------------------------------------------------------------------------

EVENT_SOURCE_TAG = "gpufarm:inventory"
MAX_EVENT_PARTS = 20
# An error's class as the sources write it: an exception or an API error code, with an HTTP status at most.
_CLASS_RE = re.compile(r"^[A-Z][A-Za-z0-9_.]{0,79}(?: [0-9]{3})?$")


def error_class(error: SourceError) -> str:
    """What kind of failure a source error was (`RequestLimitExceeded`, `HttpResponseError 429`, `Timeout`).

    Read from the message's leading parts (`<step>: <class>: <text>` or `<class>: <text>`), never its free text,
    which is the source's to write and is left out of events.
    """
    for part in error.message.split(": ")[:2]:
        if _CLASS_RE.match(part):
            return part
    return "Timeout" if error.message.startswith("no answer within") else "Error"


def source_events(ledger: Ledger, timestamp: int) -> list[Event]:
    """One event per source this sync skipped (a part of it or all): title, source, error classes, where.

    The parts are named (regions, subscriptions, pools) with their error class only; messages are not carried,
    so nothing a source's answer held (a URL, a request) reaches the event stream. Events of one source share an
    aggregation key, so a source failing sync after sync is one group in the stream.
    """
    by_source: dict[str, list[SourceError]] = {}
    for error in ledger.errors:
        by_source.setdefault(error.source, []).append(error)
    events: list[Event] = []
    for source, errors in sorted(by_source.items()):
        classes = sorted({error_class(e) for e in errors})
        throttled = all(e.throttled for e in errors)
        lines = [
            f"- {e.where}: {error_class(e)}{' (throttled)' if e.throttled else ''}" for e in errors[:MAX_EVENT_PARTS]
        ]
        if len(errors) > MAX_EVENT_PARTS:
            lines.append(f"- and {len(errors) - MAX_EVENT_PARTS} more")
        text = (
            f"The inventory sync could not read {len(errors)} part(s) of source {source} and skipped them: their "
            "nodes and quotas were not counted this sync, and nothing was marked down or untagged because of it.\n"
            + "\n".join(lines)
        )
        tags = (
            EVENT_SOURCE_TAG,
            normalize_tag(f"source:{source}"),
            *(normalize_tag(f"error_class:{c}") for c in classes[:5]),
        )
        events.append(
            Event(
                title=f"gpufarm inventory source {source} skipped: {', '.join(classes[:3])}"[:200],
                text=text[:4000],
                tags=tags,
                aggregation_key=f"gpufarm-inventory-source-{source}"[:100],
                alert_type="warning" if throttled else "error",
                date_happened=timestamp,
            )
        )
    return events


def post_source_events(sink: EventSink | None, ledger: Ledger, timestamp: int) -> int:
    """Post source_events through the sink; returns how many were posted. A failed post is logged, never raised:
    the sync's report, gauges and logs still say what was skipped."""
    if sink is None:
        return 0
    posted = 0
    for event in source_events(ledger, timestamp):
        try:
            sink.post_event(event)
            posted += 1
        except GpufarmError as exc:
            log.warning("inventory source event not posted (%s): %s", event.title, exc)
    return posted


def _short(exc: BaseException) -> str:
    """An error's type and first line, bounded (never a whole response body)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]
