"""The incident field schema in one place: names, Datadog field types, encoding and decoding."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason


class FieldKind(StrEnum):
    """Datadog incident field value types this project uses."""

    DROPDOWN = "dropdown"
    MULTISELECT = "multiselect"
    TEXTBOX = "textbox"
    TEXTARRAY = "textarray"

    @property
    def multiple(self) -> bool:
        """True for kinds whose value is a list."""
        return self in (FieldKind.MULTISELECT, FieldKind.TEXTARRAY)


class FieldTypeCode(IntEnum):
    """Type codes of user-defined field definitions (`/api/v2/incidents/config/user-defined-fields`)."""

    DROPDOWN = 1
    MULTISELECT = 2
    TEXTBOX = 3
    TEXTARRAY = 4


TYPE_CODE: dict[FieldKind, FieldTypeCode] = {
    FieldKind.DROPDOWN: FieldTypeCode.DROPDOWN,
    FieldKind.MULTISELECT: FieldTypeCode.MULTISELECT,
    FieldKind.TEXTBOX: FieldTypeCode.TEXTBOX,
    FieldKind.TEXTARRAY: FieldTypeCode.TEXTARRAY,
}


@dataclass(frozen=True)
class FieldSpec:
    """One incident field gpufarm owns."""

    name: str
    display_name: str
    kind: FieldKind
    description: str
    # Static choices for dropdowns; None means the choices come from the farm configuration at apply time.
    valid_values: tuple[str, ...] | None = None


# Counts and times are textboxes on purpose: the client's value-type enums lack number/datetime, which
# would deserialize as `_unparsed` (docs/datadog.md, "Custom field definitions").
STATE = "state"
PHASE = "phase"
TEAM = "team"
PROJECT = "project"
GPU_MODEL = "gpu_model"
GPU_COUNT = "gpu_count"
ENVIRONMENT = "environment"
REQUESTER = "requester"
PURPOSE = "purpose"
DURATION_DAYS = "duration_days"
EXPIRES_AT = "expires_at"
HOSTS = "hosts"
HOST_GPUS = "host_gpus"
APPROVED_BY = "approved_by"
IDLE_WARNED_AT = "idle_warned_at"
RECLAIM_REASON = "reclaim_reason"
REQUEST_ID = "request_id"
SLACK_CHANNEL = "slack_channel"
SLACK_MESSAGE = "slack_message"
# Lease semantics (gpufarm.core.leases.terms): when hosts were allocated (the lease's days count from then), since when
# an approved request has waited for hosts, and the expiry its one reminder was sent for.
ALLOCATED_AT = "allocated_at"
WAITING_SINCE = "waiting_since"
EXPIRY_REMINDED = "expiry_reminded"
# The dedup ids of the last incident commands that wrote this incident, written in the same PATCH as each change,
# so a command redelivered after its write landed (its call still failed) is answered, not applied twice.
LAST_COMMANDS = "gpufarm_last_commands"
LAST_COMMANDS_KEPT = 10
# The units a lease holds on shared pools, one `host=<unit>` entry each (gpufarm.core.kernel.units): which GPUs or MIG
# slices are its, by index, uuid and profile.
DEVICES = "gpufarm_devices"
# Per host (or `host/uuid` device) of a lease: when it was warned idle, and what the lease gave back idle
# (gpufarm.core.idle.partial), so one idle host of a busy lease is judged, cleared and returned on its own.
IDLE_PARTS = "gpufarm_idle_parts"
IDLE_RETURNED = "gpufarm_idle_returned"
# The code of the latest reason the lease waits, was refused or ended (gpufarm.core.kernel.reason_trail); its sentence
# is the history line that carries the same `[code]`.
REASON = "gpufarm_reason"
# The month (YYYY-MM, UTC) a lease ended in with its reason, so the reports find ends that held no GPU-hours
# (refused, rejected, withdrawn, cancelled) by month, as they find the others by gpu_hours_months.
REASON_MONTH = "gpufarm_reason_month"
# The lease's own idle window and grace, chosen at request time within the pool's bounds
# (gpufarm.core.idle.lease_window).
IDLE_WINDOW_MINUTES = "idle_window_minutes"
IDLE_GRACE_MINUTES = "idle_grace_minutes"
# Since when a lease with its own idle window is idle, while a monitor's alert waits for that window to pass.
IDLE_PENDING = "gpufarm_idle_pending"
# The lease's audit trail: one line per step, appended in the same PATCH as the change (gpufarm.core.kernel.history).
HISTORY = "gpufarm_history"
# Bounded keeps and operator exemptions (gpufarm.core.idle.keeps).
KEEP_COUNT = "keep_count"
KEPT_UNTIL = "kept_until"
EXEMPT_UNTIL = "exempt_until"
EXEMPT_BY = "exempt_by"
# GPU-hours the lease held, and of those busy, idle, or unmeasured (no metrics), accrued by the sync up to
# `gpu_hours_until` and finally when the lease ends; held hours per calendar month for the budgets
# (gpufarm.core.accounting.gpu_hours), so a report is rebuilt from incidents alone once metrics retention has passed.
GPU_HOURS_HELD = "gpu_hours_held"
GPU_HOURS_BUSY = "gpu_hours_busy"
GPU_HOURS_IDLE = "gpu_hours_idle"
# Of the idle GPU-hours, those whose devices held memory with no work on them (the agent's idle_held state).
GPU_HOURS_IDLE_HELD = "gpu_hours_idle_held"
GPU_HOURS_UNMEASURED = "gpu_hours_unmeasured"
GPU_HOURS_UNTIL = "gpu_hours_until"
GPU_HOURS_BY_MONTH = "gpu_hours_by_month"
# The months of gpu_hours_by_month as plain values, so a search asks for them without a wildcard inside a list value.
GPU_HOURS_MONTHS = "gpu_hours_months"
# The lease's open squatting episodes, `<host>/<uuid>=<since>[;stop=<time>]` each (gpufarm.core.squatters.episodes):
# who was told once, since when, and when the squatter's stop was published.
SQUATTERS = "gpufarm_squatters"
# Lending (gpufarm.core.leases.lending, gpufarm.core.leases.preemption): the GPUs a lease borrowed beyond its team's
# quota, and once the lending team needs them back, when it is reclaimed and for whom.
BORROWED = "gpufarm_borrowed"
PREEMPT_AT = "gpufarm_preempt_at"
PREEMPT_FOR = "gpufarm_preempt_for"
# What an incident of gpufarm's type is: a lease (the field empty) or a quota override (gpufarm.core.accounting
# .overrides), whose change of GPUs and end are its own fields.
KIND = "gpufarm_kind"
QUOTA_OVERRIDE = "quota-override"  # the kind of a quota change's incident
QUOTA_DELTA = "gpufarm_quota_delta"
QUOTA_UNTIL = "gpufarm_quota_until"
# A budget period's incident (gpufarm.core.accounting.budget_alerts): the period it records (`2026-12`, `2026-Q4`)
# and the alert thresholds already told in it, `<percent>=<time>` each, so each is told once per period.
BUDGET_PERIOD = "budget-period"  # the kind of a budget period's incident
BUDGET_PERIOD_LABEL = "gpufarm_budget_period"
BUDGET_ALERTS = "gpufarm_budget_alerts"
# A reservation's window on the pool's calendar (gpufarm.core.calendar): from when to when its GPUs are booked.
RESERVED_FROM = "reserved_from"
RESERVED_UNTIL = "reserved_until"

SCHEMA: tuple[FieldSpec, ...] = (
    FieldSpec(
        PHASE, "GPU phase", FieldKind.DROPDOWN, "Where the allocation is in its life", tuple(p.value for p in Phase)
    ),
    FieldSpec(TEAM, "Team", FieldKind.DROPDOWN, "Team that owns the allocation"),
    FieldSpec(PROJECT, "Project", FieldKind.TEXTBOX, "AI project the GPUs are for"),
    FieldSpec(GPU_MODEL, "GPU model", FieldKind.DROPDOWN, "GPU model requested"),
    FieldSpec(GPU_COUNT, "GPU count", FieldKind.TEXTBOX, "Number of GPUs requested"),
    FieldSpec(ENVIRONMENT, "Environment", FieldKind.DROPDOWN, "Pool the GPUs come from"),
    FieldSpec(REQUESTER, "Requester", FieldKind.TEXTBOX, "Slack user id of the researcher"),
    FieldSpec(PURPOSE, "Purpose", FieldKind.TEXTBOX, "What the GPUs are for"),
    FieldSpec(DURATION_DAYS, "Duration (days)", FieldKind.TEXTBOX, "Days the allocation is granted for"),
    FieldSpec(EXPIRES_AT, "Expires at", FieldKind.TEXTBOX, "ISO 8601 UTC time the allocation ends"),
    FieldSpec(HOSTS, "GPU hosts", FieldKind.TEXTARRAY, "Hosts tagged with this IR"),
    FieldSpec(HOST_GPUS, "GPUs per host", FieldKind.TEXTARRAY, "host=count pairs of GPUs held on each host"),
    FieldSpec(APPROVED_BY, "Approved by", FieldKind.TEXTBOX, "policy, or the Slack user id of the operator"),
    FieldSpec(IDLE_WARNED_AT, "Idle warned at", FieldKind.TEXTBOX, "ISO 8601 UTC time of the last idle warning"),
    FieldSpec(
        RECLAIM_REASON,
        "Reclaim reason",
        FieldKind.DROPDOWN,
        "Why the allocation ended",
        tuple(r.value for r in ReclaimReason),
    ),
    FieldSpec(REQUEST_ID, "Request id", FieldKind.TEXTBOX, "Idempotency key of the Slack request"),
    FieldSpec(SLACK_CHANNEL, "Slack channel", FieldKind.TEXTBOX, "Channel the request came from"),
    FieldSpec(SLACK_MESSAGE, "Operator message", FieldKind.TEXTBOX, "channel/ts of the operators' approval message"),
    FieldSpec(
        ALLOCATED_AT, "Allocated at", FieldKind.TEXTBOX, "ISO 8601 UTC time hosts were allocated (days count from it)"
    ),
    FieldSpec(
        WAITING_SINCE, "Waiting since", FieldKind.TEXTBOX, "ISO 8601 UTC time the approved request began waiting"
    ),
    FieldSpec(
        EXPIRY_REMINDED, "Expiry reminded", FieldKind.TEXTBOX, "The expiry (ISO 8601 UTC) the holder was reminded of"
    ),
    FieldSpec(
        LAST_COMMANDS,
        "Last gpufarm commands",
        FieldKind.TEXTARRAY,
        "Ids of the last gpufarm commands applied (a redelivered one is not applied twice)",
    ),
    FieldSpec(
        DEVICES,
        "GPU devices",
        FieldKind.TEXTARRAY,
        "host=index[/uuid[/MIG profile]] of each GPU or MIG slice held on a shared pool",
    ),
    FieldSpec(
        IDLE_PARTS,
        "Idle hosts",
        FieldKind.TEXTARRAY,
        "host=time (or host/device=time) of each part of the lease warned idle and not busy since",
    ),
    FieldSpec(
        IDLE_RETURNED,
        "Returned idle",
        FieldKind.TEXTARRAY,
        "host=GPUs@time of each host (or device) the lease gave back idle while the rest stayed busy",
    ),
    FieldSpec(
        HISTORY,
        "GPU lease history",
        FieldKind.TEXTARRAY,
        "Every step of the lease, one line each: time, actor, step, details (append-only)",
    ),
    FieldSpec(REASON, "Reason", FieldKind.TEXTBOX, "Code of the latest reason it waits, was refused or ended"),
    FieldSpec(REASON_MONTH, "Reason month", FieldKind.TEXTBOX, "YYYY-MM (UTC) of the end its reason was given in"),
    FieldSpec(
        IDLE_WINDOW_MINUTES, "Idle window (min)", FieldKind.TEXTBOX, "Minutes idle before a warning, chosen at request"
    ),
    FieldSpec(
        IDLE_GRACE_MINUTES,
        "Idle grace (min)",
        FieldKind.TEXTBOX,
        "Minutes from an idle warning to reclaim, chosen at request",
    ),
    FieldSpec(IDLE_PENDING, "Idle since", FieldKind.TEXTBOX, "ISO 8601 UTC time idle since, while its own window runs"),
    FieldSpec(KEEP_COUNT, "Keeps used", FieldKind.TEXTBOX, "How many times Keep answered an idle warning"),
    FieldSpec(KEPT_UNTIL, "Kept until", FieldKind.TEXTBOX, "ISO 8601 UTC time the last Keep holds idle reclaim off"),
    FieldSpec(EXEMPT_UNTIL, "Exempt until", FieldKind.TEXTBOX, "ISO 8601 UTC end of an operator's idle exemption"),
    FieldSpec(EXEMPT_BY, "Exempted by", FieldKind.TEXTBOX, "Slack user id of the operator who granted the exemption"),
    FieldSpec(GPU_HOURS_HELD, "GPU-hours held", FieldKind.TEXTBOX, "GPU-hours the lease held, accrued by the sync"),
    FieldSpec(GPU_HOURS_BUSY, "GPU-hours busy", FieldKind.TEXTBOX, "Of the held GPU-hours, those the agents saw busy"),
    FieldSpec(GPU_HOURS_IDLE, "GPU-hours idle", FieldKind.TEXTBOX, "Of the held GPU-hours, those the agents saw idle"),
    FieldSpec(
        GPU_HOURS_IDLE_HELD,
        "GPU-hours idle-held",
        FieldKind.TEXTBOX,
        "Of the idle GPU-hours, those with memory held and no work",
    ),
    FieldSpec(
        GPU_HOURS_UNMEASURED,
        "GPU-hours unmeasured",
        FieldKind.TEXTBOX,
        "Of the held GPU-hours, those no metrics measured (never counted idle)",
    ),
    FieldSpec(GPU_HOURS_UNTIL, "GPU-hours until", FieldKind.TEXTBOX, "ISO 8601 UTC time the GPU-hours accrue up to"),
    FieldSpec(
        GPU_HOURS_BY_MONTH,
        "GPU-hours by month",
        FieldKind.TEXTARRAY,
        "YYYY-MM=hours of held GPU-hours per calendar month (UTC), for the GPU-hour budgets",
    ),
    FieldSpec(
        GPU_HOURS_MONTHS,
        "GPU-hours months",
        FieldKind.TEXTARRAY,
        "YYYY-MM of each month the lease accrued GPU-hours in (the months of GPU-hours by month)",
    ),
    FieldSpec(
        SQUATTERS,
        "Squatted devices",
        FieldKind.TEXTARRAY,
        "host/device=since[;stop=time] of each device of the lease squatted now, told once (and its stop)",
    ),
    FieldSpec(BORROWED, "GPUs borrowed", FieldKind.TEXTBOX, "GPUs of the lease beyond its team's quota, borrowed idle"),
    FieldSpec(
        PREEMPT_AT, "Preempted at", FieldKind.TEXTBOX, "ISO 8601 UTC time a borrowing lease is reclaimed on notice"
    ),
    FieldSpec(PREEMPT_FOR, "Preempted for", FieldKind.TEXTBOX, "The request of the lending team that needs the GPUs"),
    FieldSpec(
        KIND,
        "gpufarm kind",
        FieldKind.TEXTBOX,
        "Empty for a lease; quota-override for a quota change; budget-period for a budget's alerts",
    ),
    FieldSpec(QUOTA_DELTA, "Quota change", FieldKind.TEXTBOX, "Signed GPUs a quota override adds to the team's quota"),
    FieldSpec(QUOTA_UNTIL, "Quota change until", FieldKind.TEXTBOX, "ISO 8601 UTC end of a quota override"),
    FieldSpec(
        BUDGET_PERIOD_LABEL, "Budget period", FieldKind.TEXTBOX, "YYYY-MM or YYYY-Qn of a budget period's incident"
    ),
    FieldSpec(
        BUDGET_ALERTS,
        "Budget alerts told",
        FieldKind.TEXTARRAY,
        "percent=time of each budget threshold told in the period (told once)",
    ),
    FieldSpec(RESERVED_FROM, "Reserved from", FieldKind.TEXTBOX, "ISO 8601 UTC start of a reservation's window"),
    FieldSpec(RESERVED_UNTIL, "Reserved until", FieldKind.TEXTBOX, "ISO 8601 UTC end of a reservation's window"),
)

BY_NAME: dict[str, FieldSpec] = {spec.name: spec for spec in SCHEMA}

FieldValue = str | list[str] | None


def encode_fields(values: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    """Encode plain values into Datadog's `{type, value}` field objects; `state` is Datadog's own dropdown."""
    encoded: dict[str, dict[str, Any]] = {}
    for name, raw in values.items():
        kind = FieldKind.DROPDOWN if name == STATE else _spec(name).kind
        encoded[name] = {"type": kind.value, "value": _encode_value(kind, raw)}
    return encoded


def decode_fields(raw: Mapping[str, Any] | None) -> dict[str, FieldValue]:
    """Decode Datadog's field objects into plain values, keeping only strings and lists of strings."""
    return {name: decode_value(obj) for name, obj in (raw or {}).items()}


def decode_value(obj: Any) -> FieldValue:
    """One field object (`{type, value}`, or a bare value) as a plain value: a string, a list of strings, or None."""
    # A JSON object is a dict: tested first, as `isinstance(obj, Mapping)` goes through the ABC machinery, and a
    # pool's read decodes some 60 fields of each of thousands of incidents.
    value = obj.get("value") if type(obj) is dict or isinstance(obj, Mapping) else obj
    if value is None:
        return None
    if type(value) is str:
        return value
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value)


class FieldView(Mapping[str, FieldValue]):
    """Datadog's field objects read one field at a time, each decoded as decode_fields decodes it when asked for:
    a reader that needs a few of an incident's thirty fields decodes those few."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self._raw: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    def __getitem__(self, name: str) -> FieldValue:
        return decode_value(self._raw[name])

    def get(self, name: str, default: FieldValue = None) -> FieldValue:  # type: ignore[override]
        """The field decoded, `default` when the incident has no such field."""
        obj = self._raw.get(name, _ABSENT)
        return default if obj is _ABSENT else decode_value(obj)

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


_ABSENT = object()


def _spec(name: str) -> FieldSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"'{name}' is not a gpufarm incident field") from None


def _encode_value(kind: FieldKind, raw: object) -> str | list[str] | None:
    if raw is None:
        return None
    if kind.multiple:
        if isinstance(raw, str) or not isinstance(raw, (list, tuple, set, frozenset)):
            raise TypeError(f"a {kind.value} field takes a list of strings")
        return [str(v) for v in raw]
    if isinstance(raw, (list, tuple, set)):
        raise TypeError(f"a {kind.value} field takes a single value")
    return str(raw)
