"""Datadog adapter: incidents, hosts and tags, metrics, and the setup APIs over datadog-api-client.

Request bodies are written in Datadog's documented JSON shape; the client converts and type-checks them
against its own models before anything is sent (`check_input_type`), and answers come back through its
models (`check_return_type`), converted here into gpufarm's own types. Only the API modules used here are
imported: never the aggregate `datadog_api_client.v2.models` package, which costs ~1.3 s and 93 MB
(docs/datadog.md, "Import cost").
"""

from __future__ import annotations

import gzip
import importlib
import json
import logging
import math
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

import urllib3
from datadog_api_client import ApiClient, Configuration
from datadog_api_client.exceptions import ApiException, OpenApiException

from gpufarm.config import Settings
from gpufarm.core import fields as f
from gpufarm.core.errors import Conflict, GpufarmError, NotFound, UpstreamError, ValidationFailed
from gpufarm.core.model import IncidentRecord
from gpufarm.core.ports import HostInfo, MetricSeries, ScalarResult

if TYPE_CHECKING:
    from gpufarm.core.ports import HostTags, IncidentStore, MetricsQuery, MetricsSink

log = logging.getLogger(__name__)


# Every incident operation is beta in the client and refused unless enabled (docs/datadog.md, "Three facts").
# Only the operations this adapter calls are enabled, so a new call site fails loudly until it is listed.
UNSTABLE_OPERATIONS = (
    "create_incident",
    "get_incident",
    "update_incident",
    "delete_incident",
    "search_incidents",
    "list_incident_types",
    "list_incident_user_defined_fields",
    "create_incident_user_defined_field",
    "update_incident_user_defined_field",
    "list_incident_notification_rules",
    "create_incident_notification_rule",
    "update_incident_notification_rule",
)

LIVE_QUERY = "state:(active OR stable)"
RESOLVED_QUERY = "state:resolved"
ANY_STATE_QUERY = "state:(active OR stable OR resolved)"
SEARCH_PAGE = 100  # Datadog's maximum page[size] for incidents
HOSTS_PAGE = 1000  # Datadog's maximum `count` for the hosts list
FIELDS_PAGE = 1000  # maximum page[size] for user-defined fields
MONITORS_PAGE = 1000  # page_size for the monitors list (unpaged when `page` is absent)

# Series payload limits: 512,000 bytes compressed, 5,242,880 decompressed (docs/datadog.md, "Metrics").
# Batches aim well below both so the client's own compression (same zlib level) never crosses them.
MAX_COMPRESSED_BYTES = 500_000
MAX_RAW_BATCH_BYTES = 3_000_000

# Statuses after which nothing was created: safe to send the same create again.
_REJECTED_STATUSES = frozenset({408, 429})
_ERROR_TEXT_LIMIT = 300


def _quiet_unstable_warnings() -> None:
    """Ignore the client's 'Using unstable operation' UserWarning: the operations are enabled on purpose."""
    # It fires on every call (and fails `-W error` runs). Re-adding an identical filter replaces it, so
    # calling this per gateway never grows the filter list.
    warnings.filterwarnings(
        "ignore",
        message=r"Using unstable operation",
        category=UserWarning,
        module=r"datadog_api_client\.api_client",
    )


@dataclass(frozen=True)
class _Outcome:
    """How a failed call ended, classified once for error mapping and create's retry decision."""

    status: int | None
    message: str
    transient: bool
    # True when the server certainly did not act on the request (refused before handling it).
    not_applied: bool


class DatadogGateway:
    """IncidentStore, HostTags, MetricsSink and MetricsQuery over Datadog, plus setup-object CRUD."""

    def __init__(
        self,
        settings: Settings,
        *,
        create_attempts: int | None = None,
        create_backoff_s: float = 0.5,
        request_id_scan: int = 50,
        search_page_size: int = SEARCH_PAGE,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if settings.datadog_api_key is None:
            raise ValidationFailed("datadog_api_key", "set GPUFARM_DATADOG_API_KEY (or DD_API_KEY) to reach Datadog")
        _quiet_unstable_warnings()
        self.settings = settings
        self.base_url = settings.datadog_base_url()
        # Our own create loop: 1 try plus settings.max_retries more, each preceded by a request_id re-check.
        self.create_attempts = max(1, create_attempts if create_attempts is not None else settings.max_retries + 1)
        self.create_backoff_s = create_backoff_s
        # How many of the newest incidents find_by_request_id looks through: a retried create or a duplicate
        # Slack hand-off comes seconds to minutes after the first, when few incidents (GPU requests arrive at
        # human pace) can have been created in between. One page keeps each create to one extra read.
        self.request_id_scan = max(1, request_id_scan)
        self.search_page_size = max(1, min(SEARCH_PAGE, search_page_size))
        self._sleep = sleep
        self._client = ApiClient(self._configuration(retry=True))
        # Retries off: the client would retry POST after a 5xx and could create a second incident
        # (docs/datadog.md, "The client"); create() retries itself after re-checking.
        self._create_client = ApiClient(self._configuration(retry=False))

    def _configuration(self, *, retry: bool) -> Any:
        s = self.settings
        # The client's constructor is untyped; the Any alias keeps mypy strict everywhere else.
        configuration: Any = Configuration
        cfg = configuration(
            host=self.base_url,
            request_timeout=(min(5.0, s.http_timeout), s.http_timeout),
            enable_retry=retry and s.max_retries > 0,
            max_retries=s.max_retries,
            retry_backoff_factor=2,  # the client refuses factors below 2
        )
        assert s.datadog_api_key is not None
        cfg.api_key["apiKeyAuth"] = s.datadog_api_key.get_secret_value()
        if s.datadog_app_key is not None:
            cfg.api_key["appKeyAuth"] = s.datadog_app_key.get_secret_value()
        for operation in UNSTABLE_OPERATIONS:
            cfg.unstable_operations[operation] = True
        return cfg

    def close(self) -> None:
        """Release the HTTP connection pools."""
        self._client.close()
        self._create_client.close()

    # -- API objects, built on first use (each API module imports its own models only) ---------------

    @cached_property
    def _incidents(self) -> Any:
        return _build("datadog_api_client.v2.api.incidents_api", "IncidentsApi", self._client)

    @cached_property
    def _incidents_no_retry(self) -> Any:
        return _build("datadog_api_client.v2.api.incidents_api", "IncidentsApi", self._create_client)

    @cached_property
    def _hosts(self) -> Any:
        return _build("datadog_api_client.v1.api.hosts_api", "HostsApi", self._client)

    @cached_property
    def _tags(self) -> Any:
        return _build("datadog_api_client.v1.api.tags_api", "TagsApi", self._client)

    @cached_property
    def _metrics(self) -> Any:
        return _build("datadog_api_client.v2.api.metrics_api", "MetricsApi", self._client)

    @cached_property
    def _webhooks(self) -> Any:
        return _build("datadog_api_client.v1.api.webhooks_integration_api", "WebhooksIntegrationApi", self._client)

    @cached_property
    def _monitors(self) -> Any:
        return _build("datadog_api_client.v1.api.monitors_api", "MonitorsApi", self._client)

    @cached_property
    def _dashboards(self) -> Any:
        return _build("datadog_api_client.v1.api.dashboards_api", "DashboardsApi", self._client)

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
                with self._translate("create incident"):
                    response = self._incidents_no_retry.create_incident(body=body)
                return _record(response.data)
            except _Failed as failed:
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

    def get(self, incident_id: str) -> IncidentRecord:
        """Fetch by UUID; raises NotFound."""
        with self._errors("get incident"):
            response = self._incidents.get_incident(incident_id=incident_id)
        return _record(response.data)

    def get_by_ir(self, ir: int) -> IncidentRecord:
        """Fetch by incident number (public_id); raises NotFound."""
        # The API's incident path takes the UUID (public_id is unconfirmed; docs/datadog.md, "Incidents (v2)"),
        # so this searches: live incidents first (few, and the usual target), then resolved ones newest first,
        # stopping once the numbers drop below the one asked for (public_id grows with creation time).
        if isinstance(ir, bool) or not isinstance(ir, int) or ir <= 0:
            raise ValidationFailed("ir", "an incident number is a positive integer")
        for record in self.search(LIVE_QUERY):
            if record.public_id == ir:
                return record
        for record in self.search(RESOLVED_QUERY, newest_first=True):
            if record.public_id == ir:
                return record
            if record.public_id < ir:
                break
        raise NotFound(f"IR-{ir} does not exist")

    def update(self, incident_id: str, fields: Mapping[str, object], *, title: str | None = None) -> IncidentRecord:
        """Write some fields (plain values); others are left as they are."""
        attributes: dict[str, Any] = {}
        if fields:
            attributes["fields"] = _encode(fields)
        if title is not None:
            attributes["title"] = _checked_title(title)
        if not attributes:
            return self.get(incident_id)
        body = {"data": {"id": incident_id, "type": "incidents", "attributes": attributes}}
        with self._errors("update incident"):
            response = self._incidents.update_incident(incident_id=incident_id, body=body)
        return _record(response.data)

    def delete(self, incident_id: str) -> None:
        """Delete an incident (tests and cleanup; allocations end by resolving, never by deleting)."""
        with self._errors("delete incident"):
            self._incidents.delete_incident(incident_id=incident_id)

    def search(self, query: str, *, newest_first: bool = False) -> Iterator[IncidentRecord]:
        """Incidents matching a Datadog incident search query, every page (newest first when asked)."""
        kwargs: dict[str, Any] = {"query": query, "page_size": self.search_page_size}
        if newest_first:
            kwargs["sort"] = _newest_first()
        yield from self._search_pages(kwargs, limit=None)

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        """The incident created for a Slack request, so a retried create never makes a second one."""
        # Search by a custom field is unconfirmed (docs/datadog.md, "Incidents (v2)"), so this reads the newest
        # incidents in any state (`request_id_scan` of them) and compares the field itself.
        kwargs: dict[str, Any] = {
            "query": ANY_STATE_QUERY,
            "page_size": min(self.search_page_size, self.request_id_scan),
            "sort": _newest_first(),
        }
        for record in self._search_pages(kwargs, limit=self.request_id_scan):
            if record.fields.get(f.REQUEST_ID) == request_id:
                return record
        return None

    def _search_pages(self, kwargs: dict[str, Any], *, limit: int | None) -> Iterator[IncidentRecord]:
        offset = 0
        seen = 0
        while True:
            with self._errors("search incidents"):
                response = self._incidents.search_incidents(page_offset=offset, **kwargs)
            attributes = response.data.attributes
            page = list(attributes.incidents or [])
            for item in page:
                yield _record(item.data)
                seen += 1
                if limit is not None and seen >= limit:
                    return
            offset += len(page)
            total = _get(attributes, "total")
            # Stop on a short page, as the client's own pagination does, or once `total` is reached.
            if len(page) < kwargs["page_size"] or (isinstance(total, int) and offset >= total):
                return

    # -- HostTags -------------------------------------------------------------------------------------

    def list_hosts(self, filter_text: str | None = None) -> Iterator[HostInfo]:
        """Every host matching the filter, across pages of at most 1000."""
        start = 0
        while True:
            kwargs: dict[str, Any] = {"start": start, "count": HOSTS_PAGE}
            if filter_text:
                kwargs["filter"] = filter_text
            with self._errors("list hosts"):
                response = self._hosts.list_hosts(**kwargs)
            page = list(_get(response, "host_list") or [])
            for host in page:
                info = _host_info(host)
                if info is not None:
                    yield info
            start += len(page)
            total = _get(response, "total_matching")
            if len(page) < HOSTS_PAGE or (isinstance(total, int) and start >= total):
                return

    def get_tags(self, host: str, source: str = "user") -> list[str]:
        """Tags of one source on a host ([] when none, or when Datadog does not know the host)."""
        try:
            with self._errors("get host tags"):
                response = self._tags.get_host_tags(host_name=_checked_host(host), source=source)
        except NotFound:
            return []
        return [str(t) for t in (_get(response, "tags") or [])]

    def add_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        """Append tags to a source; returns the tags Datadog answers with."""
        name = _checked_host(host)
        body = {"host": name, "tags": _checked_tags(tags)}
        with self._errors("add host tags"):
            response = self._tags.create_host_tags(host_name=name, body=body, source=source)
        return [str(t) for t in (_get(response, "tags") or [])]

    def replace_tags(self, host: str, tags: Sequence[str], source: str = "user") -> list[str]:
        """Replace all tags of a source; an empty list removes them (Datadog's DELETE for that source)."""
        name = _checked_host(host)
        wanted = _checked_tags(tags)
        if not wanted:
            try:
                with self._errors("remove host tags"):
                    self._tags.delete_host_tags(host_name=name, source=source)
            except NotFound:
                pass  # nothing to remove is the state we wanted
            return []
        body = {"host": name, "tags": wanted}
        with self._errors("replace host tags"):
            response = self._tags.update_host_tags(host_name=name, body=body, source=source)
        return [str(t) for t in (_get(response, "tags") or [])]

    # -- MetricsSink / MetricsQuery -------------------------------------------------------------------

    def submit(self, series: Sequence[MetricSeries]) -> None:
        """Submit series through API v2, gzip-compressed, in batches under Datadog's payload limits."""
        gzip_encoding = _build("datadog_api_client.v2.model.metric_content_encoding", "MetricContentEncoding", "gzip")
        payloads = [_series_json(s) for s in series]
        for batch in split_batches(payloads):
            with self._errors("submit metrics"):
                self._metrics.submit_metrics(body={"series": batch}, content_encoding=gzip_encoding)

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
        with self._errors("query metrics"):
            response = self._metrics.query_scalar_data(body=body)
        columns = list(_get(_get(_get(response, "data"), "attributes"), "columns") or [])
        return scalar_results([_plain_dict(c) for c in columns])

    # -- Incident setup: types, user-defined fields, notification rules --------------------------------

    def list_incident_types(self) -> list[dict[str, Any]]:
        """Incident types of the organization (`id`, `attributes.name`, `attributes.is_default`)."""
        with self._errors("list incident types"):
            response = self._incidents.list_incident_types()
        return [_plain_dict(item) for item in (_get(response, "data") or [])]

    def list_field_definitions(self) -> list[dict[str, Any]]:
        """Every incident user-defined field (`id`, `attributes{name,type,display_name,valid_values...}`)."""
        out: list[dict[str, Any]] = []
        page = 0
        while True:
            with self._errors("list incident fields"):
                response = self._incidents.list_incident_user_defined_fields(page_size=FIELDS_PAGE, page_number=page)
            items = [_plain_dict(item) for item in (_get(response, "data") or [])]
            out.extend(items)
            if len(items) < FIELDS_PAGE:
                return out
            page += 1

    def create_field_definition(self, attributes: Mapping[str, Any], incident_type_id: str) -> dict[str, Any]:
        """Define a custom incident field on an incident type."""
        body = {
            "data": {
                "type": "user_defined_field",
                "attributes": dict(attributes),
                "relationships": {"incident_type": {"data": {"id": incident_type_id, "type": "incident_types"}}},
            }
        }
        with self._errors("create incident field"):
            response = self._incidents.create_incident_user_defined_field(body=body)
        return _plain_dict(response.data)

    def update_field_definition(self, field_id: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Change a custom incident field's display name, choices or collection settings."""
        body = {"data": {"id": field_id, "type": "user_defined_field", "attributes": dict(attributes)}}
        with self._errors("update incident field"):
            response = self._incidents.update_incident_user_defined_field(field_id=field_id, body=body)
        return _plain_dict(response.data)

    def list_notification_rules(self) -> list[dict[str, Any]]:
        """Incident notification rules (`id`, `attributes{trigger,conditions,handles,renotify_on,...}`)."""
        with self._errors("list notification rules"):
            response = self._incidents.list_incident_notification_rules()
        return [_plain_dict(item) for item in (_get(response, "data") or [])]

    def create_notification_rule(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Create an incident notification rule."""
        body = {"data": {"type": "incident_notification_rules", "attributes": dict(attributes)}}
        with self._errors("create notification rule"):
            response = self._incidents.create_incident_notification_rule(body=body)
        return _plain_dict(response.data)

    def update_notification_rule(self, rule_id: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Replace an incident notification rule (PUT semantics: send every attribute)."""
        try:
            rule_uuid = uuid.UUID(str(rule_id))
        except ValueError:
            raise ValidationFailed("rule_id", f"{str(rule_id)[:60]!r} is not a notification rule id") from None
        body = {"data": {"id": rule_uuid, "type": "incident_notification_rules", "attributes": dict(attributes)}}
        with self._errors("update notification rule"):
            response = self._incidents.update_incident_notification_rule(id=rule_uuid, body=body)
        return _plain_dict(response.data)

    # -- Webhooks integration -------------------------------------------------------------------------

    def get_webhook(self, name: str) -> dict[str, Any] | None:
        """A webhook of the Webhooks integration, or None."""
        try:
            with self._errors("get webhook"):
                response = self._webhooks.get_webhooks_integration(webhook_name=name)
        except NotFound:
            return None
        return _plain_dict(response)

    def create_webhook(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a webhook (`name`, `url`, `payload`, `custom_headers`, `encode_as`)."""
        with self._errors("create webhook", caller_body=True):
            response = self._webhooks.create_webhooks_integration(body=dict(spec))
        return _plain_dict(response)

    def update_webhook(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Update a webhook's URL, payload, headers or encoding."""
        with self._errors("update webhook", caller_body=True):
            response = self._webhooks.update_webhooks_integration(webhook_name=name, body=dict(spec))
        return _plain_dict(response)

    def get_custom_variable(self, name: str) -> dict[str, Any] | None:
        """A webhooks custom variable (a secret one comes back without its value), or None."""
        try:
            with self._errors("get custom variable"):
                response = self._webhooks.get_webhooks_integration_custom_variable(custom_variable_name=name)
        except NotFound:
            return None
        return _plain_dict(response)

    def create_custom_variable(self, name: str, value: str, *, is_secret: bool) -> dict[str, Any]:
        """Create a webhooks custom variable; the answer never carries a secret value back to callers."""
        body = {"name": name, "value": value, "is_secret": is_secret}
        with self._errors("create custom variable"):
            response = self._webhooks.create_webhooks_integration_custom_variable(body=body)
        return _without_secret(_plain_dict(response))

    def update_custom_variable(self, name: str, value: str, *, is_secret: bool) -> dict[str, Any]:
        """Set a webhooks custom variable's value and secrecy."""
        body = {"value": value, "is_secret": is_secret}
        with self._errors("update custom variable"):
            response = self._webhooks.update_webhooks_integration_custom_variable(custom_variable_name=name, body=body)
        return _without_secret(_plain_dict(response))

    # -- Monitors and dashboards ----------------------------------------------------------------------

    def list_monitors(self, *, name: str | None = None, monitor_tags: str | None = None) -> list[dict[str, Any]]:
        """Monitors, optionally filtered by name substring and monitor tags, every page."""
        out: list[dict[str, Any]] = []
        page = 0
        while True:
            kwargs: dict[str, Any] = {"page": page, "page_size": MONITORS_PAGE}
            if name:
                kwargs["name"] = name
            if monitor_tags:
                kwargs["monitor_tags"] = monitor_tags
            with self._errors("list monitors"):
                response = self._monitors.list_monitors(**kwargs)
            items = [_plain_dict(m) for m in (response or [])]
            out.extend(items)
            if len(items) < MONITORS_PAGE:
                return out
            page += 1

    def create_monitor(self, monitor: Mapping[str, Any]) -> dict[str, Any]:
        """Create a monitor (Datadog's v1 monitor JSON)."""
        with self._errors("create monitor", caller_body=True):
            response = self._monitors.create_monitor(body=dict(monitor))
        return _plain_dict(response)

    def update_monitor(self, monitor_id: int, monitor: Mapping[str, Any]) -> dict[str, Any]:
        """Update a monitor in place (its id and history are kept)."""
        with self._errors("update monitor", caller_body=True):
            response = self._monitors.update_monitor(monitor_id=monitor_id, body=dict(monitor))
        return _plain_dict(response)

    def validate_monitor(self, monitor: Mapping[str, Any]) -> None:
        """Ask Datadog whether a monitor definition is valid; raises ValidationFailed with its reasons."""
        with self._errors("validate monitor", caller_body=True):
            self._monitors.validate_monitor(body=dict(monitor))

    def list_dashboards(self) -> list[dict[str, Any]]:
        """Summaries of the custom dashboards (`id`, `title`, `url`, ...)."""
        with self._errors("list dashboards"):
            response = self._dashboards.list_dashboards()
        return [_plain_dict(d) for d in (_get(response, "dashboards") or [])]

    def create_dashboard(self, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """Create a dashboard (Datadog's v1 dashboard JSON)."""
        with self._errors("create dashboard", caller_body=True):
            response = self._dashboards.create_dashboard(body=dict(dashboard))
        return _plain_dict(response)

    def update_dashboard(self, dashboard_id: str, dashboard: Mapping[str, Any]) -> dict[str, Any]:
        """Replace a dashboard's definition, keeping its id and URL."""
        with self._errors("update dashboard", caller_body=True):
            response = self._dashboards.update_dashboard(dashboard_id=dashboard_id, body=dict(dashboard))
        return _plain_dict(response)

    # -- error translation ----------------------------------------------------------------------------

    @contextmanager
    def _errors(self, what: str, *, caller_body: bool = False) -> Iterator[None]:
        """Run a client call, raising gpufarm errors instead of client or urllib3 exceptions.

        caller_body: the request body is JSON a caller wrote (monitors, dashboards, webhooks); the client's
        models answer a missing required key with a plain TypeError, which then means "bad body".
        """
        try:
            with self._translate(what, caller_body=caller_body):
                yield
        except _Failed as failed:
            raise failed.error() from None

    @contextmanager
    def _translate(self, what: str, *, caller_body: bool = False) -> Iterator[None]:
        try:
            yield
        except GpufarmError:
            raise
        except ApiException as exc:
            raise _Failed(what, _api_outcome(exc)) from None
        except OpenApiException as exc:
            # Raised before sending (a body the client's models reject) or on an answer that does not fit
            # them; the client's messages name types and paths, not values.
            raise _Failed(what, _Outcome(None, _short(str(exc)), transient=False, not_applied=True)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise _Failed(what, _transport_outcome(exc)) from None
        except TypeError as exc:
            # After OpenApiException on purpose: the client's ApiTypeError is a TypeError too.
            if not caller_body:
                raise
            raise _Failed(what, _Outcome(None, _short(str(exc)), transient=False, not_applied=True)) from None


class _Failed(Exception):
    """Internal: a classified failure of one call (converted to a gpufarm error at the boundary)."""

    def __init__(self, what: str, outcome: _Outcome) -> None:
        super().__init__(what)
        self.what = what
        self.outcome = outcome

    def error(self) -> GpufarmError:
        """The gpufarm error for this failure."""
        o = self.outcome
        text = f"Datadog {self.what} failed: {o.message}"
        if o.status is None:
            if o.transient:
                return UpstreamError(text)
            return ValidationFailed("datadog", text)
        if o.status == 404:
            return NotFound(text)
        if o.status == 409:
            return Conflict(text)
        if o.status in (401, 403):
            return UpstreamError(f"{text} (check the Datadog API and application keys)")
        if o.transient or o.status >= 500:
            return UpstreamError(text)
        return ValidationFailed("datadog", text)


def _api_outcome(exc: ApiException) -> _Outcome:
    status = exc.status if isinstance(exc.status, int) else None
    message = _datadog_message(exc.body) or (exc.reason if isinstance(exc.reason, str) else "") or "no details"
    if status is not None:
        message = f"HTTP {status}: {message}"
    if status is None or status == 0:
        return _Outcome(None, _short(message), transient=True, not_applied=False)
    transient = status in _REJECTED_STATUSES or status >= 500
    return _Outcome(status, _short(message), transient=transient, not_applied=status in _REJECTED_STATUSES)


def _transport_outcome(exc: urllib3.exceptions.HTTPError) -> _Outcome:
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason else exc
    if isinstance(reason, urllib3.exceptions.ResponseError):
        # Retries used up on 5xx/429 answers: the message names the status ("too many 503 error responses").
        return _Outcome(None, _short(f"gave up after retries: {reason}"), transient=True, not_applied=False)
    refused = isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError)
    kind = "could not connect" if refused else "no answer in time" if _is_timeout(reason) else "connection failed"
    return _Outcome(None, f"{kind} ({type(reason).__name__})", transient=True, not_applied=refused)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError)


def _datadog_message(body: Any) -> str:
    """Datadog's `{"errors": [...]}` (strings or {title, detail}) as one line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return str(body).strip()
    if isinstance(body, Mapping):
        errors = body.get("errors")
        if isinstance(errors, list):
            parts = []
            for item in errors:
                if isinstance(item, Mapping):
                    parts.append(" - ".join(str(item[k]) for k in ("title", "detail") if item.get(k)))
                else:
                    parts.append(str(item))
            return "; ".join(p for p in parts if p)
    return ""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_LIMIT else text[: _ERROR_TEXT_LIMIT - 3] + "..."


# -- conversions ----------------------------------------------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    """An attribute of a client model (or a key of a dict), None when unset."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    try:
        return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)
    except (AttributeError, KeyError):
        return None


def _plain(obj: Any) -> Any:
    """A client model (or list/dict of them) as JSON-ready plain data with Datadog's key names."""
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    return obj


def _plain_dict(obj: Any) -> dict[str, Any]:
    """_plain for a single object answer."""
    plain = _plain(obj)
    if not isinstance(plain, dict):
        raise UpstreamError(f"Datadog answered with {type(plain).__name__} where an object was expected")
    return plain


def _build(module: str, name: str, *args: Any) -> Any:
    """Instantiate a client class from its own module (never the aggregate models package)."""
    cls: Any = getattr(importlib.import_module(module), name)
    return cls(*args)


def _newest_first() -> Any:
    return _build("datadog_api_client.v2.model.incident_search_sort_order", "IncidentSearchSortOrder", "-created")


def _record(data: Any) -> IncidentRecord:
    """An IncidentRecord from the client's incident data model."""
    plain = _plain_dict(data)
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
    plain = _plain_dict(host)
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
    results: list[ScalarResult] = []
    for row, value in enumerate(values):
        tags: list[str] = []
        for column in groups:
            cells = list(column.get("values") or [])
            cell = cells[row] if row < len(cells) else []
            items = cell if isinstance(cell, list) else [cell]
            tags.extend(f"{column.get('name')}:{v}" for v in items)
        results.append(ScalarResult(tuple(tags), float(value) if value is not None else None))
    return results


def _without_secret(variable: dict[str, Any]) -> dict[str, Any]:
    if variable.get("is_secret"):
        variable.pop("value", None)
    return variable


if TYPE_CHECKING:

    def _implements_the_ports(gateway: DatadogGateway) -> tuple[IncidentStore, HostTags, MetricsSink, MetricsQuery]:
        """mypy proves here that DatadogGateway satisfies every port it is used as."""
        return gateway, gateway, gateway, gateway
