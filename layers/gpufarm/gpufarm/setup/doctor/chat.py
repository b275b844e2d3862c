"""Check 7: the Slack bot token holds every scope the app's manifest asks for, and the bot is in the operators'
channel (where requests beyond quota, keeps and the digest are posted: `chat:write` needs it to be a member)."""

from __future__ import annotations

from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.setup.doctor.ports import SlackProbe
from gpufarm.setup.doctor.report import Line, Status

SCOPES = "slack scopes"
CHANNEL = "operators' channel"

# Slack asks groups:read to read a private channel, a scope gpufarm's app does not ask for: not checked then.
PRIVATE = (
    "a private channel's membership needs groups:read, which gpufarm does not ask for: check that the bot is in it "
    "(`/invite @gpufarm`)"
)

# The bot scopes slack/manifest.yaml asks for (a unit test holds the two equal): the manifest is not shipped with
# the package an operator installs.
BOT_SCOPES = (
    "commands",
    "chat:write",
    "im:write",
    "files:write",
    "users:read",
    "usergroups:read",
    "channels:read",
)


def check_slack(chat: SlackProbe | None, why_none: str, channel: str | None) -> list[Line]:
    """The scopes line and the channel line."""
    if chat is None:
        return [Line(SCOPES, Status.BROKEN, why_none), Line(CHANNEL, Status.SKIPPED, "no Slack client")]
    line, granted = _scopes(chat)
    return [line, _channel(chat, channel, granted)]


def _scopes(chat: SlackProbe) -> tuple[Line, frozenset[str] | None]:
    try:
        granted = chat.token_scopes()
    except UpstreamError as exc:
        return Line(SCOPES, Status.BROKEN, f"auth.test: {exc}"), None
    if granted is None:
        detail = "Slack did not name the token's scopes (no x-oauth-scopes header)"
        return Line(SCOPES, Status.FELL_BACK, detail), None
    missing = [scope for scope in BOT_SCOPES if scope not in granted]
    if missing:
        detail = f"the bot token lacks {', '.join(missing)}: add them to the app (slack/manifest.yaml) and reinstall it"
        return Line(SCOPES, Status.BROKEN, detail), granted
    detail = f"the bot token holds the {len(BOT_SCOPES)} scopes the manifest asks for"
    return Line(SCOPES, Status.CONFIRMED, detail), granted


def _channel(chat: SlackProbe, channel: str | None, granted: frozenset[str] | None) -> Line:
    if not channel:
        detail = "no operators' channel configured (GPUFARM_OPERATORS_CHANNEL or the farm's operators_channel)"
        return Line(CHANNEL, Status.SKIPPED, detail)
    try:
        member = chat.is_member(channel)
    except UpstreamError as exc:
        if "missing_scope" not in str(exc):
            return Line(CHANNEL, Status.BROKEN, f"conversations.info {channel}: {exc}")
        if granted is not None and "channels:read" not in granted:
            return Line(CHANNEL, Status.BROKEN, f"conversations.info {channel}: {exc}: the app needs channels:read")
        # The token holds channels:read, so the channel is a private one (Slack asks groups:read for those).
        return Line(CHANNEL, Status.SKIPPED, PRIVATE)
    if not member:
        return Line(CHANNEL, Status.BROKEN, f"the bot is not in {channel}: `/invite @gpufarm` there")
    return Line(CHANNEL, Status.CONFIRMED, f"the bot is a member of {channel}")
