"""Idempotent incident commands: each write a command makes records the command's id in the incident itself.

SQS redelivers a command whose run failed, and a run can fail after its write landed (a timeout or a 5xx on the
answer to the PATCH, or a lost Slack answer afterwards): an extend would then add its days twice. So every write
of one command carries the command's dedup id in `gpufarm_last_commands` (the last few ids, in the same PATCH as
the change; state stays in incident fields, docs/design.md, rules 1 and 7), and before running a command the
executor reads the incident once and, finding its id there, answers with what the command did instead of doing it
again. `CommandLedger` is the incident store one command runs against: it adds the id to that incident's writes
and serves the incident it already read, so the check costs no extra read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from gpufarm.core.context.lease_context import LeaseContext
from gpufarm.core.kernel import fields as f
from gpufarm.core.kernel.errors import NotFound
from gpufarm.core.kernel.ir import format_ir
from gpufarm.core.kernel.model import IncidentRecord
from gpufarm.core.kernel.ports import IncidentStore
from gpufarm.core.kernel.search import IncidentQuery
from gpufarm.core.kernel.serial import IncidentCommand


def applied_ids(record: IncidentRecord) -> list[str]:
    """The command ids an incident records as applied, oldest first."""
    value = record.fields.get(f.LAST_COMMANDS)
    return [v for v in value if v] if isinstance(value, list) else []


def with_id(ids: Sequence[str], command_id: str) -> list[str]:
    """The recorded ids once this command's is added: newest last, each once, the last LAST_COMMANDS_KEPT."""
    return [*(i for i in ids if i != command_id), command_id][-f.LAST_COMMANDS_KEPT :]


class CommandLedger:
    """The incident store of one command's run: its target's writes carry the command id (an IncidentStore).

    The target is the command's IR, or for a create the incident carrying its request id, learnt from the first
    record of it this run sees. Reads of the target after that are served from the last record seen: the
    command runs in the pool's queue group, the target's only writer, so nothing changed it since.
    """

    def __init__(self, store: IncidentStore, command: IncidentCommand) -> None:
        self.store = store
        self.command_id = command.dedup_id()
        self.ir = command.ir
        self.request_id = command.request.request_id if command.request is not None else None
        self.current: IncidentRecord | None = None

    def read(self) -> IncidentRecord:
        """The command's incident as it is now (NotFound naming the IR); only for commands that name an IR."""
        if self.current is None:
            assert self.ir is not None
            try:
                self._see(self.store.get_by_ir(self.ir))
            except NotFound:
                raise NotFound(f"{format_ir(self.ir)} does not exist") from None
        assert self.current is not None
        return self.current

    def applied(self) -> bool:
        """True when the command's incident, read now, records that this command already wrote it."""
        return self.command_id in applied_ids(self.read())

    # -- IncidentStore -----------------------------------------------------------------------------------------

    def create(
        self,
        title: str,
        fields: Mapping[str, object],
        *,
        notification_handles: Sequence[str] = (),
        initial_note: str | None = None,
    ) -> IncidentRecord:
        """Create as the store does (the request id already makes a create happen once)."""
        record = self.store.create(title, fields, notification_handles=notification_handles, initial_note=initial_note)
        return self._see(record)

    def get(self, incident_id: str) -> IncidentRecord:
        """The target from the last record seen; any other incident from the store."""
        if self.current is not None and self.current.id == incident_id:
            return self.current
        return self._see(self.store.get(incident_id))

    def get_by_ir(self, ir: int) -> IncidentRecord:
        """The target from the last record seen; any other incident from the store."""
        if self.current is not None and self.current.public_id == ir:
            return self.current
        return self._see(self.store.get_by_ir(ir))

    def update(self, incident_id: str, fields: Mapping[str, object], *, title: str | None = None) -> IncidentRecord:
        """Write as the store does; a write to the target carries the command id in the same PATCH."""
        if self.current is not None and self.current.id == incident_id:
            fields = {**fields, f.LAST_COMMANDS: with_id(applied_ids(self.current), self.command_id)}
        return self._see(self.store.update(incident_id, fields, title=title))

    def search(self, query: IncidentQuery) -> Iterator[IncidentRecord]:
        """Search as the store does."""
        return self.store.search(query)

    def find_by_request_id(self, request_id: str) -> IncidentRecord | None:
        """Find as the store does."""
        record = self.store.find_by_request_id(request_id)
        return self._see(record) if record is not None else None

    def _see(self, record: IncidentRecord) -> IncidentRecord:
        mine = (
            record.id == self.current.id
            if self.current is not None
            else record.public_id == self.ir
            if self.ir is not None
            else self.request_id is not None and record.fields.get(f.REQUEST_ID) == self.request_id
        )
        if mine:
            self.current = record
        return record


def ledgered(ctx: LeaseContext, command: IncidentCommand) -> tuple[LeaseContext, CommandLedger]:
    """The context whose incident store is the command's record (the container's context is shared)."""
    ledger = CommandLedger(ctx.incidents, command)
    return ctx.with_incidents(ledger), ledger
