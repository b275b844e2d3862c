"""gpufarm's incidents in Datadog: its own incident type, incidents created once per request, read, searched and
updated, over datadog-api-client (the IncidentStore port).

Every incident created here carries gpufarm's incident type, and every read, search and count sees that type only:
the organization's other incidents are never treated as GPU allocations, changed or counted. Search pages are
decoded from their JSON, because building the client's model graph for them costs ~40x the fetch (docs/datadog.md,
"Decoding bulk reads"). The runtime gateway (gpufarm.adapters.datadog.DatadogGateway) is this store plus the
hosts, tags, monitors, metrics and events the handlers use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gpufarm.adapters import datadog_client as dc
from gpufarm.adapters.incident_search import (
    BROKEN,
    HTTP_BAD_REQUEST,
    MAX_PAGE_READERS,
    NO_SUCH_VALUE,
    SEARCH_PAGE,
    Attempt,
    Facet,
    FacetMemory,
    SearchCheck,
    forms,
    ignored,
    item_data,
    search_attributes,
    search_pages,
    type_id_named,
    verdict,
)
from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound, UpstreamError, ValidationFailed
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.search import IncidentQuery

if TYPE_CHECKING:
    from gpufarm.core.kernel.ports import IncidentStore

log = logging.getLogger(__name__)

# How many of the newest incidents a search-form probe looks through for the incident it must (or must not) find.
PROBE_SCAN = 500
# How many incident ids a gateway remembers as gpufarm's own, so an update right after a read costs no re-check.
KNOWN_IDS = 4096
# How many IR -> UUID pairs a gateway remembers (about 150 bytes each). The pair never changes once an incident
# exists, so the index holds a fact, not state: an entry is only ever confirmed or dropped, never trusted blindly.
IR_INDEX_SIZE = 50_000
# Pages of one search read at once once its first page gives the total: a pool's 40 pages in a tenth of the calls'
# round trips, within the rate-limit gate (docs/datadog.md, "Rate limits") and the invocation's time budget.
PAGE_READERS = 4


class DatadogIncidents:
    """IncidentStore over Datadog: gpufarm's incident type only.

    The type's id comes from `incident_type_id` (or the GPUFARM_INCIDENT_TYPE_ID setting); without one it is looked
    up by name (GPUFARM_INCIDENT_TYPE, default "GPU allocation") on the first incident call and kept for the
    store's life, which is the container's (handlers build their collaborators once): one extra read per cold
    container, none per request.
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
        page_readers: int = PAGE_READERS,
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
        # How many pages of a search read whole are read at once (gpufarm.adapters.incident_search.search_pages).
        self.page_readers = max(1, min(MAX_PAGE_READERS, page_readers))
        self._sleep = sleep
        # Ids already read back as gpufarm's type: updating them needs no re-check (bounded, oldest dropped).
        self._own_ids: OrderedDict[str, None] = OrderedDict()
        # IR number -> incident UUID, filled by every incident this gateway decodes (bounded, oldest dropped).
        self._ir_index: OrderedDict[int, str] = OrderedDict()
        self._index_lock = threading.Lock()
        # The facets Datadog refused or ignored, remembered for the container's life (gpufarm.adapters.incident_search).
        self.facets = FacetMemory()
        # One gate for every client (the gateway's metrics client too): a rate limit one of them saw spent holds the
        # others (docs/datadog.md, "Rate limits"); each waits out a 429 within the same bounds.
        self.rate_limits = dc.RateLimitGate(max_wait_s=rate_limit_wait_s)
        self._limits: dict[str, Any] = {
            "gate": self.rate_limits,
            "rate_limit_wait_s": rate_limit_wait_s,
            "rate_limit_retries": rate_limit_retries,
        }
        self._client = dc.api_client(settings, retry=True, **self._limits)
        # Same keys, timeouts and retries; answers come back unread, for the bulk reads decoded here.
        self._raw_client = dc.api_client(settings, retry=True, raw=True, **self._limits)
        # Status retries off: the client would retry POST after a 5xx and could create a second incident
        # (docs/datadog.md, "The client"); create() retries itself after re-checking. A 429 is still waited out.
        self._create_client = dc.api_client(settings, retry=False, **self._limits)

    def close(self) -> None:
        """Release the HTTP connection pools."""
        self._client.close()
        self._raw_client.close()
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

    # -- gpufarm's incident type ----------------------------------------------------------------------

    @property
    def incident_type_id(self) -> str:
        """The id of gpufarm's incident type (looked up by name once, then kept)."""
        if self._type_id is None:
            self._type_id = self._find_type_id()
        return self._type_id

    def _find_type_id(self) -> str:
        with dc.errors("list incident types"):
            response = self._incidents.list_incident_types()
        found = [dc.plain_dict(t) for t in (dc.get(response, "data") or [])]
        type_id = type_id_named(found, self.incident_type_name)
        log.info("gpufarm incident type %r is %s", self.incident_type_name, type_id)
        return type_id

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
        # Input is checked before anything is read or written (the type's id may be looked up).
        checked, encoded = _checked_title(title), _encode(fields)
        body = _create_body(checked, encoded, self.incident_type_id, notification_handles, initial_note)
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
                existing = self._after_failed_create(failed, attempt, rid)
                if existing is not None:
                    return existing
        raise AssertionError("unreachable: the loop returns or raises")

    def _after_failed_create(self, failed: dc.Failed, attempt: int, rid: str | None) -> IncidentRecord | None:
        """Raise the failure unless sending again is safe; else wait, then the incident if it was created after all
        (None: send again)."""
        outcome = failed.outcome
        # Without a request_id a 5xx or a timeout leaves us unable to tell whether Datadog created
        # it, so only a plain refusal (429/408/connection refused) may be sent again.
        if not (outcome.transient and (rid is not None or outcome.not_applied)):
            raise failed.error() from None
        last = attempt == self.create_attempts
        if last and (rid is None or outcome.not_applied):
            raise failed.error() from None
        delay = self.create_backoff_s * 2 ** (attempt - 1)
        log.warning("create incident failed (%s); attempt %d, re-check in %.1fs", outcome.message, attempt, delay)
        self._sleep(delay)
        # Re-check before sending again, and once more after the last failure: the server may have
        # created it before its answer was lost.
        if rid:
            existing = self.find_by_request_id(rid)
            if existing is not None:
                return existing
        if last:
            raise failed.error() from None
        return None

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
        # Read one page at a time: the search stops after the first page or two.
        for record in self._search(IncidentQuery(), newest_first=True, limit=None, page_size=self.search_page_size):
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

    def search(self, query: IncidentQuery, *, newest_first: bool = False) -> Iterator[IncidentRecord]:
        """gpufarm's incidents the query matches, every page (newest first when asked), whatever Datadog does with
        the facets (gpufarm.adapters.incident_search)."""
        if query.scan is not None:
            newest_first = True
        return self._search(
            query, newest_first=newest_first, limit=None, page_size=self.search_page_size, readers=self.page_readers
        )

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        """The incident created for a Slack request, so a retried create never makes a second one.

        When overlapping deliveries of one request each created an incident, the lowest IR is the one that lives
        (the others were closed as its duplicates at once), so that is the one returned: an answer to a later
        retry names the live incident, never a closed duplicate.
        """
        # A retried create comes seconds after the first: this reads gpufarm's newest incidents in any state
        # (`request_id_scan` of them) and compares the field itself, asking Datadog for no field facet.
        page_size = min(self.search_page_size, self.request_id_scan)
        newest = self._search(IncidentQuery(), newest_first=True, limit=self.request_id_scan, page_size=page_size)
        same = [record for record in newest if record.fields.get(f.REQUEST_ID) == request_id]
        return min(same, key=lambda record: record.public_id) if same else None

    def check_search_forms(self, sample: IncidentRecord | None = None) -> list[SearchCheck]:
        """Each search form gpufarm uses, probed around `sample` (default: gpufarm's newest incident): confirmed,
        fell back (refused or ignored, and how gpufarm copes), or broken. Reads only; the store's own memory of
        refused facets is neither used nor changed."""
        if sample is None:
            sample = next(iter(self._search(IncidentQuery(), newest_first=True, limit=1, page_size=1)), None)
            if sample is None:
                return [SearchCheck("every form", BROKEN, "no gpufarm incident to probe the searches with")]
        checks = []
        for form in forms(sample):
            with_type = form.facet is Facet.TYPE
            found = self._probe(form.finds, sample.id, type_id=self.incident_type_id if with_type else None)
            missed = self._probe(form.misses, sample.id, type_id=NO_SUCH_VALUE if with_type else None)
            checks.append(verdict(form, found, missed))
        return checks

    def _probe(self, query: IncidentQuery, incident_id: str, *, type_id: str | None) -> bool | str:
        """Whether the query's answer holds the incident (its newest PROBE_SCAN), or Datadog's refusal (400)."""
        text = query.text() if type_id is None else f"incident_type:{type_id} AND ({query.text()})"
        kwargs: dict[str, Any] = {"query": text, "page_size": SEARCH_PAGE, "sort": _newest_first()}
        offset = 0
        while offset < PROBE_SCAN:
            try:
                attributes = self._page(kwargs, offset)
            except dc.Failed as failed:
                if failed.outcome.status == HTTP_BAD_REQUEST:
                    return failed.outcome.message
                raise failed.error() from None
            page = attributes.get("incidents") or []
            if any(item_data(item)["id"] == incident_id for item in page):
                return True
            if len(page) < SEARCH_PAGE:
                return False
            offset += len(page)
        return False

    def _search(
        self, query: IncidentQuery, *, newest_first: bool, limit: int | None, page_size: int, readers: int = 1
    ) -> Iterator[IncidentRecord]:
        sort = {"sort": _newest_first()} if newest_first else {}

        def fetch(text: str, offset: int) -> dict[str, Any]:
            return self._page({"query": text, "page_size": page_size, **sort}, offset)

        def text(attempt: Attempt) -> str:
            return self._text(query, attempt)

        def keep(attempt: Attempt, page: list[Any]) -> list[IncidentRecord]:
            return self._kept(query, attempt, page)

        return search_pages(query, self.facets, text, fetch, keep, page_size=page_size, limit=limit, readers=readers)

    def _kept(self, query: IncidentQuery, attempt: Attempt, page: list[Any]) -> list[IncidentRecord]:
        """The page's incidents of gpufarm's type that the query matches; facets seen ignored are remembered."""
        own = [self._own(item_data(item)) for item in page]
        if attempt.with_type and any(record is None for record in own):
            self.facets.lose(Facet.TYPE, "ignored (other types' incidents came back)")
        mine = [record for record in own if record is not None]
        wanted = [record for record in mine if query.matches(record)]
        if attempt.with_fields and ignored(len(mine), len(mine) - len(wanted)):
            self.facets.lose(Facet.FIELDS, "ignored (incidents the facets exclude came back)")
        return wanted

    def _text(self, query: IncidentQuery, attempt: Attempt) -> str:
        text = query.text(facets=attempt.with_fields)
        # Filtering on the type keeps other types' incidents off the wire; _own() checks every answer anyway.
        return f"incident_type:{self.incident_type_id} AND ({text})" if attempt.with_type else text

    def _page(self, kwargs: dict[str, Any], offset: int) -> dict[str, Any]:
        with dc.classified("search incidents"):
            return search_attributes(dc.read_json(self._incidents_raw.search_incidents(page_offset=offset, **kwargs)))


# -- conversions ----------------------------------------------------------------------------------------


def _newest_first() -> Any:
    return dc.build("datadog_api_client.v2.model.incident_search_sort_order", "IncidentSearchSortOrder", "-created")


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


def _create_body(
    title: str,
    fields: dict[str, dict[str, Any]],
    incident_type_id: str,
    notification_handles: Sequence[str],
    initial_note: str | None,
) -> dict[str, Any]:
    """The create request's JSON from a checked title and encoded fields: gpufarm's incident type, and the handles
    and note when given."""
    attributes: dict[str, Any] = {
        "title": title,
        "customer_impacted": False,
        "fields": fields,
        "incident_type_uuid": incident_type_id,
    }
    if notification_handles:
        attributes["notification_handles"] = [
            {"handle": handle, "display_name": handle.lstrip("@")} for handle in notification_handles
        ]
    if initial_note:
        attributes["initial_cells"] = [
            {"cell_type": "markdown", "content": {"content": initial_note}, "important": False}
        ]
    return {"data": {"type": "incidents", "attributes": attributes}}


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


if TYPE_CHECKING:

    def _implements_the_port(incidents: DatadogIncidents) -> IncidentStore:
        """mypy proves here that DatadogIncidents is an IncidentStore."""
        return incidents
