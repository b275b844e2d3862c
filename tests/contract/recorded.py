"""Recorded real Datadog traffic (copied into tests/fixtures/datadog) and shape comparison against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "datadog"


def interactions(file: str, scenario: str) -> list[dict[str, Any]]:
    """The request/response pairs of one recorded scenario."""
    data = json.loads((FIXTURES / file).read_text())
    for rec in data["recordings"]:
        if rec["scenario"] == scenario:
            return list(rec["interactions"])
    raise KeyError(f"no scenario {scenario!r} in {file}")


def response_json(interaction: dict[str, Any]) -> Any:
    """Decoded JSON body of a recorded response (None when empty)."""
    body = interaction["response"].get("body") or {}
    value = body.get("value") if isinstance(body, dict) else body
    if not value:
        return None
    return json.loads(value) if isinstance(value, str) else value


def recorded(file: str, scenario: str, index: int) -> tuple[int, Any]:
    """Status and JSON body of one recorded answer."""
    interaction = interactions(file, scenario)[index]
    return interaction["response"]["status"], response_json(interaction)


def recorded_request(file: str, scenario: str, index: int) -> dict[str, Any]:
    """The JSON body of one recorded request."""
    body = interactions(file, scenario)[index]["request"]["body"]["value"]
    return dict(json.loads(body) if isinstance(body, str) else body)


def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key path in a JSON document; list items are merged under `[]`."""
    paths: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            paths |= key_paths(value, path)
    elif isinstance(obj, list):
        for item in obj:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


def missing_keys(actual: Any, recorded: Any, *, ignore: tuple[str, ...] = ()) -> set[str]:
    """Key paths the recorded answer has and ours lacks (ignoring paths under any `ignore` prefix)."""
    missing = key_paths(recorded) - key_paths(actual)
    return {p for p in missing if not any(p == i or p.startswith((i + ".", i + "[")) for i in ignore)}
