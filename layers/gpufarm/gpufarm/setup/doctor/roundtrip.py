"""Check 3: the incident notification rule and the incident webhook, end to end, on a probe incident.

A probe is an incident of gpufarm's type whose request_id starts with `doctor-` (gpufarm.core.leases.probe): it is
created already ended, so no live read sees it, nothing treats it as a lease, and the webhook consumer only notes
in its history how the webhook reached it (token in the header or the payload, fields as an object or a string).
Doctor creates one, waits for the creation's webhook, then changes a field the deployed rule re-notifies on
(`phase`) and waits for that change's webhook. When none comes it changes the state too, within the same bound:
a rule that fires only on state changes is what gpufarm falls back to (the sweep drives every phase change).
The probe is deleted however the check ends.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound
from gpufarm.core.kernel.lifecycle import Phase, State
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.leases import probe
from gpufarm.setup.doctor.ports import POLL_S, AdminApi, ProbeStore, Timing
from gpufarm.setup.doctor.report import Line, Status
from gpufarm.setup.doctor.scratch import Scratch
from gpufarm.setup.webhooks import INCIDENT_HANDLE, INCIDENT_WEBHOOK

ROUND_TRIP = "webhook round trip"
PROBE_TITLE = "gpufarm doctor probe (deleted when doctor ends; not a GPU allocation)"
MODIFIED_TRIGGER = "incident_modified_trigger"
_HEADER = re.compile(r"token in (header|payload)")
_FIELDS = re.compile(r"fields as (object|string|absent)")


def deployed_rule(rules: Sequence[Mapping[str, Any]], type_id: str) -> Mapping[str, Any] | None:
    """The rule `gpufarm datadog apply` makes for changes: on gpufarm's type, calling its incident webhook."""
    for rule in rules:
        attributes = rule.get("attributes") or {}
        relationship = ((rule.get("relationships") or {}).get("incident_type") or {}).get("data") or {}
        if (
            attributes.get("trigger") == MODIFIED_TRIGGER
            and INCIDENT_HANDLE in (attributes.get("handles") or [])
            and str(relationship.get("id")) == type_id
            and attributes.get("enabled", True)
        ):
            return rule
    return None


def preflight(admin: AdminApi, type_id: str) -> tuple[list[str] | None, Line | None]:
    """The fields the deployed rule re-notifies on, or the broken line when there is no rule or no webhook."""
    rule = deployed_rule(admin.list_notification_rules(), type_id)
    if rule is None:
        detail = f"no enabled rule on {MODIFIED_TRIGGER} calls {INCIDENT_HANDLE}: run `gpufarm datadog apply`"
        return None, Line(ROUND_TRIP, Status.BROKEN, detail)
    if admin.get_webhook(INCIDENT_WEBHOOK) is None:
        detail = f"Datadog has no webhook {INCIDENT_WEBHOOK}: run `gpufarm datadog apply`"
        return None, Line(ROUND_TRIP, Status.BROKEN, detail)
    return [str(name) for name in (rule.get("attributes") or {}).get("renotify_on") or []], None


def probe_pool(admin: AdminApi, type_id: str, farm: FarmConfig | None) -> tuple[str, str] | None:
    """The environment and team a probe is created in: the farm's first of each, else the first choice of each
    dropdown gpufarm's type holds; None when there is none (the probe's fields must be choices Datadog takes)."""
    if farm is not None and farm.environments and farm.teams:
        return sorted(farm.environments)[0], sorted(farm.teams)[0]
    choices: dict[str, str] = {}
    for definition in admin.list_field_definitions(type_id):
        attributes = definition.get("attributes") or {}
        values = [str(v.get("value")) for v in attributes.get("valid_values") or [] if isinstance(v, Mapping)]
        if attributes.get("name") in (f.ENVIRONMENT, f.TEAM) and values:
            choices.setdefault(str(attributes["name"]), values[0])
    if f.ENVIRONMENT in choices and f.TEAM in choices:
        return choices[f.ENVIRONMENT], choices[f.TEAM]
    return None


@contextmanager
def probe_incident(store: ProbeStore, scratch: Scratch, environment: str, team: str) -> Iterator[IncidentRecord]:
    """A probe incident for the block's length, in that pool and team: created on entry, deleted on exit however
    the block ends (by its request id when the create's answer was lost)."""
    fields = probe.probe_fields(secrets.token_hex(6), environment, team)
    request_id = str(fields[f.REQUEST_ID])
    made: list[str] = []
    with scratch.kept(f"probe incident {request_id}", lambda: _delete_probe(store, request_id, made)):
        record = store.create(PROBE_TITLE, fields)
        made.append(record.id)
        yield record


def check_round_trip(store: ProbeStore, incident_id: str, renotify: Sequence[str], timing: Timing) -> Line:
    """The round trip's line on a probe: confirmed, fell back (state changes only, token in the payload, fields as a
    string), or broken (nothing arrived within the bound)."""
    return _probe(store, incident_id, renotify, timing)


def _probe(store: ProbeStore, incident_id: str, renotify: Sequence[str], timing: Timing) -> Line:
    started = timing.clock()
    deadline = started + timing.wait_s
    # The creation's webhook first, so a call after the field change is told apart from it.
    _await(store, incident_id, 0, started + timing.wait_s / 3, timing)
    record = store.get(incident_id)
    before = len(probe.webhook_arrivals(record))
    if not renotify or f.PHASE in renotify:
        store.update(incident_id, {f.PHASE: _other_phase(record.fields.get(f.PHASE))})
        seen = _await(store, incident_id, before, timing.clock() + (deadline - timing.clock()) / 2, timing)
        if seen is not None:
            return verdict(seen, on_field=True, seconds=timing.clock() - started)
        before = len(probe.webhook_arrivals(store.get(incident_id)))
    store.update(
        incident_id, {f.STATE: State.ACTIVE.value if record.state == State.RESOLVED.value else State.RESOLVED.value}
    )
    seen = _await(store, incident_id, before, deadline, timing)
    if seen is not None:
        return verdict(seen, on_field=False, seconds=timing.clock() - started)
    what = "neither the creation nor a change" if before == 0 else "no change after the creation"
    return Line(ROUND_TRIP, Status.BROKEN, f"{what} reached the incident webhook within {timing.wait_s:g} s")


def _await(store: ProbeStore, incident_id: str, before: int, until: float, timing: Timing) -> str | None:
    """How the newest webhook call arrived, once more than `before` have; None at `until`."""
    while True:
        arrivals = probe.webhook_arrivals(store.get(incident_id))
        if len(arrivals) > before:
            return arrivals[-1]
        left = until - timing.clock()
        if left <= 0:
            return None
        timing.sleep(min(POLL_S, left))


def _other_phase(current: object) -> str:
    # Both end a lease, so a probe holding either is still no lease.
    return Phase.RECLAIMED.value if current != Phase.RECLAIMED.value else Phase.REJECTED.value


def verdict(seen: str, *, on_field: bool, seconds: float) -> Line:
    """The line for the webhook note a probe received after a field change (`on_field`) or only a state change."""
    header = _HEADER.search(seen)
    encoding = _FIELDS.search(seen)
    falls = [] if on_field else ["fired only after a state change"]
    if header is None or encoding is None:
        return Line(ROUND_TRIP, Status.FELL_BACK, f"arrived, but the note reads {seen[:120]!r}")
    if header.group(1) != "header":
        falls.append("the token came in the payload, not the X-Gpufarm-Token header")
    if encoding.group(1) != "object":
        falls.append(f"the fields came as {'a string' if encoding.group(1) == 'string' else 'nothing'}")
    took = f"in {seconds:.1f} s"
    if falls:
        return Line(ROUND_TRIP, Status.FELL_BACK, f"{'; '.join(falls)} ({took})")
    return Line(
        ROUND_TRIP, Status.CONFIRMED, f"fired on a phase change; token in the header; fields as an object ({took})"
    )


def _delete_probe(store: ProbeStore, request_id: str, made: Sequence[str]) -> None:
    """Delete the probe: by id once created, else by its request id (a create whose answer was lost)."""
    if made:
        incident_id = made[0]
    else:
        found = store.find_by_request_id(request_id)
        if found is None:
            return
        incident_id = found.id
    try:
        store.delete(incident_id)
    except NotFound:
        return  # already gone
