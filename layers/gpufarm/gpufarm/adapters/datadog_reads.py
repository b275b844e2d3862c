"""gpufarm's leases read from Datadog over plain HTTP, as the light record reports need (the LeaseReads port).

A report reads every live lease and a month's ended ones: thousands of incidents, 30 pages or more. The incident store
(gpufarm.adapters.datadog_incidents) reads them through datadog-api-client and decodes each into an IncidentRecord; this
reader sends the same searches through urllib3 alone and decodes each incident straight into a LeaseFacts
(gpufarm.core.kernel.lease_facts), so a report imports neither the client library nor a model per incident. Everything
else is the store's: the same keys, timeouts, retry and rate-limit policy and gate (gpufarm.adapters.datadog_http), the
same type lookup, the same searches and facet fallback (gpufarm.adapters.incident_search), the same check that every
incident is of gpufarm's type and matches the query. It also answers a report's one metrics query (the pools' capacity,
gpufarm.reporting.capacity) the same way: the gateway's request body and bounded reading
(gpufarm.adapters.timeseries_query) over the same connection, policy and gate.

Every value from Datadog is bounded before use: an answer that is not a search page fails the read
(UpstreamError); an incident that is not an object, has no id or no whole IR number is skipped and said once per
reader; each field is decoded as the lifecycle decodes it (a malformed value reads as its safe default).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import urllib3

from gpufarm import __version__
from gpufarm.adapters import datadog_http as dh
from gpufarm.adapters import timeseries_query as tq
from gpufarm.adapters.incident_search import (
    SEARCH_PAGE,
    Attempt,
    Facet,
    FacetMemory,
    ignored,
    search_attributes,
    search_pages,
    type_id_named,
)
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.core.kernel.field_values import parse_time
from gpufarm.core.kernel.lease_facts import LeaseFacts
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.ports import TimeseriesResult
from gpufarm.core.kernel.search import IncidentQuery

if TYPE_CHECKING:
    from gpufarm.core.kernel.ports import LeaseReads, MetricsHistory

log = logging.getLogger(__name__)

# The largest IR number taken as one (Datadog's public ids are small whole numbers).
MAX_IR = 10**12
# What `_lease` answers for an incident of gpufarm's the query does not ask for.
NOT_ASKED = LeaseFacts(0, State.RESOLVED, Phase.REQUESTED)


class DatadogLeaseReads:
    """LeaseReads over Datadog's incident search, gpufarm's incident type only (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        incident_type_id: str | None = None,
        search_page_size: int = SEARCH_PAGE,
        rate_limit_wait_s: float = dh.RATE_LIMIT_WAIT_S,
        rate_limit_retries: int = dh.RATE_LIMIT_RETRIES,
    ) -> None:
        dh.require_api_key(settings)
        assert settings.datadog_api_key is not None
        self.base_url = settings.datadog_base_url().rstrip("/")
        self.incident_type_name = settings.incident_type
        self._type_id = incident_type_id or settings.incident_type_id
        self.search_page_size = max(1, min(SEARCH_PAGE, search_page_size))
        self.facets = FacetMemory()
        self.rate_limits = dh.RateLimitGate(max_wait_s=rate_limit_wait_s)
        self.skipped = 0
        headers = {
            "Accept": "application/json",
            "User-Agent": f"gpufarm/{__version__}",
            "DD-API-KEY": settings.datadog_api_key.get_secret_value(),
        }
        if settings.datadog_app_key is not None:
            headers["DD-APPLICATION-KEY"] = settings.datadog_app_key.get_secret_value()
        policy = dh.retry_policy(
            settings, retry=True, rate_limit_wait_s=rate_limit_wait_s, rate_limit_retries=rate_limit_retries
        )
        timeout = urllib3.Timeout(connect=min(5.0, settings.http_timeout), read=settings.http_timeout)
        self._http = urllib3.PoolManager(headers=headers, retries=policy, timeout=timeout)

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._http.clear()

    @property
    def incident_type_id(self) -> str:
        """The id of gpufarm's incident type (looked up by name once, then kept)."""
        if self._type_id is None:
            try:
                body = self._get("/api/v2/incidents/config/types", {})
            except dh.Failed as failed:
                raise failed.error() from None
            types = body.get("data") if isinstance(body, dict) else None
            if not isinstance(types, list):
                raise UpstreamError("Datadog answered the incident types with an unexpected shape")
            self._type_id = type_id_named(types, self.incident_type_name)
            log.info("gpufarm incident type %r is %s", self.incident_type_name, self._type_id)
        return self._type_id

    def lease_facts(self, query: IncidentQuery) -> Iterator[LeaseFacts]:
        """gpufarm's incidents the query matches, every page, as LeaseFacts, whatever Datadog does with the facets."""
        page_size = self.search_page_size

        def fetch(text: str, offset: int) -> dict[str, Any]:
            params = {"query": text, "page[size]": str(page_size), "page[offset]": str(offset)}
            return search_attributes(self._get("/api/v2/incidents/search", params))

        def text(attempt: Attempt) -> str:
            sent = query.text(facets=attempt.with_fields)
            return f"incident_type:{self.incident_type_id} AND ({sent})" if attempt.with_type else sent

        def keep(attempt: Attempt, page: list[Any]) -> list[LeaseFacts]:
            return self._kept(query, attempt, page)

        return search_pages(query, self.facets, text, fetch, keep, page_size=page_size)

    def timeseries(
        self, query: str, start: datetime, end: datetime, *, max_points: int = 300
    ) -> list[TimeseriesResult]:
        """A query's groups over time (API v2 /query/timeseries), as the gateway asks it (the MetricsHistory port):
        the same body and the same bounded reading of the answer (gpufarm.adapters.timeseries_query)."""
        body = json.dumps(tq.request_body(query, start, end, max_points)).encode()
        try:
            answer = self._post("/api/v2/query/timeseries", body)
        except dh.Failed as failed:
            raise failed.error() from None
        return tq.timeseries_results(tq.answer_attributes(answer))

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        """GET a path of the Datadog API and decode its JSON; dh.Failed (classified) when it fails."""
        if params:
            path += "?" + urllib.parse.urlencode(params)
        return self._call("GET", path)

    def _post(self, path: str, body: bytes) -> Any:
        """POST a JSON body to a path of the Datadog API and decode its JSON; dh.Failed (classified) when it fails."""
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        """Send a request to the Datadog API and decode its JSON; dh.Failed (classified) when it fails."""
        url = f"{self.base_url}{path}"
        what = f"{method} {path.partition('?')[0]}"
        self.rate_limits.hold(url)
        # A request's own headers replace the pool's: the keys are sent again with the body's type.
        headers = {**self._http.headers, "Content-Type": "application/json"} if body is not None else None
        try:
            response = self._http.request(method, url, body=body, headers=headers, preload_content=True)
        except urllib3.exceptions.HTTPError as exc:
            raise dh.Failed(what, dh.transport_outcome(exc)) from None
        self.rate_limits.observe(url, response.headers)
        if not 200 <= response.status <= 299:
            outcome = dh.status_outcome(response.status, response.data, response.reason, response.headers)
            raise dh.Failed(what, outcome)
        if not response.data:
            return None
        try:
            return dh.parse_json(response.data)
        except ValueError:
            raise UpstreamError("Datadog answered with a body that is not JSON") from None

    def _kept(self, query: IncidentQuery, attempt: Attempt, page: list[Any]) -> list[LeaseFacts]:
        """The page's incidents of gpufarm's type that the query matches, as LeaseFacts; facets seen ignored are
        remembered, malformed incidents skipped (said once)."""
        type_id = self.incident_type_id
        foreign = 0
        mine = 0
        out: list[LeaseFacts] = []
        for item in page:
            attributes = self._attributes(item)
            if attributes is None:
                continue
            if attributes.get("incident_type_uuid") != type_id:
                foreign += 1
                continue
            lease = self._lease(query, attributes)
            if lease is None:
                continue
            mine += 1
            if lease is not NOT_ASKED:
                out.append(lease)
        if attempt.with_type and foreign:
            self.facets.lose(Facet.TYPE, "ignored (other types' incidents came back)")
        if attempt.with_fields and ignored(mine, mine - len(out)):
            self.facets.lose(Facet.FIELDS, "ignored (incidents the facets exclude came back)")
        return out

    def _attributes(self, item: Any) -> dict[str, Any] | None:
        """An incident's attributes, None (skipped, said once) when it has no id or no attributes object."""
        data = item.get("data") if isinstance(item, dict) else None
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            attributes = data.get("attributes")
            if isinstance(attributes, dict):
                return attributes
        self._skip("an incident without an id or attributes")
        return None

    def _lease(self, query: IncidentQuery, attributes: dict[str, Any]) -> LeaseFacts | None:
        """The incident as LeaseFacts, NOT_ASKED when the query does not match it, None (skipped, said once) when
        it has no whole IR number."""
        ir = attributes.get("public_id")
        if not isinstance(ir, int) or isinstance(ir, bool) or not 0 <= ir <= MAX_IR:
            self._skip("an incident without a whole IR number")
            return None
        state = attributes.get("state")
        state = state if isinstance(state, str) else None
        values = f.FieldView(attributes.get("fields"))
        if not query.admits(state, values):
            return NOT_ASKED
        modified = attributes.get("modified")
        return LeaseFacts.decode(ir, state, values, parse_time(modified if isinstance(modified, str) else None))

    def _skip(self, what: str) -> None:
        """Count a malformed incident; the first is logged."""
        self.skipped += 1
        if self.skipped == 1:
            log.warning("incident search: Datadog answered %s; skipped (and any more like it, silently)", what)


if TYPE_CHECKING:

    def _implements_the_port(reads: DatadogLeaseReads) -> LeaseReads:
        """mypy proves here that DatadogLeaseReads is LeaseReads."""
        return reads

    def _reads_metrics(reads: DatadogLeaseReads) -> MetricsHistory:
        """And that it is MetricsHistory (a report's capacity read, gpufarm.reporting.capacity)."""
        return reads
