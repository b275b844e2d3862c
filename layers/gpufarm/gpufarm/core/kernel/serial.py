"""Commands that change an incident, as they travel on the allocation queue (docs/design.md, rule 7).

Every change to an incident is one of these, sent to the FIFO allocation queue with the incident's pool as the
message group, so two changes to one incident (and a quota decision and the grants it counts) never interleave.
The queue consumer re-reads the incident and decides (`gpufarm.core.commands.executor`). A command names the incident by
IR, who acts, the action's arguments and where to answer; nothing it carries is trusted as incident state. A new
request's command (create) names no IR yet: it carries the validated request itself, which is work, not state.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufarm.core.kernel.model import NAME_PATTERN, Allocation, GpuRequest

USER_ID = r"^[UW][A-Z0-9]{2,20}$"
HTTP_URL = r"^https?://[^\s]{1,2000}$"
# Message group for incidents whose pool is not a valid name (they still never race each other).
UNASSIGNED_GROUP = "unassigned"
_POOL_RE = re.compile(NAME_PATTERN)


class Op(StrEnum):
    """What a command does to its incident."""

    CREATE = "create"  # a new request: find its incident by request id or create it, then decide it
    DECIDE = "decide"  # a new request's policy decision, against what the pool has already granted
    APPROVE = "approve"
    REJECT = "reject"
    RELEASE = "release"
    EXTEND = "extend"
    KEEP = "keep"
    FORCE_RECLAIM = "force-reclaim"
    EXEMPT = "exempt"  # an operator exempts a lease from idle reclaim until an end date (gpufarm.core.idle.keeps)
    IDLE = "idle"  # the idle monitor fired: warn, or reclaim after the grace period
    BUSY = "busy"  # the idle monitor recovered: clear the warning
    EXPIRE = "expire"  # the sync found the expiry (or the idle grace, or a waiting request's limit) passed
    REMIND = "remind"  # the sync found a lease within its reminder window before its end (gpufarm.core.leases.terms)
    ACCRUE = "accrue"  # the sync accrues a lease's GPU-hours up to its time (gpufarm.core.accounting.gpu_hours)
    SQUATTER = "squatter"  # the squatter monitor fired for a device: tell once per episode, stop after the grace
    SQUATTER_CLEAR = "squatter-clear"  # the squatter monitor's group recovered: the episode ends
    PROFILE = "profile"  # a profiler run, already stored, is recorded on the lease (gpufarm.core.leases.profile_runs)


# Host names as Datadog's `host:` tag carries them, and the node agent's device UUIDs (spec/metrics.yaml).
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$"
DEVICE_UUID = r"^(gpu|mig)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
MAX_SCOPE_ITEMS = 64


class IdleScope(BaseModel):
    """Where and how an idle monitor saw an allocation idle: its group's hosts and devices, kind, value, window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: tuple[Annotated[str, Field(pattern=HOST_NAME)], ...] = Field(default=(), max_length=MAX_SCOPE_ITEMS)
    devices: tuple[Annotated[str, Field(pattern=DEVICE_UUID)], ...] = Field(default=(), max_length=MAX_SCOPE_ITEMS)
    kind: str | None = Field(default=None, pattern=r"^[a-z_]{1,40}$")
    value: float | None = Field(default=None, allow_inf_nan=False)
    window_minutes: int | None = Field(default=None, ge=1, le=7 * 24 * 60)

    def describe(self) -> str:
        """`on gpu-a-01 (kind idle, 0, over 60 min)`, or '' when the alert named nothing more than the lease."""
        where = ", ".join([*self.hosts, *self.devices])
        how = ", ".join(
            part
            for part in (
                f"kind {self.kind}" if self.kind else "",
                f"{self.value:g}" if self.value is not None else "",
                f"over {self.window_minutes} min" if self.window_minutes else "",
            )
            if part
        )
        return " ".join(p for p in (f"on {where}" if where else "", f"({how})" if how else "") if p)


class SquatterScope(BaseModel):
    """The squatter monitor's group: the host, the device, and how many squatters it counted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(pattern=HOST_NAME)
    device: str = Field(pattern=DEVICE_UUID)
    value: float | None = Field(default=None, allow_inf_nan=False, ge=0, le=1024)


SQUATTER_OPS = frozenset({Op.SQUATTER, Op.SQUATTER_CLEAR})


# `host=busy devices` over the sync's window, `host=?` where nothing measured the host
# (gpufarm.core.accounting.gpu_hours).
BUSY_ENTRY = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}=([0-9]{1,4}(\.[0-9]{1,3})?|\?)$"
MAX_ACCRUE_HOSTS = 512


class AccrueScope(BaseModel):
    """What an accrue command measured: up to when the lease accrues, its busy and idle-held devices per host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    until: datetime
    busy: tuple[Annotated[str, Field(pattern=BUSY_ENTRY)], ...] = Field(default=(), max_length=MAX_ACCRUE_HOSTS)
    idle_held: tuple[Annotated[str, Field(pattern=BUSY_ENTRY)], ...] = Field(default=(), max_length=MAX_ACCRUE_HOSTS)


class ProfileScope(BaseModel):
    """A stored profiler run a profile command records: its name, figures in brief, and its signed page link."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    summary: str = Field(max_length=80, pattern=r"^[^\n]*$")
    link: str = Field(pattern=HTTP_URL, max_length=400)


class IncidentCommand(BaseModel):
    """One change to one incident, with its reply target (response_url, else a DM to reply_to)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Op
    # Every op names its incident but create, whose incident does not exist yet: it carries the request instead.
    ir: int | None = Field(default=None, ge=1)
    request: GpuRequest | None = None
    actor: str | None = Field(default=None, pattern=USER_ID)
    days: int | None = Field(default=None, ge=1, le=365)
    reason: str | None = Field(default=None, max_length=300)
    response_url: str | None = Field(default=None, pattern=HTTP_URL)
    reply_to: str | None = Field(default=None, pattern=USER_ID)
    # What makes this delivery unique (a Slack request id, an alert's id and date, a sync's time bucket): true
    # retries of one delivery carry the same origin and collapse; two different actions never share one.
    origin: str = Field(default="", max_length=300)
    # Idle and busy commands: the monitor group that fired (which hosts or devices, kind, value, window).
    idle: IdleScope | None = None
    # Accrue commands: the sync's time and measurement.
    accrue: AccrueScope | None = None
    # Profile commands: the stored run to record.
    profile: ProfileScope | None = None
    # Squatter commands: the monitor group that fired.
    squatter: SquatterScope | None = None

    @model_validator(mode="after")
    def _target(self) -> IncidentCommand:
        if self.op in SQUATTER_OPS and self.squatter is None:
            raise ValueError("a squatter command carries the monitor group that fired")
        if self.unheld_squatter and self.request is None:
            return self  # a squatter on a device no lease holds: there is no incident to name
        if (self.op is Op.CREATE) != (self.request is not None) or (self.op is Op.CREATE) == (self.ir is not None):
            raise ValueError("a create command carries a request and no IR; every other command names an IR")
        return self

    @property
    def unheld_squatter(self) -> bool:
        """A squatter command for a device no lease holds (it names no IR: the operators alone are told)."""
        return self.op in SQUATTER_OPS and self.ir is None

    @property
    def incident(self) -> int:
        """The IR the command acts on (every op but create names one)."""
        if self.ir is None:
            raise ValueError(f"a {self.op.value} command names no IR")
        return self.ir

    def group(self) -> str | None:
        """The message group a create command joins (its request's pool); None: read it from the incident."""
        if self.unheld_squatter:
            return UNASSIGNED_GROUP  # no incident is written: the group only orders and dedups its posts
        return pool_group(self.request.environment) if self.request is not None else None

    def dedup_id(self) -> str:
        """SQS FIFO deduplication id: a hash of everything the command says, so only true retries collapse.

        Slack gives every slash command and every click its own response_url and re-sends the same one on a
        retry, so two clicks of one button differ while a retried delivery of one click does not. A create is
        keyed by its Slack request id alone: every delivery of one request (a retry overlapping the original,
        from another worker, with another response_url) is one create, and SQS drops the twins for 5 minutes.
        """
        if self.request is not None:
            return "req-" + hashlib.sha256(self.request.request_id.encode()).hexdigest()[:60]
        text = self.model_dump_json(exclude_none=True)
        return "cmd-" + hashlib.sha256(text.encode()).hexdigest()[:60]

    def to_body(self) -> dict[str, Any]:
        """The queue message body."""
        return {"command": self.model_dump(mode="json", exclude_none=True)}


def pool_group(environment: str | None) -> str:
    """The FIFO message group of a pool: every write to an incident of that pool runs in it, one at a time."""
    name = environment or ""
    return name if _POOL_RE.match(name) else UNASSIGNED_GROUP


def incident_step(alloc: Allocation, *, fallback_time: str = "") -> tuple[dict[str, Any], str, str]:
    """The queue message that has the pool's one writer act on an incident as it is now: its body, its pool group
    and a dedup id naming the incident's change, so the webhook and the sweep bringing the same change are one
    message (SQS drops the second within five minutes) and a step runs once whichever comes first."""
    reason = f"{alloc.state.value}/{alloc.phase.value}"
    modified = alloc.modified.isoformat() if alloc.modified else fallback_time
    dedup = hashlib.sha256(f"{alloc.incident_id}|{reason}|{modified}".encode()).hexdigest()
    return {"incident_id": alloc.incident_id, "reason": reason}, pool_group(alloc.environment), dedup
