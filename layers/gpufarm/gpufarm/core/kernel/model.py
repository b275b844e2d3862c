"""Requests and allocations: what a researcher asks for and what an incident holds."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.field_values import decode_host_gpus as decode_host_gpus  # noqa: PLC0414
from gpufarm.core.kernel.field_values import encode_host_gpus as encode_host_gpus  # noqa: PLC0414
from gpufarm.core.kernel.field_values import enum as _enum
from gpufarm.core.kernel.field_values import hours as _hours
from gpufarm.core.kernel.field_values import isoformat as isoformat  # noqa: PLC0414
from gpufarm.core.kernel.field_values import items as _list
from gpufarm.core.kernel.field_values import parse_time as parse_time  # noqa: PLC0414
from gpufarm.core.kernel.field_values import text as _text
from gpufarm.core.kernel.field_values import whole as _int
from gpufarm.core.kernel.ir import format_ir, ir_tag
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State
from gpufarm.core.kernel.names import NAME_PATTERN as NAME_PATTERN  # noqa: PLC0414
from gpufarm.core.kernel.names import lower_name as _lower_name
from gpufarm.core.kernel.names import validate_name as validate_name  # noqa: PLC0414

GPU_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,31}$"
SLACK_USER_PATTERN = r"^[UW][A-Z0-9]{2,20}$"
MAX_GPU_COUNT = 4096
MAX_DURATION_DAYS = 365
MAX_PURPOSE = 500


def _no_control(text: str) -> str:
    if any(not ch.isprintable() for ch in text):
        raise ValueError("must not contain control characters")
    return text


Name = Annotated[str, AfterValidator(_lower_name)]
GpuModel = Annotated[str, Field(pattern=GPU_MODEL_PATTERN), AfterValidator(str.upper)]
Purpose = Annotated[str, Field(max_length=MAX_PURPOSE), AfterValidator(_no_control)]


# The request id prefix of `gpufarm doctor`'s probe incidents (gpufarm.core.leases.probe).
PROBE_PREFIX = "doctor-"
# The kind field of a quota override's incident (gpufarm.core.accounting.overrides): never a lease.
QUOTA_OVERRIDE = f.QUOTA_OVERRIDE


class GpuRequest(BaseModel):
    """A researcher's request for GPUs, validated before anything is created."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    team: Name
    project: Name
    gpu_model: GpuModel
    gpu_count: int = Field(ge=1, le=MAX_GPU_COUNT)
    environment: Name
    duration_days: int = Field(default=7, ge=1, le=MAX_DURATION_DAYS)
    purpose: Purpose = ""
    requester: str = Field(pattern=SLACK_USER_PATTERN)
    channel: str | None = Field(default=None, pattern=r"^[CDG][A-Z0-9]{2,20}$")
    request_id: str = Field(min_length=8, max_length=80, pattern=r"^[A-Za-z0-9_.:\-]+$")
    # The lease's own idle window and grace in minutes, chosen within the pool's bounds
    # (gpufarm.core.governance.idle_choice).
    idle_window_minutes: int | None = Field(default=None, ge=1, le=7 * 24 * 60)
    idle_grace_minutes: int | None = Field(default=None, ge=1, le=7 * 24 * 60)
    # A reservation's window on the pool's calendar (gpufarm.core.calendar); both or neither.
    reserved_from: datetime | None = None
    reserved_until: datetime | None = None

    @model_validator(mode="after")
    def _window_whole(self) -> GpuRequest:
        if (self.reserved_from is None) != (self.reserved_until is None):
            raise ValueError("a reservation names both its start and its end")
        start, end = self.reserved_from, self.reserved_until
        if start is not None and end is not None and (start.tzinfo is None or end <= start):
            raise ValueError("a reservation's window is a UTC start before its end")
        return self

    @property
    def is_reservation(self) -> bool:
        """True for a booking on the pool's calendar rather than a lease from now."""
        return self.reserved_from is not None

    def title(self) -> str:
        """Incident title people see in Datadog."""
        kind = "GPU reservation" if self.is_reservation else "GPU request"
        return f"{kind}: {self.team}/{self.project} {self.gpu_count}x{self.gpu_model} ({self.environment})"

    def to_fields(self, phase: Phase, now: datetime) -> dict[str, object]:
        """Field values of a freshly created incident."""
        return {
            f.STATE: State.ACTIVE.value,
            f.PHASE: phase.value,
            f.TEAM: self.team,
            f.PROJECT: self.project,
            f.GPU_MODEL: self.gpu_model,
            f.GPU_COUNT: str(self.gpu_count),
            f.ENVIRONMENT: self.environment,
            f.REQUESTER: self.requester,
            f.PURPOSE: self.purpose or None,
            f.DURATION_DAYS: str(self.duration_days),
            f.EXPIRES_AT: isoformat(now + timedelta(days=self.duration_days)),
            f.REQUEST_ID: self.request_id,
            f.SLACK_CHANNEL: self.channel,
            **({f.IDLE_WINDOW_MINUTES: str(self.idle_window_minutes)} if self.idle_window_minutes else {}),
            **({f.IDLE_GRACE_MINUTES: str(self.idle_grace_minutes)} if self.idle_grace_minutes else {}),
            **self._window_fields(),
        }

    def _window_fields(self) -> dict[str, object]:
        if self.reserved_from is None or self.reserved_until is None:
            return {}
        # A reservation's lease ends with its window, whenever its hosts come.
        return {
            f.RESERVED_FROM: isoformat(self.reserved_from),
            f.RESERVED_UNTIL: isoformat(self.reserved_until),
            f.EXPIRES_AT: isoformat(self.reserved_until),
        }


class IncidentRecord(BaseModel):
    """An incident as any adapter returns it, independent of the Datadog client's models."""

    # Built on first use: the Slack ingress imports this module but never reads an incident.
    model_config = ConfigDict(frozen=True, defer_build=True)

    id: str
    public_id: int
    title: str
    state: str | None = None
    fields: dict[str, f.FieldValue] = Field(default_factory=dict)
    created: datetime | None = None
    modified: datetime | None = None
    resolved: datetime | None = None


class Allocation(BaseModel):
    """The allocation an incident holds, decoded from its fields."""

    # Built on first use, as IncidentRecord.
    model_config = ConfigDict(frozen=True, defer_build=True)

    incident_id: str
    ir: int
    title: str
    state: State
    phase: Phase
    team: str | None = None
    project: str | None = None
    gpu_model: str | None = None
    gpu_count: int = 0
    environment: str | None = None
    requester: str | None = None
    purpose: str | None = None
    duration_days: int | None = None
    expires_at: datetime | None = None
    hosts: tuple[str, ...] = ()
    host_gpus: dict[str, int] = Field(default_factory=dict)
    # `host=<unit>` entries of the units held on a shared pool, as stored (decoded by gpufarm.core.kernel.units).
    devices: tuple[str, ...] = ()
    approved_by: str | None = None
    idle_warned_at: datetime | None = None
    # Lease semantics (gpufarm.core.leases.terms).
    allocated_at: datetime | None = None
    waiting_since: datetime | None = None
    expiry_reminded: datetime | None = None
    # `part=time` and `part=gpus@time` entries, as stored (decoded by gpufarm.core.idle.partial).
    idle_parts: tuple[str, ...] = ()
    idle_returned: tuple[str, ...] = ()
    reclaim_reason: ReclaimReason | None = None
    request_id: str | None = None
    slack_channel: str | None = None
    slack_message: str | None = None
    history: tuple[str, ...] = ()
    # The code of the latest reason (gpufarm.core.kernel.reason_trail), as stored.
    reason: str | None = None
    # The lease's own idle window and grace in minutes, when chosen at request time (gpufarm.core.idle.lease_window).
    idle_window_minutes: int | None = None
    idle_grace_minutes: int | None = None
    idle_pending: datetime | None = None
    keep_count: int = 0
    kept_until: datetime | None = None
    exempt_until: datetime | None = None
    exempt_by: str | None = None
    # Accrued GPU-hours (gpufarm.core.accounting.gpu_hours): held, busy, idle, unmeasured, up to when, held per month.
    hours_held: float = 0.0
    hours_busy: float = 0.0
    hours_idle: float = 0.0
    # Of hours_idle, those with memory held and no work (idle-held).
    hours_idle_held: float = 0.0
    hours_unmeasured: float = 0.0
    hours_until: datetime | None = None
    hours_by_month: tuple[str, ...] = ()
    # Open squatting episodes on the lease's devices, as stored (decoded by gpufarm.core.squatters.episodes).
    squatters: tuple[str, ...] = ()
    # Lending (gpufarm.core.leases.lending, .preemption): GPUs borrowed beyond quota, the notice's deadline and whom.
    borrowed: int = 0
    preempt_at: datetime | None = None
    preempt_for: str | None = None
    # A quota override's kind, change and end (gpufarm.core.accounting.overrides); a lease has no kind.
    kind: str | None = None
    quota_delta: int | None = None
    quota_until: datetime | None = None
    # A reservation's window (gpufarm.core.calendar); None for a lease from now.
    reserved_from: datetime | None = None
    reserved_until: datetime | None = None
    modified: datetime | None = None

    @property
    def is_probe(self) -> bool:
        """True for `gpufarm doctor`'s scratch incident (gpufarm.core.leases.probe): never a lease."""
        return (self.request_id or "").startswith(PROBE_PREFIX)

    @property
    def is_quota_override(self) -> bool:
        """True for a quota change's incident (gpufarm.core.accounting.overrides): never a lease."""
        return self.kind == QUOTA_OVERRIDE

    @property
    def is_budget_period(self) -> bool:
        """True for a budget period's incident (gpufarm.core.accounting.budget_alerts): never a lease."""
        return self.kind == f.BUDGET_PERIOD

    @property
    def ir_label(self) -> str:
        """`IR-123`."""
        return format_ir(self.ir)

    @property
    def ir_tag(self) -> str:
        """`ir:ir-123`."""
        return ir_tag(self.ir)

    @classmethod
    def from_record(cls, record: IncidentRecord) -> Allocation:
        """Decode an incident; missing or malformed gpufarm fields fall back to safe defaults."""
        v = record.fields
        state = _enum(State, record.state or _text(v.get(f.STATE)), State.ACTIVE)
        phase = _enum(Phase, _text(v.get(f.PHASE)), Phase.REQUESTED)
        return cls(
            incident_id=record.id,
            ir=record.public_id,
            title=record.title,
            state=state,
            phase=phase,
            team=_text(v.get(f.TEAM)),
            project=_text(v.get(f.PROJECT)),
            gpu_model=_text(v.get(f.GPU_MODEL)),
            gpu_count=_int(v.get(f.GPU_COUNT)) or 0,
            environment=_text(v.get(f.ENVIRONMENT)),
            requester=_text(v.get(f.REQUESTER)),
            purpose=_text(v.get(f.PURPOSE)),
            duration_days=_int(v.get(f.DURATION_DAYS)),
            expires_at=parse_time(_text(v.get(f.EXPIRES_AT))),
            hosts=tuple(_list(v.get(f.HOSTS))),
            host_gpus=decode_host_gpus(_list(v.get(f.HOST_GPUS))),
            devices=tuple(_list(v.get(f.DEVICES))),
            approved_by=_text(v.get(f.APPROVED_BY)),
            idle_warned_at=parse_time(_text(v.get(f.IDLE_WARNED_AT))),
            allocated_at=parse_time(_text(v.get(f.ALLOCATED_AT))),
            waiting_since=parse_time(_text(v.get(f.WAITING_SINCE))),
            expiry_reminded=parse_time(_text(v.get(f.EXPIRY_REMINDED))),
            idle_parts=tuple(_list(v.get(f.IDLE_PARTS))),
            idle_returned=tuple(_list(v.get(f.IDLE_RETURNED))),
            reclaim_reason=_enum(ReclaimReason, _text(v.get(f.RECLAIM_REASON)), None),
            request_id=_text(v.get(f.REQUEST_ID)),
            slack_channel=_text(v.get(f.SLACK_CHANNEL)),
            slack_message=_text(v.get(f.SLACK_MESSAGE)),
            history=tuple(_list(v.get(f.HISTORY))),
            reason=_text(v.get(f.REASON)),
            idle_window_minutes=_int(v.get(f.IDLE_WINDOW_MINUTES)),
            idle_grace_minutes=_int(v.get(f.IDLE_GRACE_MINUTES)),
            idle_pending=parse_time(_text(v.get(f.IDLE_PENDING))),
            keep_count=_int(v.get(f.KEEP_COUNT)) or 0,
            kept_until=parse_time(_text(v.get(f.KEPT_UNTIL))),
            exempt_until=parse_time(_text(v.get(f.EXEMPT_UNTIL))),
            exempt_by=_text(v.get(f.EXEMPT_BY)),
            hours_held=_hours(v.get(f.GPU_HOURS_HELD)),
            hours_busy=_hours(v.get(f.GPU_HOURS_BUSY)),
            hours_idle=_hours(v.get(f.GPU_HOURS_IDLE)),
            hours_idle_held=_hours(v.get(f.GPU_HOURS_IDLE_HELD)),
            hours_unmeasured=_hours(v.get(f.GPU_HOURS_UNMEASURED)),
            hours_until=parse_time(_text(v.get(f.GPU_HOURS_UNTIL))),
            hours_by_month=tuple(_list(v.get(f.GPU_HOURS_BY_MONTH))),
            squatters=tuple(_list(v.get(f.SQUATTERS))),
            borrowed=max(0, _int(v.get(f.BORROWED)) or 0),
            preempt_at=parse_time(_text(v.get(f.PREEMPT_AT))),
            preempt_for=_text(v.get(f.PREEMPT_FOR)),
            kind=_text(v.get(f.KIND)),
            quota_delta=_int(v.get(f.QUOTA_DELTA)),
            quota_until=parse_time(_text(v.get(f.QUOTA_UNTIL))),
            reserved_from=parse_time(_text(v.get(f.RESERVED_FROM))),
            reserved_until=parse_time(_text(v.get(f.RESERVED_UNTIL))),
            modified=record.modified,
        )
