"""Block Kit building blocks as plain dicts (no Slack SDK, so the core stays pure): the message, sections,
buttons and their action ids, and the links a lease's messages carry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The action ids live in actions.py (the ingress reads them without this module); re-exported for the builders.
from gpufarm.core.chat.actions import ACTION_APPROVE as ACTION_APPROVE  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTION_EXEMPT as ACTION_EXEMPT  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTION_EXTEND as ACTION_EXTEND  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTION_KEEP as ACTION_KEEP  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTION_RECLAIM as ACTION_RECLAIM  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTION_REJECT as ACTION_REJECT  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTION_RELEASE as ACTION_RELEASE  # noqa: PLC0414
from gpufarm.core.chat.actions import ACTIONS as ACTIONS  # noqa: PLC0414
from gpufarm.core.chat.links import Links
from gpufarm.core.kernel.model import Allocation

MAX_MESSAGE_BLOCKS = 50
MAX_SECTION_TEXT = 3000


@dataclass(frozen=True)
class Message:
    """A Slack message: fallback text plus optional blocks."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)

    def payload(self) -> dict[str, Any]:
        """Keyword arguments for chat.postMessage / response_url."""
        out: dict[str, Any] = {"text": self.text}
        if self.blocks:
            out["blocks"] = self.blocks
        return out


def section(text: str) -> dict[str, Any]:
    """A mrkdwn section, cut to Slack's 3000-character limit."""
    if len(text) > MAX_SECTION_TEXT:
        text = text[: MAX_SECTION_TEXT - 2] + " …"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def context(text: str) -> dict[str, Any]:
    """A small grey line."""
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:MAX_SECTION_TEXT]}]}


def button(text: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    """A button whose value carries the IR."""
    out: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "action_id": action_id,
        "value": value,
    }
    if style:
        out["style"] = style
    return out


def actions(block_id: str, *buttons: dict[str, Any]) -> dict[str, Any]:
    """A row of buttons."""
    return {"type": "actions", "block_id": block_id, "elements": list(buttons)}


def release_button(alloc: Allocation) -> dict[str, Any]:
    """A Release button Slack confirms (a Block Kit confirmation dialog) before the click is sent."""
    out = button("Release", ACTION_RELEASE, alloc.ir_label, "danger")
    out["confirm"] = {
        "title": _plain(f"Release {alloc.ir_label}?"),
        "text": {
            "type": "mrkdwn",
            "text": f"The GPUs of *{alloc.ir_label}* go back to the pool now; jobs still running on them lose them.",
        },
        "confirm": _plain("Release"),
        "deny": _plain("Keep them"),
        "style": "danger",
    }
    return out


LINKS_BLOCK = "lease-links"


def lease_links(alloc: Allocation, links: Links | None = None) -> dict[str, Any]:
    """The line every message about a lease carries: its incident and its project dashboard
    (gpufarm.core.chat.links)."""
    block = context((links or Links()).line(alloc.ir, alloc.team, alloc.project))
    block["block_id"] = f"{LINKS_BLOCK}:{alloc.ir}"
    return block


def linked(alloc: Allocation, message: Message, links: Links | None = None) -> Message:
    """`message` with the lease's links: before its buttons, else last (a text-only message gets its text shown).

    A message that already carries the lease's links is returned as it is.
    """
    block_id = f"{LINKS_BLOCK}:{alloc.ir}"
    blocks = list(message.blocks) or [section(message.text)]
    if any(b.get("block_id") == block_id for b in blocks):
        return message
    at = len(blocks)
    while at > 0 and blocks[at - 1].get("type") == "actions":
        at -= 1
    if len(blocks) >= MAX_MESSAGE_BLOCKS:
        # Slack takes 50 blocks: the links take the place of the last block before the buttons.
        blocks.pop(at - 1)
        at -= 1
    return Message(message.text, [*blocks[:at], lease_links(alloc, links), *blocks[at:]])


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text[:75], "emoji": True}


def _option(value: str, text: str) -> dict[str, Any]:
    return {"text": _plain(text), "value": value}
