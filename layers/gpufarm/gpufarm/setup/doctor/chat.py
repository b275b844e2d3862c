"""Check 7: the Slack bot token holds every scope the app's manifest asks for, and the bot is in the operators'
channel (where requests beyond quota, keeps and the digest are posted: `chat:write` needs it to be a member)."""

from __future__ import annotations

from gpufarm.core.kernel.errors import UpstreamError
from gpufarm.setup.doctor.ports import SlackProbe
from gpufarm.setup.doctor.report import Line, Status

SCOPES = "slack scopes"
CHANNEL = "operators' channel"

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
    "groups:read",
)


def check_slack(chat: SlackProbe | None, why_none: str, channel: str | None) -> list[Line]:
    """The scopes line and the channel line."""
    if chat is None:
        return [Line(SCOPES, Status.BROKEN, why_none), Line(CHANNEL, Status.SKIPPED, "no Slack client")]
    return [_scopes(chat), _channel(chat, channel)]


def _scopes(chat: SlackProbe) -> Line:
    try:
        granted = chat.token_scopes()
    except UpstreamError as exc:
        return Line(SCOPES, Status.BROKEN, f"auth.test: {exc}")
    if granted is None:
        return Line(SCOPES, Status.FELL_BACK, "Slack did not name the token's scopes (no x-oauth-scopes header)")
    missing = [scope for scope in BOT_SCOPES if scope not in granted]
    if missing:
        detail = f"the bot token lacks {', '.join(missing)}: add them to the app (slack/manifest.yaml) and reinstall it"
        return Line(SCOPES, Status.BROKEN, detail)
    return Line(SCOPES, Status.CONFIRMED, f"the bot token holds the {len(BOT_SCOPES)} scopes the manifest asks for")


def _channel(chat: SlackProbe, channel: str | None) -> Line:
    if not channel:
        detail = "no operators' channel configured (GPUFARM_OPERATORS_CHANNEL or the farm's operators_channel)"
        return Line(CHANNEL, Status.SKIPPED, detail)
    try:
        member = chat.is_member(channel)
    except UpstreamError as exc:
        hint = (
            " (a private channel shows only to its members: invite the bot)" if "channel_not_found" in str(exc) else ""
        )
        return Line(CHANNEL, Status.BROKEN, f"conversations.info {channel}: {exc}{hint}")
    if not member:
        return Line(CHANNEL, Status.BROKEN, f"the bot is not in {channel}: `/invite @gpufarm` there")
    return Line(CHANNEL, Status.CONFIRMED, f"the bot is a member of {channel}")
