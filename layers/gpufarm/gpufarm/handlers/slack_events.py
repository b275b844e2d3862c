"""What Slack sends (slash commands, interactivity payloads) and the ingress → worker hand-off, as pydantic models.

Only the fields gpufarm reads are declared; Slack adds fields over time, so extra ones are ignored. Anything
that does not validate is a malformed body (HTTP 400), never an exception further in.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufarm.handlers.http import SLACK_MAX_BODY_BYTES

USER_ID = r"^[UW][A-Z0-9]{2,20}$"
CHANNEL_ID = r"^[CDG][A-Z0-9]{2,20}$"
HTTP_URL = r"^https?://[^\s]{1,2000}$"


class _Slack(BaseModel):
    # Validators are built on first use: a cold slash command needs one of these models, not all of them
    # (docs/design.md, "Slack's 3 seconds"); SnapStart builds them all before its snapshot.
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class SlashCommand(_Slack):
    """A slash command's form fields (`application/x-www-form-urlencoded`)."""

    command: str = Field(max_length=40)
    # As long as the ingress's body bound lets it be: a text past the command's own bound (2,000 characters) gets
    # parse_command's ephemeral answer, where failing here would be an HTTP 400 Slack shows as a failed command.
    text: str = Field(default="", max_length=SLACK_MAX_BODY_BYTES)
    user_id: str = Field(pattern=USER_ID)
    channel_id: str = Field(pattern=CHANNEL_ID)
    response_url: str = Field(pattern=HTTP_URL)
    trigger_id: str = Field(min_length=1, max_length=200)
    team_id: str | None = Field(default=None, max_length=40)


class SlackUser(_Slack):
    """The user who acted."""

    id: str = Field(pattern=USER_ID)


class SlackChannel(_Slack):
    """Where a message lives."""

    id: str = Field(pattern=CHANNEL_ID)


class Container(_Slack):
    """The surface holding the clicked element."""

    type: str = Field(default="message", max_length=40)
    message_ts: str | None = Field(default=None, max_length=40)
    channel_id: str | None = Field(default=None, pattern=CHANNEL_ID)


class BlockAction(_Slack):
    """One clicked element."""

    action_id: str = Field(max_length=255)
    block_id: str | None = Field(default=None, max_length=255)
    value: str | None = Field(default=None, max_length=2000)


class BlockActions(_Slack):
    """A button click (`block_actions`)."""

    type: Literal["block_actions"]
    user: SlackUser
    actions: list[BlockAction] = Field(min_length=1, max_length=10)
    response_url: str | None = Field(default=None, pattern=HTTP_URL)
    channel: SlackChannel | None = None
    container: Container | None = None
    trigger_id: str | None = Field(default=None, max_length=200)


class ViewState(_Slack):
    """`view.state`: values per block id, per action id."""

    values: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)


class View(_Slack):
    """The parts of a modal gpufarm reads."""

    id: str = Field(min_length=1, max_length=40)
    callback_id: str = Field(default="", max_length=255)
    private_metadata: str = Field(default="", max_length=3000)
    state: ViewState = ViewState()


class ViewSubmission(_Slack):
    """The modal's Submit (`view_submission`)."""

    type: Literal["view_submission"]
    user: SlackUser
    view: View


class ViewClosed(_Slack):
    """The modal's Cancel (`view_closed`, sent because the modal sets notify_on_close)."""

    type: Literal["view_closed"]
    user: SlackUser
    view: View


class AppHomeOpened(_Slack):
    """Slack's `app_home_opened` event: a user opened one of the app's tabs."""

    type: Literal["app_home_opened"]
    user: str = Field(pattern=USER_ID)
    tab: str = Field(default="home", max_length=20)
    channel: str | None = Field(default=None, pattern=CHANNEL_ID)


class EventCallback(_Slack):
    """An Events API delivery (`event_callback`); its `event` is validated by its own type's model."""

    type: Literal["event_callback"]
    event_id: str | None = Field(default=None, max_length=100)
    event: dict[str, Any]


class UrlVerification(_Slack):
    """The Events API's handshake when the Request URL is saved: answered with its challenge."""

    type: Literal["url_verification"]
    challenge: str = Field(min_length=1, max_length=200)


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


def request_id(kind: str, unique: str) -> str:
    """Idempotency key of a Slack request: a hash of its trigger_id (command) or view id (modal)."""
    digest = hashlib.sha256(f"{kind}:{unique}".encode()).hexdigest()[:32]
    return f"slack-{kind}-{digest}"
