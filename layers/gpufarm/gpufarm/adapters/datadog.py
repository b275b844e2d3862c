"""Datadog runtime gateway: the incidents, hosts and tags, and metrics the handlers use, over datadog-api-client.

Request bodies are written in Datadog's documented JSON shape; the client converts and type-checks them
against its own models before anything is sent (`check_input_type`), except the metric series, checked here and
sent as that JSON (docs/datadog.md, "Sending bulk writes"). Single answers come back through its
models (`check_return_type`), converted here into gpufarm's own types; bulk reads (search pages, the host list)
are decoded from their JSON here, because building the client's model graph for them costs ~40x the fetch
(docs/datadog.md, "Decoding bulk reads"). Setup-time administration (incident
types, field definitions, notification rules, webhooks, monitors, dashboards) is `gpufarm.adapters.datadog_admin`;
the client configuration and error mapping both use live in `gpufarm.adapters.datadog_client`.

Every incident this gateway creates carries gpufarm's incident type, and every read, search and count sees
that type only: the organization's other incidents are never treated as GPU allocations, changed or counted.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpufarm.adapters import datadog_client as dc
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.ports import (
    Event,
    HostInfo,
    HostPage,
    MetricPoint,
    MetricSeries,
    ScalarResult,
    TimeseriesResult,
)

if TYPE_CHECKING:
    from gpufarm.core.kernel.ports import (
        HostPages,
        HostTags,
        IncidentStore,
        MetricsHistory,
        MetricsQuery,
        MetricsSink,
        MonitorStates,
    )

log = logging.getLogger(__name__)

LIVE_QUERY = "state:(active OR stable)"
ANY_STATE_QUERY = "state:(active OR stable OR resolved)"
SEARCH_PAGE = 100  # Datadog's maximum page[size] for incidents
HOSTS_PAGE = 1000  # Datadog's maximum `count` for the hosts list
MONITORS_PAGE = 1000  # page_size for the monitors list
# How many incident ids a gateway remembers as gpufarm's own, so an update right after a read costs no re-check.
KNOWN_IDS = 4096
# How many IR -> UUID pairs a gateway remembers (about 150 bytes each). The pair never changes once an incident
# exists, so the index holds a fact, not state: an entry is only ever confirmed or dropped, never trusted blindly.
IR_INDEX_SIZE = 50_000

# Series payload limits: 512,000 bytes compressed, 5,242,880 decompressed (docs/datadog.md, "Metrics").
# Batches aim well below both so the client's own compression (same zlib level) never crosses them.
MAX_COMPRESSED_BYTES = 500_000
MAX_RAW_BATCH_BYTES = 3_000_000
# Event limits (API v1 events): text 4,000 characters, aggregation key 100; a title is kept to one short line.
MAX_EVENT_TITLE = 200
MAX_EVENT_TEXT = 4000
MAX_EVENT_AGGREGATION_KEY = 100


class DatadogGateway:
    """IncidentStore, HostTags, MetricsSink and MetricsQuery over Datadog: what the handlers use at run time.

    Incidents are gpufarm's own incident type only. The type's id comes from `incident_type_id` (or the
    GPUFARM_INCIDENT_TYPE_ID setting); without one it is looked up by name (GPUFARM_INCIDENT_TYPE, default
    "GPU allocation") on the first incident call and kept for the gateway's life, which is the container's
    (handlers build their collaborators once): one extra read per cold container, none per request.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        incident_type_id: str | None = None,
        create_attempts: int | None = None,
        create_backoff_s: float = 0.5,
        request_id_scan: int = 50,
        search_page_size: int = SEARCH_PAGE,
        sleep: Callable[[float], None] = time.sleep,
        rate_limit_wait_s: float = dc.RATE_LIMIT_WAIT_S,
        rate_limit_retries: int = dc.RATE_LIMIT_RETRIES,
    ) -> None:
        dc.require_api_key(settings)
        self.settings = settings
        self.base_url = settings.datadog_base_url()
        self.incident_type_name = settings.incident_type
        self._type_id = incident_type_id or settings.incident_type_id
        # Our own create loop: 1 try plus settings.max_retries more, each preceded by a request_id re-check.
        self.create_attempts = max(1, create_attempts if create_attempts is not None else settings.max_retries + 1)
        self.create_backoff_s = create_backoff_s
        # How many of the newest incidents find_by_request_id looks through: a retried create or a duplicate
        # Slack hand-off comes seconds to minutes after the first, when few incidents (GPU requests arrive at
        # human pace) can have been created in between. One page keeps each create to one extra read.
        self.request_id_scan = max(1, request_id_scan)
        self.search_page_size = max(1, min(SEARCH_PAGE, search_page_size))
        self._sleep = sleep
        # Ids already read back as gpufarm's type: updating them needs no re-check (bounded, oldest dropped).
        self._own_ids: OrderedDict[str, None] = OrderedDict()
        # IR number -> incident UUID, filled by every incident this gateway decodes (bounded, oldest dropped).
        self._ir_index: OrderedDict[int, str] = OrderedDict()
        self._index_lock = threading.Lock()
        # One gate for the three clients: a rate limit one of them saw spent holds the others (docs/datadog.md,
        # "Rate limits"); each waits out a 429 within the same bounds.
        self.rate_limits = dc.RateLimitGate(max_wait_s=rate_limit_wait_s)
        limits: dict[str, Any] = {
            "gate": self.rate_limits,
            "rate_limit_wait_s": rate_limit_wait_s,
            "rate_limit_retries": rate_limit_retries,
        }
        self._client = dc.api_client(settings, retry=True, **limits)
        # Same keys, timeouts and retries; answers come back unread, for the bulk reads decoded here.
        self._raw_client = dc.api_client(settings, retry=True, raw=True, **limits)
        # The series as plain JSON: same keys, timeouts and retries, no model built from them (submit checks them).
        self._plain_client = dc.api_client(settings, retry=True, raw=True, check_input=False, **limits)
        # Status retries off: the client would retry POST after a 5xx and could create a second incident
        # (docs/datadog.md, "The client"); create() retries itself after re-checking. A 429 is still waited out.
        self._create_client = dc.api_client(settings, retry=False, **limits)

    def close(self) -> None:
        """Release the HTTP connection pools."""
        self._client.close()
        self._raw_client.close()
        self._plain_client.close()
        self._create_client.close()

    # -- API objects, built on first use (each API module imports its own models only) ---------------

    @cached_property
    def _incidents(self) -> Any:
        return dc.build("datadog_api_client.v2.api.incidents_api", "IncidentsApi", self._client)

    @cached_property
    def _incidents_no_retry(self) -> Any:
        return dc.build("datadog_api_client.v2.api.incidents_api", "IncidentsApi", self._create_client)

    @cached_property
    def _incidents_raw(self) -> Any:
        return dc.build("datadog_api_client.v2.api.incidents_api", "IncidentsApi", self._raw_client)

    @cached_property
    def _hosts_raw(self) -> Any:
        return dc.build("datadog_api_client.v1.api.hosts_api", "HostsApi", self._raw_client)

    @cached_property
    def _tags(self) -> Any:
        return dc.build("datadog_api_client.v1.api.tags_api", "TagsApi", self._client)

    @cached_property
    def _monitors_raw(self) -> Any:
        return dc.build("datadog_api_client.v1.api.monitors_api", "MonitorsApi", self._raw_client)

    @cached_property
    def _metrics(self) -> Any:
        return dc.build("datadog_api_client.v2.api.metrics_api", "MetricsApi", self._client)

    @cached_property
    def _metrics_raw(self) -> Any:
        return dc.build("datadog_api_client.v2.api.metrics_api", "MetricsApi", self._raw_client)

    @cached_property
    def _metrics_plain(self) -> Any:
        return dc.build("datadog_api_client.v2.api.metrics_api", "MetricsApi", self._plain_client)

    # -- gpufarm's incident type ----------------------------------------------------------------------

    @property
    def incident_type_id(self) -> str:
        """The id of gpufarm's incident type (looked up by name once, then kept)."""
        if self._type_id is None:
            self._type_id = self._find_type_id()
        return self._type_id

    def _find_type_id(self) -> str:
        name = self.incident_type_name
        with dc.errors("list incident types"):
            response = self._incidents.list_incident_types()
        found = [dc.plain_dict(t) for t in (dc.get(response, "data") or [])]
        named = [t for t in found if (t.get("attributes") or {}).get("name") == name]
        # UpstreamError, not NotFound: the setup is missing, not an incident, and callers retry upstream errors
        # (a queued change is redelivered once `gpufarm datadog apply` has made the type).
        if len(named) != 1:
            why = "no incident type" if not named else f"{len(named)} incident types"
            raise UpstreamError(f"Datadog has {why} named {name!r}: run `gpufarm datadog apply`")
        if (named[0].get("attributes") or {}).get("is_default"):
            raise UpstreamError(
                f"incident type {name!r} is the organization's default type; gpufarm needs a type of its own "
                "(run `gpufarm datadog apply`)"
            )
        type_id = str(named[0]["id"])
        log.info("gpufarm incident type %r is %s", name, type_id)
        return type_id

    def _scoped(self, query: str) -> str:
        # Recorded search answers carry an `incident_type` facet (name and id); filtering on it keeps other types'
        # incidents off the wire. Datadog's filter on it is unconfirmed, so _own() still checks every answer.
        return f"incident_type:{self.incident_type_id} AND ({query})"

    def _own(self, data: Any) -> IncidentRecord | None:
        """The record when the incident is of gpufarm's type, else None (another team's incident).

        `data` is an incident's data object: a client model, or the JSON of a raw answer (used as it is).
        """
        plain = data if isinstance(data, dict) else dc.plain_dict(data)
        # Checked before anything else is read: another type's fields are none of gpufarm's business.
        if (plain.get("attributes") or {}).get("incident_type_uuid") != self.incident_type_id:
            return None
        record = _record(plain)
        with self._index_lock:
            self._own_ids[record.id] = None
            self._own_ids.move_to_end(record.id)
            while len(self._own_ids) > KNOWN_IDS:
                self._own_ids.popitem(last=False)
            if record.public_id > 0:
                self._ir_index[record.public_id] = record.id
                self._ir_index.move_to_end(record.public_id)
                while len(self._ir_index) > IR_INDEX_SIZE:
                    self._ir_index.popitem(last=False)
        return record

    def _check_own(self, incident_id: str) -> None:
        """Raise NotFound unless the incident is gpufarm's (one read when this gateway has not seen it yet)."""
        if incident_id not in self._own_ids:
            self.get(incident_id)

    # -- IncidentStore --------------------------------------------------------------------------------

    def create(
        self,
        title: str,
        fields: Mapping[str, object],
        *,
        notification_handles: Sequence[str] = (),
        initial_note: str | None = None,
    ) -> IncidentRecord:
        """Create an incident once: a request_id field makes retries (ours and the caller's) find the first one."""
        # Input is checked before anything is read or written.
        attributes: dict[str, Any] = {
            "title": _checked_title(title),
            "customer_impacted": False,
            "fields": _encode(fields),
            "incident_type_uuid": self.incident_type_id,
        }
        if notification_handles:
            attributes["notification_handles"] = [
                {"handle": handle, "display_name": handle.lstrip("@")} for handle in notification_handles
            ]
        if initial_note:
            attributes["initial_cells"] = [
                {"cell_type": "markdown", "content": {"content": initial_note}, "important": False}
            ]
        body = {"data": {"type": "incidents", "attributes": attributes}}
        request_id = fields.get(f.REQUEST_ID)
        rid = str(request_id) if request_id else None
        if rid:
            existing = self.find_by_request_id(rid)
            if existing is not None:
                return existing
        for attempt in range(1, self.create_attempts + 1):
            try:
                with dc.classified("create incident"):
                    response = self._incidents_no_retry.create_incident(body=body)
                return self._created(response.data)
            except dc.Failed as failed:
                outcome = failed.outcome
                # Without a request_id a 5xx or a timeout leaves us unable to tell whether Datadog created
                # it, so only a plain refusal (429/408/connection refused) may be sent again.
                if not (outcome.transient and (rid is not None or outcome.not_applied)):
                    raise failed.error() from None
                last = attempt == self.create_attempts
                if last and (rid is None or outcome.not_applied):
                    raise failed.error() from None
                delay = self.create_backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "create incident failed (%s); attempt %d, re-check in %.1fs", outcome.message, attempt, delay
                )
                self._sleep(delay)
                # Re-check before sending again, and once more after the last failure: the server may have
                # created it before its answer was lost.
                if rid:
                    existing = self.find_by_request_id(rid)
                    if existing is not None:
                        return existing
                if last:
                    raise failed.error() from None
        raise AssertionError("unreachable: the loop returns or raises")

    def _created(self, data: Any) -> IncidentRecord:
        record = self._own(data)
        if record is None:
            # Datadog ignored the type it was sent: an answer gpufarm cannot trust, not a lease.
            raise UpstreamError("Datadog created the incident on another incident type than gpufarm's")
        return record

    def get(self, incident_id: str) -> IncidentRecord:
        """Fetch by UUID; raises NotFound (also for an incident of another type: it is not an allocation)."""
        with dc.errors("get incident"):
            response = self._incidents.get_incident(incident_id=incident_id)
        record = self._own(response.data)
        if record is None:
            raise NotFound(f"incident {incident_id} is not a gpufarm allocation")
        return record

    def get_by_ir(self, ir: int) -> IncidentRecord:
        """Fetch by incident number (public_id) among gpufarm's incidents; raises NotFound.

        One GET when this gateway has seen the incident (its IR index), else a newest-first search that stops
        below the number asked for: a recent IR costs one or two calls however many incidents are live.
        """
        # The API's incident path takes the UUID (public_id is unconfirmed; docs/datadog.md, "Incidents (v2)").
        if isinstance(ir, bool) or not isinstance(ir, int) or ir <= 0:
            raise ValidationFailed("ir", "an incident number is a positive integer")
        with self._index_lock:
            known = self._ir_index.get(ir)
        if known is not None:
            try:
                record = self.get(known)
            except NotFound:
                record = None  # deleted since: fall back to the search
            if record is not None and record.public_id == ir:
                return record
            with self._index_lock:
                if self._ir_index.get(ir) == known:
                    del self._ir_index[ir]
        # Every state, newest first: public_id grows with creation time, so once the numbers drop below the
        # one asked for it cannot come. Each page decoded fills the index on the way.
        for record in self.search(ANY_STATE_QUERY, newest_first=True):
            if record.public_id == ir:
                return record
            if record.public_id < ir:
                break
        raise NotFound(f"IR-{ir} is not a gpufarm allocation")

    def update(self, incident_id: str, fields: Mapping[str, object], *, title: str | None = None) -> IncidentRecord:
        """Write some fields (plain values); others are left as they are. Only gpufarm's incidents."""
        attributes: dict[str, Any] = {}
        if fields:
            attributes["fields"] = _encode(fields)
        if title is not None:
            attributes["title"] = _checked_title(title)
        if not attributes:
            return self.get(incident_id)
        self._check_own(incident_id)
        body = {"data": {"id": incident_id, "type": "incidents", "attributes": attributes}}
        with dc.errors("update incident"):
            response = self._incidents.update_incident(incident_id=incident_id, body=body)
        record = self._own(response.data)
        if record is None:
            raise UpstreamError(f"incident {incident_id} changed incident type while gpufarm updated it")
        return record

    def delete(self, incident_id: str) -> None:
        """Delete one of gpufarm's incidents (tests and cleanup; allocations end by resolving, never by deleting)."""
        self._check_own(incident_id)
        with dc.errors("delete incident"):
            self._incidents.delete_incident(incident_id=incident_id)
        with self._index_lock:
            self._own_ids.pop(incident_id, None)
            for ir in [ir for ir, known in self._ir_index.items() if known == incident_id]:
                del self._ir_index[ir]

    def search(self, query: str, *, newest_first: bool = False) -> Iterator[IncidentRecord]:
        """gpufarm's incidents matching a Datadog incident search query, every page (newest first when asked)."""
        kwargs: dict[str, Any] = {"query": self._scoped(query), "page_size": self.search_page_size}
        if newest_first:
            kwargs["sort"] = _newest_first()
        yield from self._search_pages(kwargs, limit=None)

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        """The incident created for a Slack request, so a retried create never makes a second one.

        When overlapping deliveries of one request each created an incident, the lowest IR is the one that lives
        (the others were closed as its duplicates at once), so that is the one returned: an answer to a later
        retry names the live incident, never a closed duplicate.
        """
        # Search by a custom field is unconfirmed (docs/datadog.md, "Incidents (v2)"), so this reads gpufarm's
        # newest incidents in any state (`request_id_scan` of them) and compares the field itself.
        kwargs: dict[str, Any] = {
            "query": self._scoped(ANY_STATE_QUERY),
            "page_size": min(self.search_page_size, self.request_id_scan),
            "sort": _newest_first(),
        }
        same = [
            record
            for record in self._search_pages(kwargs, limit=self.request_id_scan)
            if record.fields.get(f.REQUEST_ID) == request_id
        ]
        return min(same, key=lambda record: record.public_id) if same else None

    def _search_pages(self, kwargs: dict[str, Any], *, limit: int | None) -> Iterator[IncidentRecord]:
        offset = 0
        seen = 0
        while True:
            with dc.errors("search incidents"):
                body = dc.read_json(self._incidents_raw.search_incidents(page_offset=offset, **kwargs))
            attributes = _search_attributes(body)
            page = attributes.get("incidents") or []
            for item in page:
                record = self._own(_item_data(item))
                if record is None:
                    continue
                yield record
                seen += 1
                if limit is not None and seen >= limit:
                    return
            offset += len(page)
            total = attributes.get("total")
            # Stop on a short page, as the client's own pagination does, or once `total` is reached.
            if len(page) < kwargs["page_size"] or (isinstance(total, int) and offset >= total):
                return

    # -- HostTags -------------------------------------------------------------------------------------

    def list_hosts(self, filter_text: str | None = None) -> Iterator[HostInfo]:
        """Every host matching the filter, across pages of at most 1000."""
        start = 0
        while True:
            page, total = self._host_page(filter_text, start, HOSTS_PAGE)
            for host in page:
                info = _host_info(host)
                if info is not None:
                    yield info
            start += len(page)
            if len(page) < HOSTS_PAGE or (total is not None and start >= total):
                return

    def host_page(self, filter_text: str, start: int, count: int) -> HostPage:
        """Up to `count` (1-1000) hosts matching the filter from `start` on, and how many match (None unless exact).

        `total_matching` is trusted only where the answer says `exact_total_matching`: a pool's host sizes are
        counted with it (gpufarm.core.context.reads), and an estimate would count them wrong.
        """
        if start < 0 or not 1 <= count <= HOSTS_PAGE:
            raise ValidationFailed("count", f"a host page starts at 0 or later and holds 1-{HOSTS_PAGE} hosts")
        page, total = self._host_page(filter_text, start, count)
        hosts = tuple(info for info in (_host_info(h) for h in page) if info is not None)
        return HostPage(hosts, total)

    def _host_page(self, filter_text: str | None, start: int, count: int) -> tuple[list[Any], int | None]:
        """One raw page of the host list: its hosts' JSON and the exact match count (None when not exact)."""
        kwargs: dict[str, Any] = {"start": start, "count": count}
        if filter_text:
            kwargs["filter"] = filter_text
        with dc.errors("list hosts"):
            body = dc.read_json(self._hosts_raw.list_hosts(**kwargs))
        if not isinstance(body, dict) or not isinstance(body.get("host_list", []), list):
            raise UpstreamError("Datadog answered the host list with an unexpected shape")
        total = body.get("total_matching")
        exact = isinstance(total, int) and not isinstance(total, bool) and body.get("exact_total_matching") is True
        return list(body.get("host_list") or []), total if exact else None

    def get_tags(self, host: str, source: str = "user") -> list[str]:
        """Tags of one source on a host ([] when none, or when Datadog does not know the host)."""
        try:
            with dc.errors("get host tags"):
                response = self._tags.get_host_tags(host_name=_checked_host(host), source=source)
        except NotFound:
            return []
        return [str(t) for t in (dc.get(response, "tags") or [])]

    def add_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        """Append tags to a source; returns the tags Datadog answers with."""
        name = _checked_host(host)
        body = {"host": name, "tags": _checked_tags(tags)}
        with dc.errors("add host tags"):
            response = self._tags.create_host_tags(host_name=name, body=body, source=source)
        return [str(t) for t in (dc.get(response, "tags") or [])]

    def replace_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        """Replace all tags of a source; an empty list removes them (Datadog's DELETE for that source)."""
        name = _checked_host(host)
        wanted = _checked_tags(tags)
        if not wanted:
            try:
                with dc.errors("remove host tags"):
                    self._tags.delete_host_tags(host_name=name, source=source)
            except NotFound:
                pass  # nothing to remove is the state we wanted
            return []
        body = {"host": name, "tags": wanted}
        with dc.errors("replace host tags"):
            response = self._tags.update_host_tags(host_name=name, body=body, source=source)
        return [str(t) for t in (dc.get(response, "tags") or [])]

    # -- MonitorStates --------------------------------------------------------------------------------

    def group_status(self, monitor_id: int, group: Sequence[str]) -> str | None:
        """The status of the monitor's group with exactly these tags (order aside), None when unknown."""
        if isinstance(monitor_id, bool) or not isinstance(monitor_id, int) or monitor_id <= 0:
            return None
        wanted = frozenset(t.strip().lower() for t in group if t.strip())
        try:
            with dc.errors("get monitor"):
                body = dc.read_json(self._monitors_raw.get_monitor(monitor_id=monitor_id, group_states="all"))
        except NotFound:
            return None
        groups = ((body.get("state") or {}).get("groups") or {}) if isinstance(body, dict) else {}
        if not isinstance(groups, dict):
            return None
        for name, state in groups.items():
            tags = frozenset(t.strip().lower() for t in str(name).split(",") if t.strip())
            if tags == wanted and isinstance(state, dict) and isinstance(state.get("status"), str):
                return str(state["status"])
        return None

    def alerting_groups(self, monitor_tag: str) -> list[tuple[int, tuple[str, ...]]]:
        """(monitor id, group tags) of the groups in Alert among the monitors with this tag, every page."""
        out: list[tuple[int, tuple[str, ...]]] = []
        page = 0
        while True:
            with dc.errors("list monitors"):
                answer = self._monitors_raw.list_monitors(
                    group_states="alert", monitor_tags=monitor_tag, page=page, page_size=MONITORS_PAGE
                )
                body = dc.read_json(answer)
            monitors = body if isinstance(body, list) else []
            for monitor in monitors:
                out += _alerting(monitor)
            if len(monitors) < MONITORS_PAGE:
                return out
            page += 1

    # -- MetricsSink / MetricsQuery -------------------------------------------------------------------

    def submit(self, series: Sequence[MetricSeries]) -> None:
        """Submit series through API v2, gzip-compressed, in batches under Datadog's payload limits.

        Each series is checked here (`_series_json`) and sent as that JSON through the client's transport, auth,
        retries and error mapping, without the client's models (`api_client(check_input=False)`): building and
        unbuilding them for the sync's ~12,000 gauges was its largest cost (docs/datadog.md, "Sending bulk writes").
        """
        gzip_encoding = dc.build("datadog_api_client.v2.model.metric_content_encoding", "MetricContentEncoding", "gzip")
        payloads = [_series_json(s) for s in series]
        for batch in split_batches(payloads):
            with dc.errors("submit metrics"):
                dc.read_json(self._metrics_plain.submit_metrics(body={"series": batch}, content_encoding=gzip_encoding))

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        """Reduce a metrics query to one value per group (API v2 /query/scalar)."""
        if end <= start:
            raise ValidationFailed("end", "the query window must end after it starts")
        body = {
            "data": {
                "type": "scalar_request",
                "attributes": {
                    "from": _epoch_ms(start),
                    "to": _epoch_ms(end),
                    "queries": [{"data_source": "metrics", "name": "a", "query": query, "aggregator": aggregator}],
                },
            }
        }
        # A bulk read (a group per device on the Agent's pools): decoded from the JSON, not the client's models.
        with dc.errors("query metrics"):
            answer = dc.read_json(self._metrics_raw.query_scalar_data(body=body))
        data = answer.get("data") if isinstance(answer, dict) else None
        attributes = data.get("attributes") if isinstance(data, dict) else None
        columns = (attributes.get("columns") if isinstance(attributes, dict) else None) or []
        if not isinstance(columns, list):
            raise UpstreamError("Datadog answered the scalar query with an unexpected shape")
        return scalar_results([c for c in columns if isinstance(c, dict)])

    # -- EventSink ------------------------------------------------------------------------------------

    def post_event(self, event: Event) -> None:
        """Post one event to the event stream (API v1 `POST /api/v1/events`; limits in MAX_EVENT_*)."""
        body: dict[str, Any] = {
            "title": event.title[:MAX_EVENT_TITLE],
            "text": event.text[:MAX_EVENT_TEXT],
            "tags": list(event.tags),
            "alert_type": event.alert_type,
            "priority": "normal",
            "source_type_name": "gpufarm",
        }
        if event.aggregation_key:
            body["aggregation_key"] = event.aggregation_key[:MAX_EVENT_AGGREGATION_KEY]
        if event.date_happened is not None:
            body["date_happened"] = event.date_happened
        events = dc.build("datadog_api_client.v1.api.events_api", "EventsApi", self._client)
        with dc.errors("post event"):
            events.create_event(body=body)

    def timeseries(
        self, query: str, start: datetime, end: datetime, *, max_points: int = 300
    ) -> list[TimeseriesResult]:
        """A query's groups over time (API v2 /query/timeseries), the interval chosen for at most max_points."""
        if end <= start:
            raise ValidationFailed("end", "the query window must end after it starts")
        span_ms = _epoch_ms(end) - _epoch_ms(start)
        interval_ms = max(60_000, math.ceil(span_ms / max(1, max_points) / 60_000) * 60_000)
        body = {
            "data": {
                "type": "timeseries_request",
                "attributes": {
                    "from": _epoch_ms(start),
                    "to": _epoch_ms(end),
                    "interval": interval_ms,
                    "queries": [{"data_source": "metrics", "name": "a", "query": query}],
                },
            }
        }
        with dc.errors("query metrics"):
            response = self._metrics.query_timeseries_data(body=body)
        attributes = dc.plain_dict(dc.get(dc.get(response, "data"), "attributes") or {})
        return timeseries_results(attributes)


# -- conversions ----------------------------------------------------------------------------------------


def _newest_first() -> Any:
    return dc.build("datadog_api_client.v2.model.incident_search_sort_order", "IncidentSearchSortOrder", "-created")


def _search_attributes(body: Any) -> dict[str, Any]:
    """`data.attributes` of a search answer's JSON (incidents, total), checked for the shape gpufarm reads."""
    data = body.get("data") if isinstance(body, dict) else None
    attributes = data.get("attributes") if isinstance(data, dict) else None
    if not isinstance(attributes, dict) or not isinstance(attributes.get("incidents", []), list):
        raise UpstreamError("Datadog answered the incident search with an unexpected shape")
    return attributes


def _item_data(item: Any) -> dict[str, Any]:
    """The incident data object of one search result (`{"data": {...}}`)."""
    data = item.get("data") if isinstance(item, dict) else None
    if not isinstance(data, dict) or "id" not in data:
        raise UpstreamError("Datadog answered the incident search with an incident that has no id")
    return data


def _record(plain: Mapping[str, Any]) -> IncidentRecord:
    """An IncidentRecord from an incident's data object (plain JSON)."""
    attributes = plain.get("attributes") or {}
    return IncidentRecord(
        id=str(plain["id"]),
        public_id=int(attributes.get("public_id") or 0),
        title=str(attributes.get("title") or ""),
        state=attributes.get("state"),
        fields=f.decode_fields(attributes.get("fields")),
        created=attributes.get("created"),
        modified=attributes.get("modified"),
        resolved=attributes.get("resolved"),
    )


def _encode(fields: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    try:
        return f.encode_fields(fields)
    except KeyError as exc:
        name = str(exc.args[0]).split("'")[1] if "'" in str(exc.args[0]) else "fields"
        raise ValidationFailed(name, str(exc.args[0])) from None
    except TypeError as exc:
        raise ValidationFailed("fields", str(exc)) from None


def _checked_title(title: str) -> str:
    text = title.strip()
    if not text:
        raise ValidationFailed("title", "an incident needs a title")
    if any(not ch.isprintable() for ch in text):
        raise ValidationFailed("title", "the title must not contain control characters")
    return text


def _checked_host(host: str) -> str:
    name = host.strip()
    if not name or "/" in name or any(not ch.isprintable() or ch.isspace() for ch in name):
        raise ValidationFailed("host", f"{name[:60]!r} is not a host name")
    return name


def _checked_tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        raise ValidationFailed("tags", "tags must be a list of strings")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > 200:
            raise ValidationFailed("tags", f"{str(tag)[:60]!r} is not a valid tag (1-200 characters)")
        out.append(tag.strip())
    return out


def _host_info(host: Any) -> HostInfo | None:
    """A HostInfo from one host of the list (a client model, or the JSON of a raw answer)."""
    plain = host if isinstance(host, dict) else dc.plain_dict(host)
    name = plain.get("name") or plain.get("host_name")
    if not name:
        return None
    by_source = {str(k): tuple(str(t) for t in v or ()) for k, v in (plain.get("tags_by_source") or {}).items()}
    merged: list[str] = []
    for tags in by_source.values():
        merged.extend(t for t in tags if t not in merged)
    reported = plain.get("last_reported_time")
    return HostInfo(
        name=str(name),
        tags=tuple(merged),
        tags_by_source=by_source,
        last_reported=float(reported) if isinstance(reported, int | float) else None,
    )


def _epoch_ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _series_json(series: MetricSeries) -> dict[str, Any]:
    """One MetricSeries in the v2 intake shape, checked before anything is sent."""
    if not series.metric or len(series.metric) > 200 or not series.metric[0].isalpha():
        raise ValidationFailed("metric", f"{series.metric[:60]!r} is not a metric name")
    if series.type not in (0, 1, 2, 3):
        raise ValidationFailed("type", "metric type is 0 (unspecified), 1 (count), 2 (rate) or 3 (gauge)")
    if not series.points:
        raise ValidationFailed("points", f"series {series.metric} has no points")
    points = []
    for point in series.points:
        value = float(point.value)
        if not math.isfinite(value):
            raise ValidationFailed("points", f"series {series.metric} has a non-finite value")
        points.append({"timestamp": int(point.timestamp), "value": value})
    out: dict[str, Any] = {"metric": series.metric, "type": series.type, "points": points}
    if series.tags:
        out["tags"] = _checked_tags(series.tags)
    if series.host:
        out["resources"] = [{"name": _checked_host(series.host), "type": "host"}]
    if series.unit:
        out["unit"] = series.unit
    if series.interval is not None:
        out["interval"] = int(series.interval)
    return out


def _compressed_size(series: Sequence[Mapping[str, Any]]) -> int:
    return len(gzip.compress(json.dumps({"series": list(series)}).encode()))


def split_batches(series: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group series into payloads under Datadog's limits (raw size first, then checked compressed size)."""
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for item in series:
        item_size = len(json.dumps(item)) + 2
        if item_size > MAX_RAW_BATCH_BYTES:
            raise ValidationFailed("points", f"series {item['metric']} alone exceeds Datadog's payload size limit")
        if current and size + item_size > MAX_RAW_BATCH_BYTES:
            batches.append(current)
            current, size = [], 0
        current.append(item)
        size += item_size
    if current:
        batches.append(current)
    return [part for batch in batches for part in _fit_compressed(batch)]


def _fit_compressed(batch: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    if _compressed_size(batch) < MAX_COMPRESSED_BYTES:
        return [batch]
    if len(batch) == 1:
        raise ValidationFailed("points", f"series {batch[0]['metric']} alone exceeds Datadog's 512 KB payload limit")
    middle = len(batch) // 2
    return _fit_compressed(batch[:middle]) + _fit_compressed(batch[middle:])


def scalar_results(columns: Sequence[Mapping[str, Any]]) -> list[ScalarResult]:
    """Rows of a v2 scalar answer: group columns give `key:value` tags, the first number column the value."""
    groups = [c for c in columns if c.get("type") == "group"]
    numbers = [c for c in columns if c.get("type") == "number"]
    if not numbers:
        return []
    values = list(numbers[0].get("values") or [])
    # Each group column's cells read once: the answer is a row per group (per device on the Agent's pools).
    cells = [(str(c.get("name")), list(c.get("values") or [])) for c in groups]
    results: list[ScalarResult] = []
    for row, value in enumerate(values):
        tags: list[str] = []
        for name, column in cells:
            cell = column[row] if row < len(column) else []
            items = cell if isinstance(cell, list) else [cell]
            tags.extend(f"{name}:{v}" for v in items)
        results.append(ScalarResult(tuple(tags), float(value) if value is not None else None))
    return results


def timeseries_results(attributes: Mapping[str, Any]) -> list[TimeseriesResult]:
    """Groups of a v2 timeseries answer: `series[i].group_tags` with `values[i]` over the shared `times` (ms)."""
    times = [int(t) // 1000 for t in attributes.get("times") or []]
    values = list(attributes.get("values") or [])
    out: list[TimeseriesResult] = []
    for i, series in enumerate(attributes.get("series") or []):
        if not isinstance(series, Mapping):
            continue
        row = values[i] if i < len(values) and isinstance(values[i], list) else []
        points = tuple(
            MetricPoint(t, float(v))
            for t, v in zip(times, row, strict=False)
            if isinstance(v, int | float) and math.isfinite(float(v))
        )
        tags = tuple(str(t) for t in series.get("group_tags") or [])
        out.append(TimeseriesResult(tags, points))
    return out


def _alerting(monitor: Any) -> list[tuple[int, tuple[str, ...]]]:
    """(id, group tags) of a listed monitor's groups in Alert."""
    if not isinstance(monitor, dict) or not isinstance(monitor.get("id"), int):
        return []
    groups = (monitor.get("state") or {}).get("groups") or {}
    if not isinstance(groups, dict):
        return []
    return [
        (int(monitor["id"]), tuple(t.strip().lower() for t in str(name).split(",") if t.strip()))
        for name, state in groups.items()
        if isinstance(state, dict) and state.get("status") == "Alert"
    ]


if TYPE_CHECKING:

    def _implements_the_ports(
        gateway: DatadogGateway,
    ) -> tuple[IncidentStore, HostTags, HostPages, MetricsSink, MetricsQuery, MonitorStates, MetricsHistory]:
        """mypy proves here that DatadogGateway satisfies every port it is used as."""
        return gateway, gateway, gateway, gateway, gateway, gateway, gateway
