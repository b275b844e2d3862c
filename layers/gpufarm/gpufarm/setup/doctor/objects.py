"""Checks 2, 4 and 6: gpufarm's incident type and fields as `gpufarm datadog apply` makes them, every search form
gpufarm uses, and the idle and squatter monitors apply would make, each validated by Datadog. Nothing here writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.setup.changes import Action, Change
from gpufarm.setup.doctor.ports import AdminApi, SearchForms, Timing
from gpufarm.setup.doctor.report import Line, Status
from gpufarm.setup.plan import CurrentState, SetupSpec, gpufarm_types, plan_setup
from gpufarm.setup.squatter_monitor import farm_monitors

INCIDENT_TYPE = "incident type"
SEARCHES = "search forms"
MONITORS = "monitors"
# How often, and how far apart, the search forms are tried again while one of them does not find its sample.
SEARCH_RETRIES = 3
SEARCH_RETRY_S = 2.0
APPLY = "run `gpufarm datadog apply`"


def find_type(types: Sequence[Mapping[str, Any]], name: str) -> tuple[str | None, str]:
    """gpufarm's incident type id, or None and why it is not usable."""
    named = gpufarm_types(types, name)
    if not named:
        return None, f"Datadog has no incident type named {name!r}: {APPLY}"
    if len(named) > 1:
        return None, f"{len(named)} incident types are named {name!r}: rename or delete all but one"
    if (named[0].get("attributes") or {}).get("is_default"):
        return None, f"{name!r} is the organization's default type; gpufarm needs a type of its own"
    return str(named[0].get("id")), ""


def check_incident_type(admin: AdminApi, name: str, farm: FarmConfig | None) -> tuple[Line, str | None]:
    """The incident type line (fields missing or different are broken), and the type's id when it exists."""
    types = admin.list_incident_types()
    type_id, why = find_type(types, name)
    if type_id is None:
        return Line(INCIDENT_TYPE, Status.BROKEN, why), None
    problems = field_problems(types, admin.list_field_definitions(type_id), name, farm)
    if problems:
        return Line(INCIDENT_TYPE, Status.BROKEN, f"{name!r} ({type_id}) fields: {problems}: {APPLY}"), type_id
    choices = "" if farm is not None else " (dropdown choices not compared: no farm configuration)"
    detail = f"{name!r} ({type_id}) with its fields as apply makes them{choices}"
    return Line(INCIDENT_TYPE, Status.CONFIRMED, detail), type_id


def field_problems(
    types: list[dict[str, Any]], fields: list[dict[str, Any]], name: str, farm: FarmConfig | None
) -> str:
    """How the type's fields differ from what apply makes (`missing a, b; different c (display name)`), or ''."""
    current = CurrentState(incident_types=types, fields=fields, webhooks={}, variable=None, rules=[])
    spec = SetupSpec(
        incident_webhook_url="",
        idle_webhook_url="",
        valid_values=farm.valid_values() if farm is not None else {},
        incident_type=name,
    )
    pending = [c for c in plan_setup(current, spec).changes if c.kind == "field" and c.action is not Action.UNCHANGED]
    missing = [c.name for c in pending if c.target_id is None]
    different = [_difference(c) for c in pending if c.target_id is not None]
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
        [f"different {'; '.join(different)}"] if different else []
    )
    return "; ".join(parts)


def _difference(change: Change) -> str:
    return f"{change.name} ({change.detail})"


def check_searches(searches: SearchForms, sample: IncidentRecord | None, timing: Timing) -> list[Line]:
    """One line per search form gpufarm uses, as the incidents adapter probed it around `sample`.

    A sample made moments ago may not be in Datadog's search index yet, so a form that did not find it is tried
    again, a few times, before it counts as broken.
    """
    outcomes = list(searches.check_search_forms(sample))
    for _ in range(SEARCH_RETRIES):
        if not any(outcome.status == Status.BROKEN.value for outcome in outcomes):
            break
        timing.sleep(SEARCH_RETRY_S)
        outcomes = list(searches.check_search_forms(sample))
    lines = []
    for outcome in outcomes:
        try:
            status = Status(outcome.status)
        except ValueError:
            status = Status.BROKEN
        lines.append(Line(f"search {outcome.form}", status, outcome.detail))
    return lines


def check_monitors(admin: AdminApi, farm: FarmConfig | None) -> list[Line]:
    """One line with the counts, and one per monitor Datadog refuses (`POST /api/v1/monitor/validate`)."""
    if farm is None:
        return [Line(MONITORS, Status.SKIPPED, "no farm configuration: pass --farm-config FILE")]
    monitors = farm_monitors(farm)
    refused: list[Line] = []
    for monitor in monitors:
        try:
            admin.validate_monitor(monitor.body)
        except ValidationFailed as exc:
            refused.append(Line(f"monitor {monitor.key}", Status.BROKEN, str(exc)))
    valid = len(monitors) - len(refused)
    status = Status.BROKEN if refused else Status.CONFIRMED
    return [Line(MONITORS, status, f"{valid} of {len(monitors)} monitors valid (idle and squatter)"), *refused]
