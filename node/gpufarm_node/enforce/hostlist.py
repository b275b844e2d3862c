"""Slurm host lists: `gpu[01-03,07],login1` expanded to names and names folded back (pure).

Slurm prints a reservation's nodes as a host list expression; the enforcer compares sets of names, so it expands
what it reads. What it writes is a plain comma-separated list, which every Slurm accepts.
"""

from __future__ import annotations

import re

MAX_HOSTS = 100_000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """A host list expression Slurm would not print (or one too large to expand)."""


def expand(expression: str) -> list[str]:
    """Every host a Slurm host list names, in order; HostlistError on a malformed or oversized one."""
    out: list[str] = []
    for part in _top_level(expression.strip()):
        if part:
            out.extend(_expand_one(part))
        if len(out) > MAX_HOSTS:
            raise HostlistError(f"a host list of more than {MAX_HOSTS} hosts")
    return out


def _top_level(expression: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expression):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expression[:60]!r}")
        elif ch == "," and depth == 0:
            parts.append(expression[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in {expression[:60]!r}")
    parts.append(expression[start:])
    return parts


def _expand_one(part: str) -> list[str]:
    """`rack[1-2]-n[01-02]` → rack1-n01, rack1-n02, rack2-n01, rack2-n02."""
    open_at = part.find("[")
    if open_at < 0:
        return [part]
    close_at = part.index("]", open_at)
    head, body, tail = part[:open_at], part[open_at + 1 : close_at], part[close_at + 1 :]
    rests = _expand_one(tail) if tail else [""]
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise HostlistError(f"{item[:20]!r} is not a number or a range in {part[:60]!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        low, high, width = int(first), int(last), len(first)
        if high < low or high - low > MAX_HOSTS:
            raise HostlistError(f"range {item[:20]!r} in {part[:60]!r}")
        for n in range(low, high + 1):
            out.extend(f"{head}{n:0{width}d}{rest}" for rest in rests)
            if len(out) > MAX_HOSTS:
                raise HostlistError(f"a host list of more than {MAX_HOSTS} hosts")
    return out
