"""The ingress → worker hand-off as the worker reads it: a pydantic model, so a payload that does not validate is
refused there, never acted on. The ingress builds it with slack_inputs.job from what it has read and checked.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

USER_ID = r"^[UW][A-Z0-9]{2,20}$"
CHANNEL_ID = r"^[CDG][A-Z0-9]{2,20}$"
HTTP_URL = r"^https?://[^\s]{1,2000}$"


class Job(BaseModel):
    """What the ingress hands to the worker: who asked, where to answer, and what (validated once more there)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # home: publish the user's App Home (the app_home_opened event).
    kind: Literal["request", "command", "action", "home"]
    user: str = Field(pattern=USER_ID)
    channel: str | None = Field(default=None, pattern=CHANNEL_ID)
    response_url: str | None = Field(default=None, pattern=HTTP_URL)
    # kind=request: GpuRequest fields; kind=command: Command.to_payload(); kind=action: action id and IR.
    request: dict[str, Any] | None = None
    command: dict[str, Any] | None = None
    action: str | None = Field(default=None, max_length=255)
    ir: int | None = Field(default=None, ge=1)
    message_ts: str | None = Field(default=None, max_length=40)
    # kind=action from a reason form (gpufarm.core.chat.reason_form): why, and for an exemption how many days.
    reason: str | None = Field(default=None, max_length=300)
    days: int | None = Field(default=None, ge=1, le=365)
