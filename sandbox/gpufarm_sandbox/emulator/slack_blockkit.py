"""Block Kit as the Slack sandbox checks and echoes it: the limits and shapes Slack enforces on messages and views,
and the decorations Slack adds when it echoes blocks back."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import Any

MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_VIEW_BYTES = 250_000
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_VIEW_TITLE = 24
MAX_PRIVATE_METADATA = 3000

BLOCK_TYPES = frozenset(
    {"section", "divider", "image", "actions", "context", "input", "header", "rich_text", "file", "video", "markdown"}
)
ELEMENT_TYPES = frozenset(
    {
        "button",
        "checkboxes",
        "datepicker",
        "datetimepicker",
        "email_text_input",
        "image",
        "multi_static_select",
        "multi_external_select",
        "multi_users_select",
        "multi_conversations_select",
        "multi_channels_select",
        "number_input",
        "overflow",
        "plain_text_input",
        "radio_buttons",
        "rich_text_input",
        "static_select",
        "external_select",
        "users_select",
        "conversations_select",
        "channels_select",
        "timepicker",
        "url_text_input",
        "file_input",
        "workflow_button",
    }
)
TEXT_TYPES = frozenset({"plain_text", "mrkdwn"})


def _text_object_errors(obj: Any, pointer: str, *, limit: int, plain_only: bool = False) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in (("plain_text",) if plain_only else TEXT_TYPES):
        return [f"failed to match all allowed schemas [json-pointer:{pointer}]"]
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return [f"must be a non-empty string [json-pointer:{pointer}/text]"]
    if len(text) > limit:
        return [f"must be less than {limit + 1} characters [json-pointer:{pointer}/text]"]
    return []


def _element_errors(element: Any, pointer: str) -> list[str]:
    if not isinstance(element, dict) or element.get("type") not in ELEMENT_TYPES:
        return [f"failed to match all allowed schemas [json-pointer:{pointer}]"]
    action_id = element.get("action_id")
    if action_id is not None and (not isinstance(action_id, str) or len(action_id) > 255):
        return [f"must be a string of at most 255 characters [json-pointer:{pointer}/action_id]"]
    if element["type"] == "button":
        return _text_object_errors(element.get("text"), f"{pointer}/text", limit=75, plain_only=True)
    return []


def _section_errors(block: dict[str, Any], pointer: str) -> list[str]:
    errors: list[str] = []
    if "text" not in block and "fields" not in block:
        errors.append(f"must provide either text or fields [json-pointer:{pointer}]")
    if "text" in block:
        errors += _text_object_errors(block["text"], f"{pointer}/text", limit=MAX_SECTION_TEXT)
    fields = block.get("fields")
    if fields is not None:
        if not isinstance(fields, list) or len(fields) > 10:
            errors.append(f"must be an array of at most 10 items [json-pointer:{pointer}/fields]")
        else:
            for i, item in enumerate(fields):
                errors += _text_object_errors(item, f"{pointer}/fields/{i}", limit=2000)
    if "accessory" in block:
        errors += _element_errors(block["accessory"], f"{pointer}/accessory")
    return errors


def _header_errors(block: dict[str, Any], pointer: str) -> list[str]:
    return _text_object_errors(block.get("text"), f"{pointer}/text", limit=MAX_HEADER_TEXT, plain_only=True)


def _actions_errors(block: dict[str, Any], pointer: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements or len(elements) > 25:
        return [f"must be an array of 1 to 25 items [json-pointer:{pointer}/elements]"]
    return [e for i, element in enumerate(elements) for e in _element_errors(element, f"{pointer}/elements/{i}")]


def _context_errors(block: dict[str, Any], pointer: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements or len(elements) > 10:
        return [f"must be an array of 1 to 10 items [json-pointer:{pointer}/elements]"]
    return [
        f"failed to match all allowed schemas [json-pointer:{pointer}/elements/{i}]"
        for i, element in enumerate(elements)
        if not isinstance(element, dict) or element.get("type") not in (*TEXT_TYPES, "image")
    ]


def _input_errors(block: dict[str, Any], pointer: str) -> list[str]:
    errors = _text_object_errors(block.get("label"), f"{pointer}/label", limit=2000, plain_only=True)
    return errors + _element_errors(block.get("element"), f"{pointer}/element")


def _image_errors(block: dict[str, Any], pointer: str) -> list[str]:
    if block.get("image_url") or block.get("slack_file"):
        return []
    return [f"must provide image_url or slack_file [json-pointer:{pointer}]"]


def _rich_text_errors(block: dict[str, Any], pointer: str) -> list[str]:
    if isinstance(block.get("elements"), list):
        return []
    return [f"must be an array [json-pointer:{pointer}/elements]"]


_BLOCK_CHECKS: dict[str, Callable[[dict[str, Any], str], list[str]]] = {
    "section": _section_errors,
    "header": _header_errors,
    "actions": _actions_errors,
    "context": _context_errors,
    "input": _input_errors,
    "image": _image_errors,
    "rich_text": _rich_text_errors,
}


def _block_errors(block: Any, pointer: str) -> list[str]:
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        return [f"failed to match all allowed schemas [json-pointer:{pointer}]"]
    errors: list[str] = []
    block_id = block.get("block_id")
    if block_id is not None and (not isinstance(block_id, str) or not block_id or len(block_id) > 255):
        errors.append(f"must be a string of 1 to 255 characters [json-pointer:{pointer}/block_id]")
    check = _BLOCK_CHECKS.get(block["type"])
    return errors + (check(block, pointer) if check else [])


def block_errors(blocks: Any, *, pointer: str = "/blocks", max_blocks: int = MAX_MESSAGE_BLOCKS) -> list[str]:
    """Basic Block Kit validation as Slack reports it: `<reason> [json-pointer:/blocks/N/...]` strings."""
    if not isinstance(blocks, list):
        return [f"must be an array [json-pointer:{pointer}]"]
    if len(blocks) > max_blocks:
        return [f"no more than {max_blocks} items allowed [json-pointer:{pointer}]"]
    errors: list[str] = []
    seen: set[str] = set()
    for i, block in enumerate(blocks):
        errors += _block_errors(block, f"{pointer}/{i}")
        block_id = block.get("block_id") if isinstance(block, dict) else None
        if isinstance(block_id, str):
            if block_id in seen:
                errors.append(f"duplicate block_id [json-pointer:{pointer}/{i}/block_id]")
            seen.add(block_id)
    return errors


def view_errors(view: Any) -> list[str]:
    """Validation of a modal/home view as views.open reports it (in `response_metadata.messages`)."""
    if not isinstance(view, dict):
        return ["must be an object [json-pointer:/view]"]
    errors: list[str] = []
    kind = view.get("type")
    if kind not in ("modal", "home"):
        errors.append("failed to match all allowed schemas [json-pointer:/view/type]")
    if kind == "modal":
        errors += _text_object_errors(view.get("title"), "/view/title", limit=MAX_VIEW_TITLE, plain_only=True)
    for key in ("submit", "close"):
        if view.get(key) is not None:
            errors += _text_object_errors(view[key], f"/view/{key}", limit=MAX_VIEW_TITLE, plain_only=True)
    errors += block_errors(view.get("blocks"), pointer="/view/blocks", max_blocks=MAX_VIEW_BLOCKS)
    raw_blocks = view.get("blocks")
    blocks: list[Any] = raw_blocks if isinstance(raw_blocks, list) else []
    has_input = any(isinstance(b, dict) and b.get("type") == "input" for b in blocks)
    if kind == "modal" and has_input and view.get("submit") is None:
        errors.append("must provide submit when view contains input blocks [json-pointer:/view/submit]")
    errors += _view_string_errors(view)
    return errors


def _view_string_errors(view: dict[str, Any]) -> list[str]:
    return [
        f"must be a string of at most {limit} characters [json-pointer:/view/{key}]"
        for key, limit in (("private_metadata", MAX_PRIVATE_METADATA), ("callback_id", 255), ("external_id", 255))
        if (value := view.get(key)) is not None and (not isinstance(value, str) or len(value) > limit)
    ]


def decorate(obj: Any) -> Any:
    """Slack's echo of your blocks: `emoji: true` on plain_text and `verbatim: false` on mrkdwn when absent."""
    if isinstance(obj, list):
        return [decorate(item) for item in obj]
    if isinstance(obj, dict):
        out = {key: decorate(value) for key, value in obj.items()}
        if out.get("type") == "plain_text" and "text" in out:
            out.setdefault("emoji", True)
        elif out.get("type") == "mrkdwn" and "text" in out:
            out.setdefault("verbatim", False)
        return out
    return obj


def echo_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks as Slack stores and returns them: decorated, each with a block_id."""
    echoed: list[dict[str, Any]] = decorate(blocks)
    for block in echoed:
        # Slack assigns a block_id to every block that has none.
        block.setdefault("block_id", secrets.token_urlsafe(4))
    return echoed


def rich_text(text: str) -> list[dict[str, Any]]:
    """The block Slack derives from a text-only post."""
    return [
        {
            "type": "rich_text",
            "block_id": secrets.token_urlsafe(4),
            "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}],
        }
    ]


def block_text(blocks: Iterable[Any]) -> str:
    """Every string inside the blocks, for `contains=` searches."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            out.append(node)

    walk(list(blocks))
    return "\n".join(out)
