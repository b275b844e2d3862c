"""What a monitor says when a group changes state: its message and name templates rendered as Datadog renders them
(`{{#is_alert}}..{{/is_alert}}`, `{{value}}`, `{{ir.name}}`), the `@webhook-<name>` handles they mention, and the
status line of `$ALERT_STATUS`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpufarm_sandbox.emulator.monitor_state import ALERT, WARN
from gpufarm_sandbox.emulator.monitor_validation import MonitorQuery, fmt
from gpufarm_sandbox.emulator.query import scope_for

_WEBHOOK_MENTION = re.compile(r"@webhook-([A-Za-z0-9_\-.]+)")


_TEMPLATE_TAG = re.compile(r"\{\{\s*([#^/]?)\s*([^{}]*?)\s*\}\}")


def render_template(text: str, flags: Mapping[str, bool], variables: Mapping[str, str]) -> str:
    """Render a monitor message: `{{#cond}}..{{/cond}}`, `{{^cond}}..{{/cond}}`, `{{var}}`, `{{#is_match ...}}`."""
    out: list[str] = []
    stack: list[tuple[str, bool]] = []
    pos = 0
    for m in _TEMPLATE_TAG.finditer(text):
        active = all(on for _, on in stack)
        if active:
            out.append(text[pos : m.start()])
        pos = m.end()
        sigil, body = m.group(1), m.group(2)
        words = [a or b for a, b in re.findall(r'"([^"]*)"|(\S+)', body)]
        name = words[0] if words else ""
        if sigil in {"#", "^"}:
            on = _condition(name, words[1:], flags, variables)
            stack.append((name, on if sigil == "#" else not on))
        elif sigil == "/":
            if stack and stack[-1][0] == name:
                stack.pop()
        elif active:
            out.append(variables.get(body.strip(), ""))
    if all(on for _, on in stack):
        out.append(text[pos:])
    return "".join(out)


def _condition(name: str, args: list[str], flags: Mapping[str, bool], variables: Mapping[str, str]) -> bool:
    if name in {"is_match", "is_exact_match"} and len(args) >= 2:
        value = variables.get(args[0], "")
        if name == "is_match":
            return any(a.lower() in value.lower() for a in args[1:])
        return value in args[1:]
    return bool(flags.get(name, False))


def webhook_mentions(message: str) -> list[str]:
    """`@webhook-<name>` handles in a rendered message, in order, without duplicates."""
    return list(dict.fromkeys(m.rstrip(".-") for m in _WEBHOOK_MENTION.findall(message)))


def template_variables(
    key: tuple[str, ...], value: float | None, thresholds: Mapping[str, Any], parsed: MonitorQuery
) -> dict[str, str]:
    variables = {
        "value": fmt(value),
        "threshold": fmt(thresholds.get("critical", parsed.threshold)),
        "warn_threshold": fmt(thresholds.get("warning")),
        "comparator": parsed.op,
    }
    for tag in key:
        k, _, v = tag.partition(":")
        variables[f"{k}.name"] = v
    return variables


def status_line(parsed: MonitorQuery, scope: str, status: str) -> str:
    upward = parsed.op in {">", ">="}
    how = {
        "avg": "on average",
        "sum": "in total",
        "max": "at least once" if upward else "at all times",
        "min": "at all times" if upward else "at least once",
    }[parsed.time_agg]
    where = scope_for(parsed.metric.scope, scope.split(",") if scope else [])
    verb = "was" if status in {ALERT, WARN} else "was not"
    return f"{parsed.metric.metric} over {where} {verb} {parsed.op} {fmt(parsed.threshold)} {how} during the last {parsed.window_text}."  # noqa: E501
