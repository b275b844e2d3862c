"""The incident webhook: Datadog says an incident changed → queue it per pool → allocate or reclaim, one at a time.

Two triggers, one function:
- Function URL (Datadog's incident notification webhook): the shared secret header is compared in constant
  time, the body is validated, the incident is read to learn its pool, and {"incident_id", "reason"} is sent
  to the FIFO AllocationQueue with the pool (environment) as message group and a dedup id derived from the
  incident's state and modification time, so Datadog's retries and duplicate deliveries collapse.
- SQS (AllocationQueue): messages of one pool arrive one at a time; each reads the incident fresh and lets the
  core decide (allocate when approved/waiting, reclaim when resolved, else nothing). The webhook body is never
  trusted beyond the incident id, so duplicate, late and out-of-order webhooks converge. The scheduled sync
  sends {"pool", "reason": "sync"} (with "shard"/"shards" for a large pool, gpufarm.core.sync) through the
same groups to repair drift without racing an allocation, and
  every other change to an incident (Slack actions, a new request's policy decision, idle alerts, expiries)
  arrives as {"command": ...} in the incident's pool group (gpufarm.core.commands.executor; docs/design.md, rule 7).
  A budget threshold the sync found crossed arrives as {"budget": {"team", "project", "period"}} in the team's
  budget group, which alone writes the team's budget period incidents (gpufarm.core.accounting.budget_alerts).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufarm.core.commands import executor
from gpufarm.core.config.accounting import BudgetPeriod
from gpufarm.core.kernel.errors import GpufarmError, NotFound, UpstreamError
from gpufarm.core.kernel.model import NAME_PATTERN, Allocation
from gpufarm.core.kernel.serial import IncidentCommand, incident_step
from gpufarm.core.sync.repair import MAX_SHARDS
from gpufarm.handlers import http, telemetry, webhook
from gpufarm.handlers import runtime as rt

if TYPE_CHECKING:
    from gpufarm.core.service import GpuFarm

log = logging.getLogger(__name__)

UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class IncidentEvent(BaseModel):
    """The incident webhook's payload (gpufarm.setup.webhooks.INCIDENT_PAYLOAD, rendered by Datadog)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    incident_uuid: str = Field(pattern=UUID_PATTERN)
    incident_public_id: str | int | None = None
    incident_status: str = Field(default="", max_length=40)
    event_type: str = Field(default="", max_length=80)
    date: str = Field(default="", max_length=40)
    # Never read for a decision (the incident is read through the API): an object, a JSON string or absent, as
    # Datadog renders $INCIDENT_FIELDS; only how it came is noted for `gpufarm doctor`'s probes.
    incident_fields: Any = None

    @property
    def fields_encoding(self) -> str:
        """How $INCIDENT_FIELDS arrived: "object", "string" or "absent"."""
        if isinstance(self.incident_fields, dict):
            return "object"
        return "string" if isinstance(self.incident_fields, str) else "absent"


class BudgetTarget(BaseModel):
    """A budget whose thresholds the sync found crossed and not told (gpufarm.core.accounting.budget_alerts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    team: str = Field(pattern=NAME_PATTERN)
    project: str | None = Field(default=None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    period: BudgetPeriod


class QueueMessage(BaseModel):
    """One unit of serialized pool work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    incident_id: str | None = Field(default=None, pattern=UUID_PATTERN)
    pool: str | None = Field(default=None, pattern=NAME_PATTERN)
    # A large pool's repair comes in shards (gpufarm.core.sync): this message repairs shard `shard` of `shards`.
    shard: int = Field(default=0, ge=0, lt=MAX_SHARDS)
    shards: int = Field(default=1, ge=1, le=MAX_SHARDS)
    command: IncidentCommand | None = None
    budget: BudgetTarget | None = None
    reason: str = Field(default="", max_length=120)
    # How a webhook call for a doctor's probe arrived (gpufarm.core.leases.probe).
    arrival: str | None = Field(default=None, max_length=200)

    @model_validator(mode="after")
    def _one_target(self) -> QueueMessage:
        if sum(x is not None for x in (self.incident_id, self.pool, self.command, self.budget)) != 1:
            raise ValueError("a message names one of an incident_id, a pool, a command or a budget")
        if self.shard >= self.shards or (self.shards > 1 and self.pool is None):
            raise ValueError("a shard is one of a pool's shards")
        return self


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """Function URL → enqueue; SQS batch → process."""
    if isinstance(event, Mapping) and isinstance(event.get("Records"), list):
        return _consume(event, context)
    return _receive(event)


# -- Function URL -----------------------------------------------------------------------------------------------


def _receive(event: Mapping[str, Any]) -> dict[str, Any]:
    return webhook.receive(event, IncidentEvent, "incident webhook", _enqueue)


def _enqueue(runtime: rt.Runtime, change: IncidentEvent, token_in: str) -> dict[str, Any]:
    queue = runtime.queue()
    if queue is None:
        raise rt.ConfigurationError(f"{rt.QUEUE_URL_ENV} is not set")
    telemetry.correlate(incident_id=change.incident_uuid)
    try:
        # The pool (message group) comes from the incident itself, never from the body: a body naming the wrong
        # pool (or none) would put two allocations of one pool in different groups and let them interleave.
        alloc = Allocation.from_record(runtime.incidents().get(change.incident_uuid))
    except NotFound:
        # Gone, or another type's incident: nothing of gpufarm's to do, and nothing for Datadog to retry.
        return http.respond(200, {"ignored": "not a gpufarm allocation"})
    except UpstreamError as exc:
        log.error("could not read incident %s: %s", change.incident_uuid, exc)  # noqa: TRY400
        return http.error(503, "Datadog unavailable")
    # One message per incident change: Datadog's retries, duplicate deliveries and the sweep's message for the same
    # change collapse (gpufarm.core.kernel.serial.incident_step).
    body, group, dedup = incident_step(alloc, fallback_time=change.date)
    telemetry.correlate(ir=alloc.ir, pool=group)
    if alloc.is_probe:
        reason = body["reason"]
        # How this call came, for `gpufarm doctor` (gpufarm.core.leases.probe); one message per call.
        body["arrival"] = f"token in {token_in}; fields as {change.fields_encoding}; trigger {reason}"
        dedup = hashlib.sha256(f"{dedup}|{body['arrival']}|{change.event_type}|{change.date}".encode()).hexdigest()
    try:
        queue.send(body, group=group, dedup_id=dedup)
    except UpstreamError as exc:
        # Datadog retries 5xx, which is what we want when the queue is briefly unreachable.
        log.error("could not queue incident %s: %s", change.incident_uuid, exc)  # noqa: TRY400
        return http.error(503, "queue unavailable")
    return http.respond(202, {"queued": change.incident_uuid, "group": group})


# -- SQS consumer -----------------------------------------------------------------------------------------------


def _consume(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response

    try:
        runtime = rt.current()
    except rt.ConfigurationError as exc:
        # The batch fails and SQS redelivers it (then the DLQ): nothing is lost while operators fix it.
        raise rt.misconfigured("allocation queue consumer", exc) from None
    processor = SqsFifoPartialProcessor(skip_group_on_error=True)
    # Report failures item by item even when the whole (one-message) batch failed: with ReportBatchItemFailures
    # that redelivers the same way, and the answer stays the documented shape instead of an exception.
    processor.raise_on_entire_batch_failure = False

    def record_handler(record: Any) -> list[str]:
        return process_message(runtime, record.body)

    result: dict[str, Any] = dict(
        process_partial_response(event=dict(event), record_handler=record_handler, processor=processor, context=context)
    )
    return result


def process_message(runtime: rt.Runtime, body: str) -> list[str]:
    """Do one queued unit of pool work; raises (→ redelivery) only when retrying can help."""
    try:
        message = QueueMessage.model_validate_json(body)
    except ValidationError:
        # A message nobody can process must not block its group forever.
        log.error("dropped a malformed allocation queue message")  # noqa: TRY400
        return ["dropped: malformed"]
    telemetry.correlate(incident_id=message.incident_id, pool=message.pool)
    try:
        svc = runtime.service()
    except rt.ConfigurationError as exc:
        raise rt.misconfigured("allocation queue consumer", exc) from None
    try:
        # Each requester whose lease this work wrote gets their App Home published once (gpufarm.core.leases.home).
        done = svc.refreshing_homes(lambda: _run(svc, message), message.command)
    except NotFound:
        log.warning("incident %s no longer exists; nothing to do", message.incident_id)
        return ["gone"]
    except (UpstreamError, rt.ConfigurationError):
        raise
    except GpufarmError:
        # A state the lifecycle forbids (e.g. a hand-edited phase): retrying cannot fix it; log for operators.
        log.exception("cannot process %s", message.incident_id or message.pool)
        return ["failed: invalid state"]
    for line in done:
        log.info("%s", line)
    return done


def _run(svc: GpuFarm, message: QueueMessage) -> list[str]:
    """The message's unit of work: an incident command, a pool's repair, a budget's alerts, or an incident's
    lifecycle step."""
    if message.command is not None:
        telemetry.correlate(ir=message.command.ir)
        command = message.command
        return [f"IR-{command.ir} {command.op.value}: {executor.execute(svc.context, command)}"]
    if message.budget is not None:
        target = message.budget
        return [svc.budget_alert(target.team, target.project, target.period)]
    if message.pool is not None:
        repair = svc.reconcile_pool(message.pool, message.shard, message.shards)
        done = [f"tags removed: {t}" for t in repair.removed] + [f"tags restored: {t}" for t in repair.restored]
        return done + [f"conflict: {c}" for c in repair.conflicts] + [str(o) for o in repair.outcomes]
    return [str(o) for o in svc.process(message.incident_id or "", message.arrival)]
