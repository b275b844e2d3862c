"""A lease as a report reads it: the few fields it sums, decoded without a model per incident.

`Allocation` (gpufarm.core.kernel.model) decodes every field of an incident through a pydantic model, which the
lifecycle needs and a report of thousands of leases does not. `LeaseFacts` keeps what accounting and reports read
(who, where, what it holds, its accrued GPU-hours, its phase and end) in a slotted dataclass, each value decoded by
the same functions as the model (gpufarm.core.kernel.field_values), so a hand-edited or malformed field reads the
same either way. The history is kept as its stored lines and parsed only where a report counts its events.
A report that needs another field of the incident adds it here, in `decode` and in `of`, with the decoder of its kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from gpufarm.core.kernel import field_values as fv
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.ir import format_ir
from gpufarm.core.kernel.lifecycle import Phase, ReclaimReason, State

if TYPE_CHECKING:
    from gpufarm.core.kernel.model import Allocation


@dataclass(frozen=True, slots=True)
class LeaseFacts:
    """What a report needs of one lease (the names and meanings of Allocation's fields of the same names)."""

    ir: int
    state: State
    phase: Phase
    team: str | None = None
    project: str | None = None
    environment: str | None = None
    gpu_count: int = 0
    hosts: tuple[str, ...] = ()
    host_gpus: Mapping[str, int] = field(default_factory=dict)
    allocated_at: datetime | None = None
    reclaim_reason: ReclaimReason | None = None
    reason: str | None = None  # the latest reason code given (gpufarm.core.kernel.reason_trail)
    history: tuple[str, ...] = ()
    hours_held: float = 0.0
    hours_busy: float = 0.0
    hours_idle: float = 0.0
    hours_idle_held: float = 0.0
    hours_unmeasured: float = 0.0
    hours_until: datetime | None = None
    hours_by_month: tuple[str, ...] = ()
    # A reservation's window (gpufarm.core.calendar), for the reports' reserved column (gpufarm.reporting.reserved).
    reserved_from: datetime | None = None
    reserved_until: datetime | None = None
    modified: datetime | None = None
    # What a quota change's incident holds (gpufarm.core.accounting.override_terms): the report counts it apart.
    gpu_model: str | None = None
    approved_by: str | None = None
    kind: str | None = None
    quota_delta: int | None = None
    quota_until: datetime | None = None
    # The units held on a shared pool (`host=<unit>`), for pricing MIG slices (gpufarm.core.money.lease_rate).
    devices: tuple[str, ...] = ()
    # The lease's expected end, and since when an approved request waits for hosts (cleared at allocation): the
    # outlook's holds ahead and waits (gpufarm.core.outlook).
    expires_at: datetime | None = None
    waiting_since: datetime | None = None

    @property
    def is_quota_override(self) -> bool:
        """True for a quota change's incident: never a lease."""
        return self.kind == f.QUOTA_OVERRIDE

    @property
    def ir_label(self) -> str:
        """`IR-123`."""
        return format_ir(self.ir)

    @classmethod
    def decode(
        cls, ir: int, state: str | None, values: Mapping[str, f.FieldValue], modified: datetime | None = None
    ) -> LeaseFacts:
        """From an incident's decoded fields (gpufarm.core.kernel.fields.decode_fields) as Allocation.from_record
        reads them: missing or malformed values fall back to the same safe defaults."""
        get = values.get
        return cls(
            ir=ir,
            state=fv.enum(State, state or fv.text(get(f.STATE)), State.ACTIVE),
            phase=fv.enum(Phase, fv.text(get(f.PHASE)), Phase.REQUESTED),
            team=fv.text(get(f.TEAM)),
            project=fv.text(get(f.PROJECT)),
            environment=fv.text(get(f.ENVIRONMENT)),
            gpu_count=fv.whole(get(f.GPU_COUNT)) or 0,
            hosts=tuple(fv.items(get(f.HOSTS))),
            host_gpus=fv.decode_host_gpus(fv.items(get(f.HOST_GPUS))),
            allocated_at=fv.parse_time(fv.text(get(f.ALLOCATED_AT))),
            reclaim_reason=fv.enum(ReclaimReason, fv.text(get(f.RECLAIM_REASON)), None),
            reason=fv.text(get(f.REASON)),
            history=tuple(fv.items(get(f.HISTORY))),
            hours_held=fv.hours(get(f.GPU_HOURS_HELD)),
            hours_busy=fv.hours(get(f.GPU_HOURS_BUSY)),
            hours_idle=fv.hours(get(f.GPU_HOURS_IDLE)),
            hours_idle_held=fv.hours(get(f.GPU_HOURS_IDLE_HELD)),
            hours_unmeasured=fv.hours(get(f.GPU_HOURS_UNMEASURED)),
            hours_until=fv.parse_time(fv.text(get(f.GPU_HOURS_UNTIL))),
            hours_by_month=tuple(fv.items(get(f.GPU_HOURS_BY_MONTH))),
            reserved_from=fv.parse_time(fv.text(get(f.RESERVED_FROM))),
            reserved_until=fv.parse_time(fv.text(get(f.RESERVED_UNTIL))),
            modified=modified,
            gpu_model=fv.text(get(f.GPU_MODEL)),
            devices=tuple(fv.items(get(f.DEVICES))),
            approved_by=fv.text(get(f.APPROVED_BY)),
            kind=fv.text(get(f.KIND)),
            quota_delta=fv.whole(get(f.QUOTA_DELTA)),
            quota_until=fv.parse_time(fv.text(get(f.QUOTA_UNTIL))),
            expires_at=fv.parse_time(fv.text(get(f.EXPIRES_AT))),
            waiting_since=fv.parse_time(fv.text(get(f.WAITING_SINCE))),
        )

    @classmethod
    def of(cls, alloc: Allocation) -> LeaseFacts:
        """The facts of an Allocation already decoded."""
        return cls(
            ir=alloc.ir,
            state=alloc.state,
            phase=alloc.phase,
            team=alloc.team,
            project=alloc.project,
            environment=alloc.environment,
            gpu_count=alloc.gpu_count,
            hosts=alloc.hosts,
            host_gpus=alloc.host_gpus,
            allocated_at=alloc.allocated_at,
            reclaim_reason=alloc.reclaim_reason,
            reason=alloc.reason,
            history=alloc.history,
            hours_held=alloc.hours_held,
            hours_busy=alloc.hours_busy,
            hours_idle=alloc.hours_idle,
            hours_idle_held=alloc.hours_idle_held,
            hours_unmeasured=alloc.hours_unmeasured,
            hours_until=alloc.hours_until,
            hours_by_month=alloc.hours_by_month,
            reserved_from=alloc.reserved_from,
            reserved_until=alloc.reserved_until,
            modified=alloc.modified,
            gpu_model=alloc.gpu_model,
            devices=alloc.devices,
            approved_by=alloc.approved_by,
            kind=alloc.kind,
            quota_delta=alloc.quota_delta,
            quota_until=alloc.quota_until,
            expires_at=alloc.expires_at,
            waiting_since=alloc.waiting_since,
        )
