"""Datadog runtime gateway: gpufarm's incidents, hosts and tags, monitor states, metrics and events, the handlers'
collaborators over datadog-api-client.

Request bodies are written in Datadog's documented JSON shape; the client converts and type-checks them
against its own models before anything is sent (`check_input_type`), except the metric series, checked here and
sent as that JSON (docs/datadog.md, "Sending bulk writes"). Single answers come back through its
models (`check_return_type`), converted here into gpufarm's own types; bulk reads (the host list, monitor groups,
scalar queries) are decoded from their JSON here, because building the client's model graph for them costs ~40x
the fetch (docs/datadog.md, "Decoding bulk reads"). The incidents (gpufarm's own incident type only) are
`gpufarm.adapters.datadog_incidents`, which this gateway extends; setup-time administration (incident types, field
definitions, notification rules, webhooks, monitors, dashboards) is `gpufarm.adapters.datadog_admin`; the client
configuration and error mapping they all use live in `gpufarm.adapters.datadog_client`.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpufarm.adapters import datadog_client as dc
from gpufarm.adapters import timeseries_query as tq

# The queries and the store are datadog_incidents'; importers of the gateway read them here too.
from gpufarm.adapters.datadog_incidents import DatadogIncidents
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.ports import (
    Event,
    HostInfo,
    HostPage,
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

# Tag-source keys of the host list seen spelled other than in lower case (logged once per container).
_SPELLINGS_SEEN: set[str] = set()
HOSTS_PAGE = 1000  # Datadog's maximum `count` for the hosts list
MONITORS_PAGE = 1000  # page_size for the monitors list

# Series payload limits: 512,000 bytes compressed, 5,242,880 decompressed (docs/datadog.md, "Metrics").
# Batches aim well below both so the client's own compression (same zlib level) never crosses them.
MAX_COMPRESSED_BYTES = 500_000
MAX_RAW_BATCH_BYTES = 3_000_000
# Event limits (API v1 events): text 4,000 characters, aggregation key 100; a title is kept to one short line.
MAX_EVENT_TITLE = 200
MAX_EVENT_TEXT = 4000
MAX_EVENT_AGGREGATION_KEY = 100


class DatadogGateway(DatadogIncidents):
    """What the handlers use at run time: gpufarm's incidents (DatadogIncidents), hosts and their tags, monitor
    states, metrics and events, over one set of clients with one rate-limit gate."""

    def close(self) -> None:
        """Release the HTTP connection pools."""
        super().close()
        if "_plain_client" in self.__dict__:
            self._plain_client.close()

    @cached_property
    def _plain_client(self) -> Any:
        # The series as plain JSON: same keys, timeouts and retries, no model built from them (submit checks them).
        return dc.api_client(self.settings, retry=True, raw=True, check_input=False, **self._limits)

    # -- API objects, built on first use (each API module imports its own models only) ---------------

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

    def listed_sources(self, host: str) -> dict[str, tuple[str, ...]] | None:
        """The host list's `tags_by_source` for exactly that host, its keys spelled as Datadog spells them (the other
        reads lower-case them); None when the list does not show the host. For `gpufarm doctor`."""
        name = _checked_host(host)
        page, _ = self._host_page(name, 0, HOSTS_PAGE)
        for raw in page:
            if isinstance(raw, dict) and (raw.get("name") or raw.get("host_name")) == name:
                listed = raw.get("tags_by_source")
                by_source = listed if isinstance(listed, dict) else {}
                return {str(k): tuple(str(t) for t in tags or ()) for k, tags in by_source.items()}
        return None

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
        return _group_status(body, wanted)

    def alerting_groups(self, monitor_tag: str, *, excluding: str | None = None) -> list[tuple[int, tuple[str, ...]]]:
        """(monitor id, group tags) of the groups in Alert among the monitors with this tag and without `excluding`
        (read from each listed monitor's tags), every page."""
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
                if excluding is None or excluding not in _monitor_tags(monitor):
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
        The content encoding goes as its plain value too, so no model of the client is built on the way.
        """
        payloads = [_series_json(s) for s in series]
        for batch in split_batches(payloads):
            with dc.errors("submit metrics"):
                dc.read_json(self._metrics_plain.submit_metrics(body={"series": batch}, content_encoding="gzip"))

    def scalar(self, query: str, start: datetime, end: datetime, aggregator: str = "avg") -> list[ScalarResult]:
        """Reduce a metrics query to one value per group (API v2 /query/scalar)."""
        if end <= start:
            raise ValidationFailed("end", "the query window must end after it starts")
        body = {
            "data": {
                "type": "scalar_request",
                "attributes": {
                    "from": tq.epoch_ms(start),
                    "to": tq.epoch_ms(end),
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
        body = tq.request_body(query, start, end, max_points)
        with dc.errors("query metrics"):
            response = self._metrics.query_timeseries_data(body=body)
        attributes = dc.plain_dict(dc.get(dc.get(response, "data"), "attributes") or {})
        return tq.timeseries_results(attributes)


# -- conversions ----------------------------------------------------------------------------------------


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
    by_source = _by_source(plain.get("tags_by_source"))
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


def _by_source(listed: Any) -> dict[str, tuple[str, ...]]:
    """The host list's tags per source, keyed by the source's name in lower case.

    gpufarm writes its tags with source `user`; how the host list spells that source's key is not documented (the
    tags API's own answers say `user`, recorded host lists capitalise sources). Keys are matched case-insensitively,
    and a spelling other than the one written is logged once per container.
    """
    by_source: dict[str, tuple[str, ...]] = {}
    for key, tags in (listed or {}).items() if isinstance(listed, Mapping) else ():
        name = str(key)
        if name.lower() != name and name not in _SPELLINGS_SEEN:
            _SPELLINGS_SEEN.add(name)
            log.warning("the host list names tag source %r; gpufarm reads it as %r", name[:40], name.lower()[:40])
        known = by_source.get(name.lower(), ())
        by_source[name.lower()] = known + tuple(str(t) for t in tags or () if str(t) not in known)
    return by_source


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


def _group_tags(name: object) -> tuple[str, ...]:
    """A monitor group's tags from its name (`env:hpc,ir:ir-12`), trimmed and lower-cased."""
    return tuple(t.strip().lower() for t in str(name).split(",") if t.strip())


def _group_status(monitor: Any, wanted: frozenset[str]) -> str | None:
    """The status of a monitor's group with exactly these tags, from the monitor's JSON (None when not there)."""
    groups = ((monitor.get("state") or {}).get("groups") or {}) if isinstance(monitor, dict) else {}
    if not isinstance(groups, dict):
        return None
    for name, state in groups.items():
        if frozenset(_group_tags(name)) == wanted and isinstance(state, dict) and isinstance(state.get("status"), str):
            return str(state["status"])
    return None


def _monitor_tags(monitor: Any) -> list[str]:
    tags = monitor.get("tags") if isinstance(monitor, dict) else None
    return [str(t) for t in tags] if isinstance(tags, list) else []


def _alerting(monitor: Any) -> list[tuple[int, tuple[str, ...]]]:
    """(id, group tags) of a listed monitor's groups in Alert."""
    if not isinstance(monitor, dict) or not isinstance(monitor.get("id"), int):
        return []
    groups = (monitor.get("state") or {}).get("groups") or {}
    if not isinstance(groups, dict):
        return []
    return [
        (int(monitor["id"]), _group_tags(name))
        for name, state in groups.items()
        if isinstance(state, dict) and state.get("status") == "Alert"
    ]


if TYPE_CHECKING:

    def _implements_the_ports(
        gateway: DatadogGateway,
    ) -> tuple[IncidentStore, HostTags, HostPages, MetricsSink, MetricsQuery, MonitorStates, MetricsHistory]:
        """mypy proves here that DatadogGateway satisfies every port it is used as."""
        return gateway, gateway, gateway, gateway, gateway, gateway, gateway
