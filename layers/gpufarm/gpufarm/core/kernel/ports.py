"""Ports: the small interfaces the core needs; adapters implement them per technology."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.search import IncidentQuery

if TYPE_CHECKING:
    # Annotations only: a path that reads leases as LeaseFacts (the report) loads no incident model.
    from gpufarm.core.kernel.model import IncidentRecord


@dataclass(frozen=True)
class HostInfo:
    """A host as Datadog lists it: its name and every tag it carries, all sources merged."""

    name: str
    tags: tuple[str, ...] = ()
    tags_by_source: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    last_reported: float | None = None


@dataclass(frozen=True)
class MetricPoint:
    """One timestamped value (epoch seconds)."""

    timestamp: int
    value: float


@dataclass(frozen=True)
class MetricSeries:
    """A series to submit: Datadog v2 shape, type 0 unspecified, 1 count, 2 rate, 3 gauge."""

    metric: str
    points: tuple[MetricPoint, ...]
    tags: tuple[str, ...] = ()
    host: str | None = None
    type: int = 3
    unit: str | None = None
    interval: int | None = None


@dataclass(frozen=True)
class ScalarResult:
    """One group of a scalar query: its group tags and the reduced value (None when no data)."""

    group_tags: tuple[str, ...]
    value: float | None


@dataclass(frozen=True)
class TimeseriesResult:
    """One group of a timeseries query: its group tags and its points (a bucket without data is left out)."""

    group_tags: tuple[str, ...]
    points: tuple[MetricPoint, ...]


class IncidentStore(Protocol):
    """Incidents are the allocations; this is the only place their state is kept."""

    def create(
        self,
        title: str,
        fields: Mapping[str, object],
        *,
        notification_handles: Sequence[str] = (),
        initial_note: str | None = None,
    ) -> IncidentRecord:
        """Create an incident with gpufarm fields (plain values, encoded by the adapter)."""

    def get(self, incident_id: str) -> IncidentRecord:
        """Fetch by UUID; raises NotFound."""

    def get_by_ir(self, ir: int) -> IncidentRecord:
        """Fetch by incident number (public_id); raises NotFound."""

    def update(self, incident_id: str, fields: Mapping[str, object], *, title: str | None = None) -> IncidentRecord:
        """Write some fields (plain values); others are left as they are."""

    def search(self, query: IncidentQuery) -> Iterator[IncidentRecord]:
        """gpufarm's incidents the query matches, every page (gpufarm.core.kernel.search)."""

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        """The incident created for a Slack request, so a retried create never makes a second one."""


@runtime_checkable
class LeaseReads(Protocol):
    """Leases as reports read them: the light record of each of gpufarm's incidents a query matches, decoded
    without a model per incident (gpufarm.core.kernel.lease_facts)."""

    def lease_facts(self, query: IncidentQuery) -> Iterator[LeaseFacts]:
        """gpufarm's incidents the query matches, every page, as LeaseFacts; a malformed one is skipped."""


class HostTags(Protocol):
    """Hosts and their tags (Datadog v1 hosts and tags APIs)."""

    def list_hosts(self, filter_text: str | None = None) -> Iterator[HostInfo]:
        """Every host matching the filter, across pages."""

    def get_tags(self, host: str, source: str = "user") -> list[str]:
        """Tags of one source on a host ([] when none)."""

    def add_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        """Append tags to a source; returns the source's tags."""

    def replace_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        """Replace all tags of a source; an empty list removes them."""


@dataclass(frozen=True)
class HostPage:
    """One page of the host list and how many hosts match its filter (None unless the backend says it is exact)."""

    hosts: tuple[HostInfo, ...]
    total: int | None


@runtime_checkable
class HostPages(Protocol):
    """One page of the host list with its exact match count: a pool's host sizes read without listing the pool.

    Optional beside HostTags: a backend without it has its pools listed whole (gpufarm.core.context.reads).
    """

    def host_page(self, filter_text: str, start: int, count: int) -> HostPage:
        """Up to `count` hosts matching the filter from `start` on, and the exact number matching it."""


class MetricsSink(Protocol):
    """Where metrics go (Datadog API v2 series)."""

    def submit(self, series: Sequence[MetricSeries]) -> None:
        """Submit series; raises UpstreamError after bounded retries."""


class MonitorStates(Protocol):
    """What a monitor says of one of its groups now (Datadog monitors API)."""

    def group_status(self, monitor_id: int, group: Sequence[str]) -> str | None:
        """`Alert`, `Warn`, `OK`, `No Data` for the group with these tags; None when the monitor or group is unknown."""

    def alerting_groups(self, monitor_tag: str, *, excluding: str | None = None) -> list[tuple[int, tuple[str, ...]]]:
        """(monitor id, group tags) of every group in Alert, among the monitors carrying `monitor_tag` and not
        `excluding`."""


class MetricsQuery(Protocol):
    """Reading metrics back (Datadog query APIs)."""

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        """Reduce a metrics query to one value per group."""


class MetricsHistory(Protocol):
    """Metrics over time, for reports' charts (Datadog's v2 timeseries query)."""

    def timeseries(
        self, query: str, start: datetime, end: datetime, *, max_points: int = 300
    ) -> list[TimeseriesResult]:
        """A query's groups over the window, in at most about `max_points` buckets each."""


class Chat(Protocol):
    """Slack, as gpufarm uses it."""

    def post_message(self, channel: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None) -> str:
        """Post to a channel or DM; returns the message ts."""

    def update_message(
        self, channel: str, ts: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Rewrite a message the app posted."""

    def post_ephemeral(
        self, channel: str, user: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Show a message to one user in a channel."""

    def open_view(self, trigger_id: str, view: Mapping[str, Any]) -> str:
        """Open a modal; returns the view id."""

    def update_view(self, view_id: str, view: Mapping[str, Any]) -> None:
        """Replace an open modal."""

    def publish_home(self, user: str, view: Mapping[str, Any]) -> None:
        """Publish a user's App Home tab (views.publish)."""

    def open_dm(self, user: str) -> str:
        """The DM channel id with a user."""

    def user_name(self, user: str) -> str:
        """A user's display name (falls back to the id)."""

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        """User ids in a user group (cached by the adapter: the method is Tier 2)."""

    def respond(
        self,
        response_url: str,
        text: str,
        blocks: Sequence[Mapping[str, Any]] | None = None,
        *,
        replace_original: bool = False,
        in_channel: bool = False,
    ) -> None:
        """Answer through a response_url."""

    def tell_user(self, user: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None) -> str:
        """DM a user (conversations.open + chat.postMessage); returns the ts."""

    def upload_file(
        self, channel: str, filename: str, content: bytes, *, title: str, initial_comment: str | None = None
    ) -> str:
        """Share a file (a report's CSV) into a channel, the comment as its message; returns the file id."""


class AsyncInvoker(Protocol):
    """Hands slow work to another function (Lambda async invoke; in-process locally)."""

    def invoke(self, function: str, payload: Mapping[str, Any]) -> None:
        """Fire and forget."""


class WorkQueue(Protocol):
    """An ordered queue: messages of one group are processed one at a time (SQS FIFO locally emulated)."""

    def send(self, body: Mapping[str, Any], *, group: str, dedup_id: str) -> None:
        """Enqueue; the same dedup_id within five minutes is dropped, as SQS FIFO does."""


class Clock(Protocol):
    """What time it is (the sandbox's clock locally, wall time in Lambda)."""

    def now(self) -> datetime:
        """Timezone-aware now."""


# -- inventory sources (gpufarm.core.inventory.sources merges what they read)
# ------------------------------------------------


@dataclass(frozen=True)
class SeenNode:
    """A GPU node as one inventory source sees it: a cloud instance, a static entry, or a host with an agent.

    `gpu_model` is None when the source could not say (an instance type it does not know, an answer without GPU
    information): such a node is reported as unknown and never counted as a GPU of some other model.
    """

    source: str
    id: str
    # Names the node may appear under in Datadog's host list (instance id, private DNS name, computer name).
    names: tuple[str, ...] = ()
    region: str = ""
    instance_type: str = ""
    # The quota family the node counts against (EC2 `P`, `G`; Azure `standardNDSH100v5Family`), "" when none.
    family: str = ""
    gpu_model: str | None = None
    gpu_count: int = 0
    vcpus: int = 0
    environment: str | None = None
    cluster: str | None = None
    # True when the node itself reports (gpufarm-node's registration or the Datadog Agent's GPU check).
    agent: bool = False
    last_reported: float | None = None
    # `ir-123` values of the incidents holding the node (agent hosts only: cloud sources do not know).
    irs: tuple[str, ...] = ()
    # True when the source saw the node report earlier but not within inventory.down_after_minutes (a Datadog Agent
    # host whose GPU check fell silent): down by the same rule as a registered host silent that long.
    silent: bool = False


@dataclass(frozen=True)
class CloudQuota:
    """One cloud quota: a region's limit for a family of GPU instances, and what is in use against it."""

    source: str
    region: str
    family: str
    limit: float
    used: float
    unit: str = "vcpu"


@dataclass(frozen=True)
class CapacityReservation:
    """Reserved capacity (an EC2 capacity reservation or capacity block): instances reserved and still free."""

    source: str
    region: str
    id: str
    instance_type: str
    kind: str
    total: int
    available: int
    gpu_model: str | None = None
    gpus_per_instance: int = 0


@dataclass(frozen=True)
class SourceError:
    """A part of a source that could not be read (a region, a subscription); the rest of the reading stands."""

    source: str
    where: str
    message: str
    throttled: bool = False


@dataclass(frozen=True)
class SourceReading:
    """What one inventory source read in one sync: nodes, quotas, reservations, errors, and the calls it made."""

    source: str
    nodes: tuple[SeenNode, ...] = ()
    quotas: tuple[CloudQuota, ...] = ()
    reservations: tuple[CapacityReservation, ...] = ()
    errors: tuple[SourceError, ...] = ()
    calls: int = 0


@dataclass(frozen=True)
class Event:
    """A Datadog event (API v1 `POST /api/v1/events`): what gpufarm tells the event stream, never a secret."""

    title: str
    text: str
    tags: tuple[str, ...] = ()
    # Events with one key group together in the event stream (at most 100 characters).
    aggregation_key: str | None = None
    # error, warning, info or success.
    alert_type: str = "info"
    # Epoch seconds; None: when Datadog receives it.
    date_happened: int | None = None


class EventSink(Protocol):
    """Where events go (the Datadog event stream)."""

    def post_event(self, event: Event) -> None:
        """Post one event; raises UpstreamError after bounded retries."""


class InventorySource(Protocol):
    """Somewhere GPU nodes and quotas can be read from (Datadog hosts, AWS, Azure, a static list)."""

    name: str

    def read(self) -> SourceReading:
        """Read everything once (paged, cached per run); failures of a part go into `errors`, never raise."""
