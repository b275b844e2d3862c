"""gpufarm's dashboards and metric metadata in `gpufarm datadog apply`: what it wants and the plan (pure: no calls).

Dashboards (gpufarm.setup.dashboards_farm builds them from the farm configuration) are gpufarm's when their
description carries the ownership marker `[gpufarm-dashboard:<key>]` (dashboards take only `team:` tags, so the
marker lives in the description); the key is each dashboard's stable identity. A dashboard is compared with what
gpufarm defines key by key (what Datadog adds itself, widget ids and defaults, is not compared), so one edited by
hand shows as drift in `--dry-run` and `apply` puts gpufarm's definition back; a dashboard gpufarm no longer defines
is deleted only with `--prune`. Dashboards without the marker are never read, changed or deleted.

Metric metadata: every metric of the node agent's spec, and each lifecycle metric gpufarm publishes itself
(`lifecycle_metrics`: waiting requests, idle warnings, reclaims) and each profiler-run metric (`profile_metrics`:
`gpufarm profile upload`'s summaries), gets its type, unit, per-second unit and
description. The spec is spec/metrics.yaml, which this package reaches through `metrics.yaml` beside this module,
a link to it (a built wheel carries the file's content), so the operator CLI needs no checkout.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

import yaml

from gpufarm.core.config.farm import FarmConfig
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.setup.changes import Action, Change
from gpufarm.setup.dashboards_farm import BUILDERS, DashboardSpec
from gpufarm.setup.dashboards_farm import latest_runs as latest_runs_group
from gpufarm.setup.dashboards_widgets import walk

KIND = "dashboard"
METADATA_KIND = "metric metadata"
MARKER_RE = re.compile(r"\[gpufarm-dashboard:([a-z0-9-]{1,40})\]")
# Keys of a dashboard gpufarm sets and compares; Datadog's own (id, url, author, dates, notify_list...) are not.
COMPARED = ("title", "description", "layout_type", "reflow_type", "template_variables", "widgets")
# Keys of a metric's metadata gpufarm sets.
METADATA_KEYS = ("type", "unit", "per_unit", "description")
SPEC_RESOURCE = "metrics.yaml"


def marker(key: str) -> str:
    """The ownership marker of one of gpufarm's dashboards."""
    return f"[gpufarm-dashboard:{key}]"


def dashboard_key(dashboard: Mapping[str, Any]) -> str | None:
    """The key of one of gpufarm's dashboards (from its description's marker), None for anyone else's."""
    found = MARKER_RE.search(str(dashboard.get("description") or ""))
    return found.group(1) if found else None


def desired_dashboards(farm: FarmConfig, latest_runs: Mapping[str, str] | None = None) -> list[DashboardSpec]:
    """The five dashboards the farm gets, validated by datadog-api-client's models, in a stable order.

    `latest_runs` (team -> signed link, gpufarm.profiling.links.latest_links) adds the project dashboard's
    iframes of each team's newest profiler run; without the profile pages configured there are none.
    """
    out: list[DashboardSpec] = []
    for key, build in BUILDERS.items():
        body = build(farm)
        if key == "project" and latest_runs:
            body["widgets"].append(latest_runs_group(latest_runs))
        body["description"] = (
            f"Defined by gpufarm (`gpufarm datadog apply` from the farm configuration); edits made here are put "
            f"back by the next apply. {marker(key)}"
        )
        validated(body)
        out.append(DashboardSpec(key, body))
    return out


def validated(body: Mapping[str, Any]) -> None:
    """Raise ValidationFailed unless datadog-api-client's Dashboard model takes the whole dashboard."""
    problem = model_problem(json.dumps(body, sort_keys=True))
    if problem is not None:
        raise ValidationFailed("dashboard", f"dashboard {body.get('title')!r}: {problem}")


@functools.lru_cache(maxsize=64)
def model_problem(text: str) -> str | None:
    """Why the Dashboard model refuses this JSON (a missing key, a bad type, anything `_unparsed`), or None.

    Cached by the JSON text: the client's deserialization of five dashboards takes about two seconds, and apply
    (and `gpufarm local`, which applies on every start) asks again for the same farm.
    """
    from datadog_api_client import ApiClient, Configuration
    from datadog_api_client.exceptions import OpenApiException
    from datadog_api_client.model_utils import OpenApiModel
    from datadog_api_client.v1.model.dashboard import Dashboard

    try:
        # datadog-api-client's Configuration.__init__ carries no annotations.
        client = ApiClient(Configuration())  # type: ignore[no-untyped-call]
        model = client.deserialize(text, (Dashboard,), True)
    except (OpenApiException, TypeError, ValueError) as exc:
        return str(exc)[:300]
    bad: list[str] = []

    def visit(node: Any, path: str) -> None:
        if isinstance(node, OpenApiModel):
            if getattr(node, "_unparsed", False):
                bad.append(path)
            for name, value in node._data_store.items():
                visit(value, f"{path}.{name}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                visit(item, f"{path}[{i}]")

    visit(model, "dashboard")
    return f"{max(bad, key=len)} is not valid" if bad else None


def widget_queries(body: Mapping[str, Any]) -> list[str]:
    """Every metric query of a dashboard's widgets (those inside groups too)."""
    out: list[str] = []
    for widget in walk(body.get("widgets") or []):
        for request in widget.get("definition", {}).get("requests") or []:
            out += [str(q["query"]) for q in request.get("queries") or [] if "query" in q]
    return out


# -- planning (pure) -----------------------------------------------------------------------------------------


def plan_dashboards(
    current: Iterable[Mapping[str, Any]], wanted: Sequence[DashboardSpec], *, prune: bool
) -> list[Change]:
    """Create, restore, keep and (with prune) delete gpufarm's dashboards so Datadog holds exactly `wanted`.

    `current` holds the whole definitions of the dashboards that carry gpufarm's marker.
    """
    existing: dict[str, list[Mapping[str, Any]]] = {}
    for dashboard in current:
        key = dashboard_key(dashboard)
        if key is not None:
            existing.setdefault(key, []).append(dashboard)
    changes: list[Change] = []
    for want in wanted:
        title = str(want.body["title"])
        found = sorted(existing.pop(want.key, []), key=lambda d: str(d.get("created_at") or ""))
        if not found:
            changes.append(Change(KIND, title, Action.CREATE, want.key, want.body))
            continue
        target = found[0]
        differs = differences(target, want.body)
        action = Action.UPDATE if differs else Action.UNCHANGED
        detail = ("drift: " + ", ".join(differs)) if differs else str(target.get("id"))
        changes.append(Change(KIND, title, action, detail, want.body, str(target.get("id")), tuple(differs)))
        changes += [_stale(d, prune, f"duplicate of dashboard {target.get('id')}") for d in found[1:]]
    for dashboards in existing.values():
        changes += [_stale(d, prune, "no longer defined by gpufarm") for d in dashboards]
    return changes


def _stale(dashboard: Mapping[str, Any], prune: bool, why: str) -> Change:
    name = str(dashboard.get("title") or dashboard.get("id"))
    target = str(dashboard.get("id"))
    if prune:
        return Change(KIND, name, Action.DELETE, why, target_id=target)
    return Change(KIND, name, Action.UNCHANGED, f"{why}; --prune deletes it", target_id=target)


def differences(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """What of `wanted` a stored dashboard lacks or holds otherwise: top-level keys, and widgets by title."""
    out: list[str] = []
    for key in COMPARED:
        if key not in wanted:
            continue
        if key == "widgets":
            out += _widget_differences(current.get("widgets") or [], wanted["widgets"])
        elif not _contains(current.get(key), wanted[key]):
            out.append(key)
    return out


def _widget_differences(current: Sequence[Any], wanted: Sequence[Mapping[str, Any]]) -> list[str]:
    if len(current) != len(wanted):
        return [f"widgets ({len(current)} there, {len(wanted)} defined)"]
    out = []
    for i, (have, want) in enumerate(zip(current, wanted, strict=True)):
        if not _contains(have, want):
            title = want.get("definition", {}).get("title") or want.get("definition", {}).get("type")
            out.append(f"widget {i + 1} ({title})")
    return out


def _contains(have: Any, want: Any) -> bool:
    """Whether `have` holds everything of `want` (dicts may hold more keys: Datadog's ids and defaults)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and _contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(have) == len(want)
            and all(_contains(h, w) for h, w in zip(have, want, strict=True))
        )
    return bool(have == want)


# -- metric metadata -----------------------------------------------------------------------------------------


@functools.cache
def metric_spec() -> dict[str, Any]:
    """The node agent's metric spec (spec/metrics.yaml, as shipped in this package)."""
    text = resources.files("gpufarm.setup").joinpath(SPEC_RESOURCE).read_text(encoding="utf-8")
    spec = yaml.safe_load(text)
    if not isinstance(spec, dict) or not isinstance(spec.get("metrics"), dict):
        raise ValidationFailed("metrics", "the shipped metric spec has no metrics")
    return spec


def desired_metadata(spec: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each metric's metadata as Datadog's MetricMetadata takes it (keys gpufarm does not set are left out)."""
    declared_spec = spec or metric_spec()
    sections = ("metrics", "lifecycle_metrics", "profile_metrics", "enforce_metrics")
    metrics = {name: m for section in sections for name, m in (declared_spec.get(section) or {}).items()}
    out: dict[str, dict[str, Any]] = {}
    for name, declared in sorted(metrics.items()):
        body: dict[str, Any] = {"type": str(declared["type"])}
        if declared.get("unit"):
            body["unit"] = str(declared["unit"])
        if declared.get("per_unit"):
            body["per_unit"] = str(declared["per_unit"])
        description = " ".join(str(declared.get("description") or "").split())
        if description:
            body["description"] = description[:4000]
        out[str(name)] = body
    return out


def plan_metadata(
    current: Mapping[str, Mapping[str, Any] | None], wanted: Mapping[str, Mapping[str, Any]]
) -> list[Change]:
    """Send each metric's metadata where Datadog's differs (None: Datadog does not know the metric yet)."""
    changes: list[Change] = []
    for metric, body in wanted.items():
        have = current.get(metric)
        if have is None:
            changes.append(Change(METADATA_KIND, metric, Action.CREATE, _summary(body), body))
            continue
        differs = [k for k in METADATA_KEYS if have.get(k) != body.get(k)]
        action = Action.UPDATE if differs else Action.UNCHANGED
        changes.append(Change(METADATA_KIND, metric, action, ", ".join(differs), body, metric, tuple(differs)))
    return changes


def _summary(body: Mapping[str, Any]) -> str:
    unit = body.get("unit")
    per = body.get("per_unit")
    return f"{body['type']}" + (f", {unit}" if unit else "") + (f"/{per}" if per else "")
