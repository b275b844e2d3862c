"""In-memory implementations of the core's ports, for unit tests of the lifecycle service.

They keep the behaviour the service relies on from the real adapters, and `tests/contract/test_port_fakes.py` runs
the same port contract against them and against the real adapters on the sandbox: fields go through the real
encode/decode (an unknown field name is refused as ValidationFailed), a create with a known request id returns the
first incident, host tags are per source and normalized, a search filters on state and field facets, a host
never seen has no tags, an unknown user group fails instead of meaning "nobody", and an unknown user is its id.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpufarm.adapters.slack import check_upload
from gpufarm.core.governance.policy import build_request
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.hosts import normalize_tag
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.ports import HostInfo, HostPage, MetricSeries
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm_node.tags import registration_tags
from gpufarm_sandbox.emulator.incidents_search import matches, parse_query

if TYPE_CHECKING:
    from gpufarm.core.service import GpuFarm


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self.current = start or datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.current

    def advance(self, **delta: float) -> None:
        self.current += timedelta(**delta)


def _stored(fields: Mapping[str, object]) -> dict[str, f.FieldValue]:
    """Fields as Datadog stores them; a name or value the schema refuses fails as the gateway's check does."""
    try:
        return f.decode_fields(f.encode_fields(fields))
    except (KeyError, TypeError) as exc:
        raise ValidationFailed("fields", str(exc.args[0])) from None


def _facet_values(record: IncidentRecord, facet: str | None) -> list[str]:
    if facet is None or facet == "title":
        return [record.title]
    if facet == "state":
        return [record.state or ""]
    value = record.fields.get(facet)
    return [] if value is None else list(value) if isinstance(value, list) else [value]


class FakeIncidents:
    """IncidentStore in memory; public ids count from 1 as Datadog's do."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.records: dict[str, IncidentRecord] = {}
        self.creates = 0
        self.updates: list[tuple[int, dict[str, Any]]] = []
        self.searches: list[IncidentQuery] = []

    def create(
        self,
        title: str,
        fields: Mapping[str, object],
        *,
        notification_handles: Sequence[str] = (),
        initial_note: str | None = None,
    ) -> IncidentRecord:
        decoded = _stored(fields)
        request_id = decoded.get(f.REQUEST_ID)
        existing = self.find_by_request_id(str(request_id)) if request_id else None
        if existing is not None:
            return existing
        self.creates += 1
        record = IncidentRecord(
            id=str(uuid.uuid4()),
            public_id=len(self.records) + 1,
            title=title,
            state=str(decoded.get(f.STATE) or "active"),
            fields=decoded,
            created=self.clock.now(),
            modified=self.clock.now(),
        )
        self.records[record.id] = record
        return record

    def get(self, incident_id: str) -> IncidentRecord:
        try:
            return self.records[incident_id]
        except KeyError:
            raise NotFound(f"incident {incident_id} not found") from None

    def get_by_ir(self, ir: int) -> IncidentRecord:
        if isinstance(ir, bool) or not isinstance(ir, int) or ir <= 0:
            raise ValidationFailed("ir", "an incident number is a positive integer")
        for record in self.records.values():
            if record.public_id == ir:
                return record
        raise NotFound(f"IR-{ir} not found")

    def update(self, incident_id: str, fields: Mapping[str, object], *, title: str | None = None) -> IncidentRecord:
        record = self.get(incident_id)
        merged = {**record.fields, **_stored(fields)}
        state = str(merged.get(f.STATE) or record.state)
        updated = record.model_copy(
            update={
                "fields": merged,
                "state": state,
                "title": title or record.title,
                "modified": self.clock.now(),
                "resolved": self.clock.now() if state == "resolved" else None,
            }
        )
        self.records[incident_id] = updated
        self.updates.append((record.public_id, dict(fields)))
        return updated

    def search(self, query: IncidentQuery) -> Iterator[IncidentRecord]:
        # The query's Datadog text in the sandbox's own language (state and field facets filter): what the real
        # store sends when Datadog applies every facet.
        parsed = parse_query(query.text())
        self.searches.append(query)
        records = list(self.records.values())
        if query.scan is not None:  # the newest `scan` of the matches, as the store reads with the facets applied
            records = sorted(records, key=lambda r: -r.public_id)
            records = [r for r in records if matches(parsed, lambda facet, r=r: _facet_values(r, facet))][: query.scan]
        for record in records:
            if matches(parsed, lambda facet, r=record: _facet_values(r, facet)):
                yield record

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        same = [r for r in self.records.values() if r.fields.get(f.REQUEST_ID) == request_id]
        return min(same, key=lambda r: r.public_id) if same else None

    def by_ir(self, ir: int) -> IncidentRecord:
        """Test helper: the current record of an IR."""
        return self.get_by_ir(ir)


class FakeHosts:
    """HostTags in memory: tags per host and source, normalized like Datadog."""

    def __init__(self) -> None:
        self.tags: dict[str, dict[str, list[str]]] = {}
        self.writes = 0

    def seed(self, name: str, model: str, count: int, env: str, cluster: str = "c1") -> None:
        """Register an inventory host (its agent's tags)."""
        self.tags[name] = {"datadog": registration_tags(model, count, env, cluster)}

    def list_hosts(self, filter_text: str | None = None) -> Iterator[HostInfo]:
        yield from self._matching(filter_text)

    def host_page(self, filter_text: str, start: int, count: int) -> HostPage:
        """One page of the host list and the exact number matching its filter (Datadog's total_matching)."""
        matching = list(self._matching(filter_text))
        return HostPage(tuple(matching[start : start + count]), len(matching))

    def _matching(self, filter_text: str | None) -> Iterator[HostInfo]:
        terms = (filter_text or "").split()
        for name, sources in sorted(self.tags.items()):
            merged = tuple(dict.fromkeys(t for tags in sources.values() for t in tags))
            if all(term in merged or term in name for term in terms):
                yield HostInfo(name, merged, {k: tuple(v) for k, v in sources.items()})

    def get_tags(self, host: str, source: str = "user") -> list[str]:
        return list(self.tags.get(host, {}).get(source, []))

    def add_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        current = self.tags.setdefault(host, {}).setdefault(source, [])
        current += [normalize_tag(t) for t in tags if normalize_tag(t) not in current]
        self.writes += 1
        return list(current)

    def replace_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        self.tags.setdefault(host, {})[source] = list(dict.fromkeys(normalize_tag(t) for t in tags))
        self.writes += 1
        return list(self.tags[host][source])

    def user(self, host: str) -> list[str]:
        """Test helper: the user-source tags of a host."""
        return list(self.tags.get(host, {}).get("user", []))


@dataclass
class Sent:
    """One thing the fake Slack was asked to show."""

    kind: str
    target: str
    text: str
    blocks: list[Mapping[str, Any]] = field(default_factory=list)
    ts: str = ""


class FakeChat:
    """Chat in memory: every message kept in order; one user group of operators; users named by `names`, else id."""

    def __init__(self, operators: frozenset[str] = frozenset(), usergroup: str = "S0000000001") -> None:
        self.operators = operators
        self.usergroup = usergroup
        self.names: dict[str, str] = {}
        self.sent: list[Sent] = []
        # Uploaded files by id: (filename, bytes); their shares are Sent("file", channel, comment, ts=file id).
        self.files: dict[str, tuple[str, bytes]] = {}
        self.fail_dms = False
        # The last Home published per user (views.publish replaces it).
        self.homes: dict[str, dict[str, Any]] = {}
        self._ts = 1000

    def _next_ts(self) -> str:
        self._ts += 1
        return f"1700000000.{self._ts:06d}"

    def post_message(self, channel: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None) -> str:
        ts = self._next_ts()
        self.sent.append(Sent("post", channel, text, list(blocks or []), ts))
        return ts

    def update_message(
        self, channel: str, ts: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        self.sent.append(Sent("update", channel, text, list(blocks or []), ts))

    def post_ephemeral(
        self, channel: str, user: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        self.sent.append(Sent("ephemeral", f"{channel}/{user}", text, list(blocks or [])))

    def open_view(self, trigger_id: str, view: Mapping[str, Any]) -> str:
        self.sent.append(Sent("view", trigger_id, str(view.get("callback_id")), list(view.get("blocks", []))))
        return "V0000000001"

    def update_view(self, view_id: str, view: Mapping[str, Any]) -> None:
        self.sent.append(Sent("view_update", view_id, str(view.get("callback_id"))))

    def publish_home(self, user: str, view: Mapping[str, Any]) -> None:
        # What Slack refuses of views.publish: an unknown user, a view that is not a Home, more than 100 blocks.
        if not re.match(r"^[UW][A-Z0-9]{2,20}$", user):
            raise UpstreamError(f"slack views.publish failed: user_not_found ({user})")
        blocks = list(view.get("blocks", []))
        if view.get("type") != "home" or len(blocks) > 100:
            raise UpstreamError("slack views.publish failed: invalid_arguments")
        self.homes[user] = dict(view)
        self.sent.append(Sent("home", user, str(view.get("callback_id")), blocks))

    def open_dm(self, user: str) -> str:
        return "D" + user[1:]

    def user_name(self, user: str) -> str:
        return self.names.get(user, user)

    def usergroup_members(self, usergroup: str) -> frozenset[str]:
        if usergroup != self.usergroup:
            raise UpstreamError(f"slack usergroups.users.list failed: no_such_subteam ({usergroup})")
        return self.operators

    def respond(
        self,
        response_url: str,
        text: str,
        blocks: Sequence[Mapping[str, Any]] | None = None,
        *,
        replace_original: bool = False,
        in_channel: bool = False,
    ) -> None:
        self.sent.append(Sent("respond", response_url, text, list(blocks or [])))

    def tell_user(self, user: str, text: str, blocks: Sequence[Mapping[str, Any]] | None = None) -> str:
        if self.fail_dms:
            raise UpstreamError("channel_not_found")
        ts = self._next_ts()
        self.sent.append(Sent("dm", user, text, list(blocks or []), ts))
        return ts

    def upload_file(
        self, channel: str, filename: str, content: bytes, *, title: str, initial_comment: str | None = None
    ) -> str:
        check_upload(channel, filename, content, title=title, initial_comment=initial_comment)
        file_id = f"F{len(self.files) + 1:010d}"
        self.files[file_id] = (filename, bytes(content))
        self.sent.append(Sent("file", channel, initial_comment or "", [], file_id))
        return file_id

    def to(self, target: str, kind: str | None = None) -> list[Sent]:
        """Test helper: what was sent to one user or channel."""
        return [s for s in self.sent if s.target == target and (kind is None or s.kind == kind)]


class FakeQueue:
    """WorkQueue that records what was sent, dropping repeated dedup ids as SQS FIFO does."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self._dedup: set[str] = set()

    def send(self, body: Mapping[str, Any], *, group: str, dedup_id: str) -> None:
        if dedup_id in self._dedup:
            return
        self._dedup.add(dedup_id)
        self.sent.append((group, dict(body)))


class FakeMetrics:
    """MetricsSink that keeps every series."""

    def __init__(self) -> None:
        self.series: list[MetricSeries] = []

    def submit(self, series: Sequence[MetricSeries]) -> None:
        self.series += list(series)

    def value(self, metric: str, *tags: str) -> float | None:
        """Test helper: the latest value of a metric carrying all the given tags."""
        found = [s for s in self.series if s.metric == metric and all(t in s.tags for t in tags)]
        return found[-1].points[-1].value if found else None


class FakeMonitorStates:
    """MonitorStates over a dict: (monitor id, frozenset of group tags) -> status; unknown groups answer None."""

    def __init__(self) -> None:
        self.states: dict[tuple[int, frozenset[str]], str] = {}
        self.asked: list[tuple[int, tuple[str, ...]]] = []
        # The monitor tag each alerting_groups call left out.
        self.excluded: list[str | None] = []

    def set(self, monitor_id: int, group: str, status: str) -> None:
        """Test helper: what the monitor says of a group (`ir:ir-1` or `gpu_ir:ir-1,host:h`)."""
        self.states[(monitor_id, frozenset(group.split(",")))] = status

    def group_status(self, monitor_id: int, group: Sequence[str]) -> str | None:
        self.asked.append((monitor_id, tuple(group)))
        return self.states.get((monitor_id, frozenset(group)))

    def alerting_groups(self, monitor_tag: str, *, excluding: str | None = None) -> list[tuple[int, tuple[str, ...]]]:
        self.excluded.append(excluding)
        return [(mid, tuple(sorted(group))) for (mid, group), status in self.states.items() if status == "Alert"]


class FakeInvoker:
    """AsyncInvoker that records hand-offs."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def invoke(self, function: str, payload: Mapping[str, Any]) -> None:
        self.calls.append((function, dict(payload)))


# A small farm for unit tests: two dedicated pools and a shared one.
FARM_YAML = """
operators_usergroup: S0000000001
operators_channel: C0000000001
gpu_models:
  H100: {description: NVIDIA H100}
  A100: {description: NVIDIA A100}
  L4: {}
environments:
  hpc: {kind: dedicated, gpu_models: [H100]}
  cloud: {kind: dedicated, gpu_models: [H100, A100]}
  slices: {kind: shared, gpu_models: [A100, L4]}
teams:
  nlp:
    max_days: 30
    quotas:
      hpc: {H100: {gpus: 8, hard_limit: 16}}
      cloud: {A100: {gpus: 8}}
      slices: {A100: {gpus: 4, hard_limit: 8}}
  vision:
    max_days: 14
    quotas:
      hpc: {H100: {gpus: 0, hard_limit: 8}}
idle: {grace_minutes: 60}
defaults: {duration_days: 7, extend_days: 7}
"""

_REQUEST_IDS = itertools.count(1)


def ask_hpc(
    svc: GpuFarm, incidents: FakeIncidents, requester: str, count: int, days: int, team: str = "nlp", project: str = "p"
) -> int:
    """A request for `count` H100 of FARM_YAML's `hpc` pool, submitted and its incident processed as the allocation
    queue would: the new incident's IR."""
    values = {
        "gpu_count": str(count),
        "gpu_model": "H100",
        "environment": "hpc",
        "team": team,
        "project": project,
        "duration_days": str(days),
    }
    request_id = f"hpc-{next(_REQUEST_IDS):06d}"
    svc.submit_request(
        build_request(values, svc.context.farm, requester=requester, channel=None, request_id=request_id)
    )
    ir = max(r.public_id for r in incidents.records.values())
    svc.process(incidents.by_ir(ir).id)
    return ir
