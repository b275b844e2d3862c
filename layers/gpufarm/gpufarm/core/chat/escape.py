"""Text from people made inert before it goes into a Slack message; pure.

Slack reads `&`, `<` and `>` as control characters in message text and in mrkdwn text objects: `<!channel>`,
`<!here>`, `<!everyone>`, `<@U…>`, `<!subteam^S…>`, `<#C…>` and `<url|words>` become broadcasts, pings, user-group
pings and links whose words hide where they go. Slack's formatting reference ("Escaping text") says to replace those
three characters, and only those, with `&amp;`, `&lt;` and `&gt;` wherever they are not meant for parsing; Slack
shows the characters as typed.

Every string gpufarm did not write itself (a request's purpose, team, project, title and pool, a reason or note,
a host or device name read from a cloud or from Datadog, an incident field edited by hand, text an error quotes)
goes through `inert` where a message is built, and a user id through `mention`. gpufarm's own markup (links it
builds, mentions of ids it checked) is added around the escaped text, so it still works.
"""

from __future__ import annotations

import re

# Slack user ids (U…) and Enterprise Grid user ids (W…), as Slack's payloads give them.
_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,20}$")
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def inert(text: object) -> str:
    """`text` as Slack shows it literally: `&`, `<` and `>` as HTML entities, nothing else changed.

    Already-escaped text is escaped again (`&lt;` becomes `&amp;lt;`), so Slack shows exactly what was typed.
    """
    return str(text).translate(_ESCAPES)


def mention(user: str | None) -> str:
    """`<@U…>` for a Slack user id; anything else (a hand-edited field, a name) as inert text, never a mention."""
    if user and _USER_ID.match(user):
        return f"<@{user}>"
    return inert(user or "someone")
