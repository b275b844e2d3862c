"""What `gpufarm datadog apply` wants Datadog to hold, and the plan that gets it there (pure: no calls).

What it manages: gpufarm's own incident type ("GPU allocation" unless GPUFARM_INCIDENT_TYPE names another), the
incident custom fields of gpufarm.core.kernel.fields.SCHEMA on that type only, the webhooks `gpufarm-incidents` and
`gpufarm-idle` with their payload templates and a secret header, the secret custom variable
GPUFARM_WEBHOOK_SECRET, and the incident notification rules, scoped to that type, that call the incident webhook
on create and on state/phase changes, and (given the farm configuration) the idle monitors generated from its idle
policy (gpufarm.setup.monitors; dropped ones are deleted only with `--prune`), the five dashboards and the node
agent's metric metadata (gpufarm.setup.dashboards; dashboards gpufarm no longer defines are deleted only with
`--prune`). The org's other incident types,
their fields, rules and incidents are never changed; a rule that calls gpufarm's webhook from another type (an
older gpufarm's) is moved to gpufarm's.

The secret custom variable cannot be read back (Datadog never returns a secret value), so an existing secret
variable counts as unchanged; `--rotate-secret` (rotate_secret=True) writes the configured value again.
Reading Datadog and executing a plan is gpufarm.setup.apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from gpufarm.config import Settings
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.setup.changes import Action, Change
from gpufarm.setup.dashboards import plan_dashboards, plan_metadata
from gpufarm.setup.dashboards_farm import DashboardSpec
from gpufarm.setup.monitors import IdleMonitor, plan_monitors
from gpufarm.setup.webhooks import (
    CUSTOM_HEADERS,
    IDLE_PAYLOAD,
    IDLE_WEBHOOK,
    INCIDENT_HANDLE,
    INCIDENT_PAYLOAD,
    INCIDENT_WEBHOOK,
    SECRET_VARIABLE,
)

# Where apply reads the webhooks' URLs when they are not given.
INCIDENT_WEBHOOK_URL_ENV = "GPUFARM_INCIDENT_WEBHOOK_URL"
IDLE_WEBHOOK_URL_ENV = "GPUFARM_IDLE_WEBHOOK_URL"

ALL_STATES = ("active", "stable", "resolved")
# Only state and phase changes concern the lifecycle handler; other field edits (purpose, notes) must not call it.
RENOTIFY_ON = ("state", "phase")
MAX_VALID_VALUES = 1000
DEFAULT_INCIDENT_TYPE = str(Settings.FIELDS["incident_type"].default)
INCIDENT_TYPE_DESCRIPTION = (
    "GPU allocations managed by gpufarm: each incident is one lease of GPUs, requested in Slack and tagged on its "
    "hosts as ir:ir-<number>. Created by `gpufarm datadog apply`; not for production incidents."
)


@dataclass(frozen=True)
class Plan:
    """Every change apply would make, in the order it makes them."""

    changes: tuple[Change, ...]
    # None when the incident type is still to be created (executing creates it first) or blocked.
    incident_type_id: str | None = None
    incident_type: str = DEFAULT_INCIDENT_TYPE
    # Names of the monitors to create or update that Datadog's validate endpoint accepted (gpufarm.setup.apply.
    # validate_monitors); one it refused is a blocked change instead.
    validated_monitors: tuple[str, ...] = ()

    @property
    def blocked(self) -> list[Change]:
        """Changes that cannot be applied."""
        return [c for c in self.changes if c.action is Action.BLOCKED]

    @property
    def pending(self) -> list[Change]:
        """Creates, updates and deletes."""
        return [c for c in self.changes if c.action in (Action.CREATE, Action.UPDATE, Action.DELETE)]

    def counts(self) -> dict[str, int]:
        """How many objects per action."""
        out = {a.value: 0 for a in Action}
        for change in self.changes:
            out[change.action.value] += 1
        return out

    def lines(self) -> list[str]:
        """The plan as printable lines."""
        return [c.line() for c in self.changes]

    def as_json(self) -> dict[str, Any]:
        """The plan as JSON-ready data: what a CI pipeline gates on (`gpufarm datadog apply --dry-run --json`)."""
        return {
            "incident_type": {"name": self.incident_type, "id": self.incident_type_id},
            "counts": self.counts(),
            "pending": len(self.pending),
            "blocked": len(self.blocked),
            "changes": [c.as_json() for c in self.changes],
            "validated_monitors": list(self.validated_monitors),
        }


@dataclass(frozen=True)
class SetupSpec:
    """What apply is asked to make true."""

    incident_webhook_url: str
    idle_webhook_url: str
    # Dropdown choices for the fields whose values come from the farm configuration (team, gpu_model,
    # environment); static ones (phase, reclaim_reason) come from the schema.
    valid_values: Mapping[str, Sequence[str]] = field(default_factory=dict)
    rotate_secret: bool = False
    has_secret: bool = False
    # Name of gpufarm's own incident type: created when missing; its fields, rules and incidents are gpufarm's.
    incident_type: str = DEFAULT_INCIDENT_TYPE
    # The idle monitors the farm's policy asks for; None: monitors are not managed (no farm configuration given).
    monitors: Sequence[IdleMonitor] | None = None
    # Delete gpufarm's monitors and dashboards the farm no longer asks for (without it they are only reported).
    prune: bool = False
    # gpufarm's dashboards (gpufarm.setup.dashboards); None: dashboards are not managed (no farm configuration).
    dashboards: Sequence[DashboardSpec] | None = None
    # Metric metadata to send, per metric (gpufarm.setup.dashboards.desired_metadata); None: not managed.
    metric_metadata: Mapping[str, Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class CurrentState:
    """What Datadog holds now, as plain JSON-shaped data."""

    incident_types: list[dict[str, Any]]
    # User-defined fields of gpufarm's incident type only ([] while the type does not exist).
    fields: list[dict[str, Any]]
    webhooks: dict[str, dict[str, Any] | None]
    variable: dict[str, Any] | None
    rules: list[dict[str, Any]]
    # gpufarm's monitors (tagged gpufarm:managed); read only when the spec manages monitors.
    monitors: list[dict[str, Any]] = field(default_factory=list)
    # gpufarm's dashboards (those with its ownership marker), whole; read only when the spec manages dashboards.
    dashboards: list[dict[str, Any]] = field(default_factory=list)
    # Each managed metric's metadata as Datadog holds it (None: Datadog does not know the metric yet).
    metric_metadata: dict[str, dict[str, Any] | None] = field(default_factory=dict)


# -- desired state ------------------------------------------------------------------------------------------


def check_url(name: str, url: str | None) -> str:
    """A webhook target: an absolute http(s) URL."""
    text = (url or "").strip()
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValidationFailed(name, f"{name} must be an absolute http(s) URL")
    return text


def desired_fields(valid_values: Mapping[str, Sequence[str]]) -> list[tuple[f.FieldSpec, dict[str, Any] | None]]:
    """Each schema field with the attributes it should have (None: dynamic choices not given)."""
    out: list[tuple[f.FieldSpec, dict[str, Any] | None]] = []
    for spec in f.SCHEMA:
        attributes: dict[str, Any] = {
            "name": spec.name,
            "display_name": spec.display_name,
            "type": int(f.TYPE_CODE[spec.kind]),
        }
        if spec.kind in (f.FieldKind.DROPDOWN, f.FieldKind.MULTISELECT):
            values = spec.valid_values if spec.valid_values is not None else valid_values.get(spec.name)
            if values is None:
                out.append((spec, None))
                continue
            attributes["valid_values"] = [{"value": v, "display_name": v} for v in _checked_values(spec.name, values)]
        out.append((spec, attributes))
    return out


def _checked_values(name: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str):
        raise ValidationFailed(name, f"valid values of {name} must be a list")
    seen: list[str] = []
    for value in values:
        text = str(value).strip()
        if not text or len(text) > 100 or any(not ch.isprintable() for ch in text):
            raise ValidationFailed(name, f"{name}: {text[:40]!r} is not a usable dropdown value")
        if text not in seen:
            seen.append(text)
    if not seen:
        raise ValidationFailed(name, f"{name} needs at least one valid value")
    if len(seen) > MAX_VALID_VALUES:
        raise ValidationFailed(name, f"{name} has {len(seen)} values; Datadog allows {MAX_VALID_VALUES}")
    return seen


def desired_webhooks(spec: SetupSpec) -> list[dict[str, Any]]:
    """The two webhooks, in Datadog's webhook JSON (URLs as given; planning checks them)."""
    return [
        {
            "name": INCIDENT_WEBHOOK,
            "url": spec.incident_webhook_url.strip(),
            "payload": INCIDENT_PAYLOAD,
            "custom_headers": CUSTOM_HEADERS,
            "encode_as": "json",
        },
        {
            "name": IDLE_WEBHOOK,
            "url": spec.idle_webhook_url.strip(),
            "payload": IDLE_PAYLOAD,
            "custom_headers": CUSTOM_HEADERS,
            "encode_as": "json",
        },
    ]


_URL_SOURCES = {
    INCIDENT_WEBHOOK: f"--incident-webhook-url or {INCIDENT_WEBHOOK_URL_ENV}",
    IDLE_WEBHOOK: f"--idle-webhook-url or {IDLE_WEBHOOK_URL_ENV}",
}


def desired_rules() -> list[dict[str, Any]]:
    """Notification rules: every new incident, and every state or phase change, calls the incident webhook."""
    base = {
        "conditions": [{"field": "state", "values": list(ALL_STATES)}],
        "handles": [INCIDENT_HANDLE],
        "enabled": True,
        "visibility": "organization",
    }
    return [
        # renotify_on is left empty on the created rule so a later change is announced once (by the other rule).
        {**base, "trigger": "incident_created_trigger", "renotify_on": []},
        {**base, "trigger": "incident_modified_trigger", "renotify_on": list(RENOTIFY_ON)},
    ]


# -- planning (pure) -----------------------------------------------------------------------------------------


def plan_setup(current: CurrentState, spec: SetupSpec) -> Plan:
    """Compare what Datadog holds with what gpufarm needs; nothing is called here."""
    type_change, type_id = _plan_incident_type(current.incident_types, spec.incident_type)
    type_ready = type_change.action is not Action.BLOCKED
    changes: list[Change] = [type_change]
    changes += _plan_fields(current.fields if type_id else [], type_id, type_ready, spec.valid_values)
    changes.append(_plan_variable(current.variable, spec))
    changes += [_plan_webhook(current.webhooks.get(w["name"]), w) for w in desired_webhooks(spec)]
    changes += _plan_rules(current.rules, type_id, spec.incident_type)
    if spec.monitors is not None:
        changes += plan_monitors(current.monitors, spec.monitors, prune=spec.prune)
    if spec.dashboards is not None:
        changes += plan_dashboards(current.dashboards, spec.dashboards, prune=spec.prune)
    if spec.metric_metadata is not None:
        changes += plan_metadata(current.metric_metadata, spec.metric_metadata)
    return Plan(tuple(changes), type_id, spec.incident_type)


def _type_name(definition: Mapping[str, Any]) -> str:
    return str((definition.get("attributes") or {}).get("name") or "")


def gpufarm_types(types: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    """The incident types carrying gpufarm's type name (exactly one once apply has run)."""
    return [t for t in types if _type_name(t) == name]


def _plan_incident_type(types: list[dict[str, Any]], name: str) -> tuple[Change, str | None]:
    kind = "incident type"
    named = gpufarm_types(types, name)
    if not named:
        body = {"name": name, "description": INCIDENT_TYPE_DESCRIPTION}
        return Change(kind, name, Action.CREATE, "gpufarm's incidents, fields and rules", body), None
    if len(named) > 1:
        ids = ", ".join(str(t.get("id")) for t in named)
        detail = f"{len(named)} incident types have this name ({ids}); rename or delete all but one"
        return Change(kind, name, Action.BLOCKED, detail), None
    target = named[0]
    type_id = str(target.get("id"))
    if (target.get("attributes") or {}).get("is_default"):
        detail = (
            "is the organization's default type, which every other incident gets too; "
            "name a type of gpufarm's own with --incident-type or GPUFARM_INCIDENT_TYPE"
        )
        return Change(kind, name, Action.BLOCKED, detail, target_id=type_id), None
    return Change(kind, name, Action.UNCHANGED, type_id, target_id=type_id), type_id


def _field_type_id(definition: Mapping[str, Any]) -> str | None:
    rel = ((definition.get("relationships") or {}).get("incident_type") or {}).get("data") or {}
    return str(rel["id"]) if rel.get("id") else None


def _plan_fields(
    existing: list[dict[str, Any]],
    type_id: str | None,
    type_ready: bool,
    valid_values: Mapping[str, Sequence[str]],
) -> list[Change]:
    by_name = _fields_by_name(existing, type_id)
    return [
        _plan_field(spec.name, wanted, by_name.get(spec.name), type_ready)
        for spec, wanted in desired_fields(valid_values)
    ]


def _fields_by_name(existing: list[dict[str, Any]], type_id: str | None) -> dict[str, dict[str, Any]]:
    """gpufarm's field definitions by name (the first of each name, deleted ones left out)."""
    # Only fields of gpufarm's type are gpufarm's; one of the same name on another type is someone else's.
    by_name: dict[str, dict[str, Any]] = {}
    for definition in existing:
        attrs = definition.get("attributes") or {}
        if attrs.get("deleted") or _field_type_id(definition) not in (None, type_id):
            continue
        by_name.setdefault(str(attrs.get("name")), definition)
    return by_name


def _plan_field(name: str, wanted: dict[str, Any] | None, current: dict[str, Any] | None, type_ready: bool) -> Change:
    """One schema field against its definition in Datadog (None: not there); `wanted` None: choices not given."""
    if wanted is None:
        if current is None:
            detail = "its choices come from the farm configuration: pass --farm-config or set GPUFARM_FARM_CONFIG"
            return Change("field", name, Action.BLOCKED, detail)
        return Change("field", name, Action.UNCHANGED, "choices kept (no farm configuration given)")
    if current is None:
        action = Action.CREATE if type_ready else Action.BLOCKED
        detail = "" if type_ready else "needs gpufarm's incident type"
        return Change("field", name, action, detail, wanted)
    attrs = current.get("attributes") or {}
    if attrs.get("type") != wanted["type"]:
        detail = (
            f"exists with type code {attrs.get('type')}, gpufarm needs {wanted['type']}; "
            "Datadog cannot change a field's type: delete or rename the existing field"
        )
        return Change("field", name, Action.BLOCKED, detail, target_id=str(current.get("id")))
    differs = _field_differences(attrs, wanted)
    update = {k: v for k, v in wanted.items() if k in ("display_name", "valid_values")}
    action = Action.UPDATE if differs else Action.UNCHANGED
    return Change("field", name, action, ", ".join(differs), update, str(current.get("id")), tuple(differs))


def _field_differences(attrs: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    differs = []
    if attrs.get("display_name") != wanted["display_name"]:
        differs.append("display name")
    if "valid_values" in wanted:
        choices = _choice_difference(attrs.get("valid_values") or [], wanted["valid_values"])
        differs += [choices] if choices else []
    return differs


def _choice_difference(held: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, Any]]) -> str | None:
    """How a dropdown's choices differ (`choices +a -b`, or `choice order`); None when they do not."""
    have = [(v.get("value"), v.get("display_name")) for v in held]
    want = [(v["value"], v["display_name"]) for v in wanted]
    if have == want:
        return None
    added = sorted({w[0] for w in want} - {h[0] for h in have})
    removed = sorted({str(h[0]) for h in have} - {w[0] for w in want})
    parts = [f"+{', '.join(added)}" if added else "", f"-{', '.join(removed)}" if removed else ""]
    return "choices " + " ".join(p for p in parts if p) if added or removed else "choice order"


def _plan_variable(current: dict[str, Any] | None, spec: SetupSpec) -> Change:
    needs_value = "set GPUFARM_WEBHOOK_SECRET (the shared secret the webhook handlers check)"
    if current is None:
        if not spec.has_secret:
            return Change("custom variable", SECRET_VARIABLE, Action.BLOCKED, needs_value)
        return Change("custom variable", SECRET_VARIABLE, Action.CREATE, "secret", {"is_secret": True})
    if not current.get("is_secret"):
        if not spec.has_secret:
            return Change(
                "custom variable", SECRET_VARIABLE, Action.BLOCKED, f"exists but is not secret; {needs_value}"
            )
        return Change(
            "custom variable",
            SECRET_VARIABLE,
            Action.UPDATE,
            "make it secret",
            {"is_secret": True},
            differences=("is_secret", "value"),
        )
    if spec.rotate_secret:
        if not spec.has_secret:
            return Change("custom variable", SECRET_VARIABLE, Action.BLOCKED, f"cannot rotate; {needs_value}")
        return Change(
            "custom variable",
            SECRET_VARIABLE,
            Action.UPDATE,
            "rotate secret value",
            {"is_secret": True},
            differences=("value",),
        )
    return Change(
        "custom variable",
        SECRET_VARIABLE,
        Action.UNCHANGED,
        "secret values cannot be read back; --rotate-secret writes it again",
    )


def _plan_webhook(current: dict[str, Any] | None, wanted: dict[str, Any]) -> Change:
    name = str(wanted["name"])
    try:
        check_url(name, wanted["url"])
    except ValidationFailed:
        detail = f"needs an absolute http(s) URL: set {_URL_SOURCES.get(name, 'its URL')}"
        return Change("webhook", name, Action.BLOCKED, detail)
    if current is None:
        return Change("webhook", name, Action.CREATE, wanted["url"], wanted)
    differs = [
        key
        for key in ("url", "payload", "encode_as")
        if (current.get(key) or ("json" if key == "encode_as" else None)) != wanted[key]
    ]
    if _json_or_text(current.get("custom_headers")) != _json_or_text(wanted["custom_headers"]):
        differs.append("custom_headers")
    if not differs:
        return Change("webhook", name, Action.UNCHANGED)
    update = {k: v for k, v in wanted.items() if k != "name"}
    return Change("webhook", name, Action.UPDATE, ", ".join(differs), update, differences=tuple(differs))


def _json_or_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _rule_type_id(rule: Mapping[str, Any]) -> str | None:
    return _field_type_id(rule)


def _rule_differences(attrs: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    def conditions(a: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
        return sorted(
            (str(c.get("field")), tuple(sorted(str(v) for v in c.get("values") or [])))
            for c in a.get("conditions") or []
        )

    differs = []
    if conditions(attrs) != conditions(wanted):
        differs.append("conditions")
    differs += [k for k in ("handles", "renotify_on") if sorted(attrs.get(k) or []) != sorted(wanted.get(k) or [])]
    if bool(attrs.get("enabled", True)) != bool(wanted["enabled"]):
        differs.append("enabled")
    if (attrs.get("visibility") or "organization") != wanted["visibility"]:
        differs.append("visibility")
    return differs


def _plan_rules(existing: list[dict[str, Any]], type_id: str | None, type_name: str) -> list[Change]:
    return [_plan_rule(_calling(existing, w["trigger"]), w, type_id, type_name) for w in desired_rules()]


def _calling(existing: list[dict[str, Any]], trigger: str) -> list[dict[str, Any]]:
    """The rules on `trigger` that call gpufarm's incident webhook, on any incident type."""
    return [
        r
        for r in existing
        if (r.get("attributes") or {}).get("trigger") == trigger
        and INCIDENT_HANDLE in ((r.get("attributes") or {}).get("handles") or [])
    ]


def _plan_rule(calling: list[dict[str, Any]], wanted: dict[str, Any], type_id: str | None, type_name: str) -> Change:
    """The rule a trigger needs, against the rules already calling the webhook on it."""
    trigger = wanted["trigger"]
    # Ours: on gpufarm's type. A rule calling the webhook from another type is an older gpufarm's: moved over.
    ours = [r for r in calling if type_id is not None and _rule_type_id(r) == type_id]
    others = [r for r in calling if r not in ours]
    if not ours and not others:
        return Change("notification rule", trigger, Action.CREATE, INCIDENT_HANDLE, wanted)
    rule = ours[0] if ours else others[0]
    rest = len(calling) - 1
    extra = f" ({rest} more rule(s) call the webhook on this trigger; left as they are)" if rest else ""
    differs = _rule_differences(rule.get("attributes") or {}, wanted)
    if not ours:
        differs.append("incident type")
    target = str(rule.get("id"))
    if not differs:
        return Change("notification rule", trigger, Action.UNCHANGED, extra.strip(), target_id=target)
    detail = ", ".join(differs) + (f" (moves it to incident type {type_name!r})" if not ours else "") + extra
    return Change("notification rule", trigger, Action.UPDATE, detail, wanted, target, tuple(differs))
