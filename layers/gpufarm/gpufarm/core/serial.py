"""Commands that change an incident, as they travel on the allocation queue (docs/design.md, rule 7).

Every change to an incident is one of these, sent to the FIFO allocation queue with the incident's pool as the
message group, so two changes to one incident (and a quota decision and the grants it counts) never interleave.
The queue consumer re-reads the incident and decides (`gpufarm.core.executor`). A command names the incident by
IR, who acts, the action's arguments and where to answer; nothing it carries is trusted as incident state.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.core.model import NAME_PATTERN

USER_ID = r"^[UW][A-Z0-9]{2,20}$"
HTTP_URL = r"^https?://[^\s]{1,2000}$"
# Message group for incidents whose pool is not a valid name (they still never race each other).
UNASSIGNED_GROUP = "unassigned"
_POOL_RE = re.compile(NAME_PATTERN)


class Op(StrEnum):
    """What a command does to its incident."""

    DECIDE = "decide"  # a new request's policy decision, against what the pool has already granted
    APPROVE = "approve"
    REJECT = "reject"
    RELEASE = "release"
    EXTEND = "extend"
    KEEP = "keep"
    FORCE_RECLAIM = "force-reclaim"
    IDLE = "idle"  # the idle monitor fired: warn, or reclaim after the grace period
    BUSY = "busy"  # the idle monitor recovered: clear the warning
    EXPIRE = "expire"  # the sync found the expiry (or the idle grace) passed


# Commands people send; the rest come from monitors and the scheduled sync.
USER_OPS = frozenset({Op.DECIDE, Op.APPROVE, Op.REJECT, Op.RELEASE, Op.EXTEND, Op.KEEP, Op.FORCE_RECLAIM})


class IncidentCommand(BaseModel):
    """One change to one incident, with its reply target (response_url, else a DM to reply_to)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Op
    ir: int = Field(ge=1)
    actor: str | None = Field(default=None, pattern=USER_ID)
    days: int | None = Field(default=None, ge=1, le=365)
    reason: str | None = Field(default=None, max_length=300)
    response_url: str | None = Field(default=None, pattern=HTTP_URL)
    reply_to: str | None = Field(default=None, pattern=USER_ID)
    # What makes this delivery unique (a Slack request id, an alert's id and date, a sync's time bucket): true
    # retries of one delivery carry the same origin and collapse; two different actions never share one.
    origin: str = Field(default="", max_length=300)

    def dedup_id(self) -> str:
        """SQS FIFO deduplication id: a hash of everything the command says, so only true retries collapse.

        Slack gives every slash command and every click its own response_url and re-sends the same one on a
        retry, so two clicks of one button differ while a retried delivery of one click does not.
        """
        text = self.model_dump_json(exclude_none=True)
        return "cmd-" + hashlib.sha256(text.encode()).hexdigest()[:60]

    def to_body(self) -> dict[str, Any]:
        """The queue message body."""
        return {"command": self.model_dump(mode="json", exclude_none=True)}


def pool_group(environment: str | None) -> str:
    """The FIFO message group of a pool: every write to an incident of that pool runs in it, one at a time."""
    name = environment or ""
    return name if _POOL_RE.match(name) else UNASSIGNED_GROUP
