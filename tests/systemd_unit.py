"""A systemd unit file read as sections of keys, each key with its values in order (for the deploy tests)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """`path`'s sections by name, each a map of key to its values; a malformed line fails the test."""
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep, f"malformed unit line: {raw!r}"
        sections[current][key].append(value)
    return sections
