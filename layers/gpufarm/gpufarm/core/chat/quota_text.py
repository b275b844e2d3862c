"""Parsing `/gpu quota request team=nlp +16 H100 env=onprem-hpc until 2027-01-31 reason="..."` into raw words.

Pure and cheap, as gpufarm.core.chat.command_text (the ingress answers syntax errors at once); the worker judges the
values against the farm (gpufarm.core.accounting.quota_requests).
"""

from __future__ import annotations

import re

from gpufarm.core.kernel.errors import ValidationFailed

USAGE = "/gpu quota request team=nlp +16 H100 env=onprem-hpc until 2027-01-31 reason=..."
# Keys of the quota change's words, and the value each one fills.
KEYS: dict[str, str] = {
    "team": "team",
    "env": "environment",
    "environment": "environment",
    "pool": "environment",
    "model": "gpu_model",
    "gpu": "gpu_model",
    "until": "until",
    "reason": "reason",
    "for": "reason",
}
_SIGNED = re.compile(r"^[+-][0-9]+$")


def parse_quota_request(words: list[str]) -> dict[str, str]:
    """`team=nlp +16 H100 env=... until 2027-01-31 reason=...`: the change's words by name, values raw.

    The change is the signed bare word, the model the other bare word; `until` takes the next word as its value.
    """
    args: dict[str, str] = {}
    rest = list(words)
    while rest:
        word = rest.pop(0)
        key, sep, value = word.partition("=")
        if not sep and key.lower() == "until" and rest:
            key, sep, value = "until", "=", rest.pop(0)
        if sep:
            name = KEYS.get(key.strip().lower())
            if name is None:
                raise ValidationFailed("text", f"unknown option '{_printable(key)}'; use {USAGE}")
            _put(args, name, value.strip())
        elif _SIGNED.match(word):
            _put(args, "delta", word)
        else:
            _put(args, "gpu_model", word.strip())
    if "delta" not in args:
        raise ValidationFailed("delta", f"say the change with its sign (+16 or -8); use {USAGE}")
    return args


def _put(args: dict[str, str], name: str, value: str) -> None:
    if name in args:
        raise ValidationFailed(name, f"{name.replace('_', ' ')} is given twice; use {USAGE}")
    args[name] = value


def _printable(text: str, limit: int = 40) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
