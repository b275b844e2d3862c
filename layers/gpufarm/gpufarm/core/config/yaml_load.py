"""The farm file's YAML loader: the safe subset, libyaml's when present, with every number bounded in length."""

from __future__ import annotations

import functools
from typing import Any

# The longest number a farm setting takes: every numeric key has a range (Field ge/le), the widest under a million.
# A longer one is refused by the loader itself, before int() spends time on it or Python's 4,300-digit bound
# turns it into a bare ValueError.
MAX_NUMBER_CHARS = 32


class NumberTooLong(Exception):
    """A YAML number longer than MAX_NUMBER_CHARS, with where it is."""

    def __init__(self, line: int, column: int, length: int) -> None:
        super().__init__(f"line {line}, column {column}: a number of {length:,} characters")
        self.where = f"line {line}, column {column}"
        self.length = length


@functools.cache
def bounded_loader() -> Any:
    """The safe YAML loader (libyaml's when present) whose integers and floats are bounded in length."""
    import yaml

    # libyaml's loader (in PyYAML's wheels) parses a farm file in ~1 ms against ~10 ms for the pure-Python one; each
    # cold start and each 5-minute re-read pays it. Same safe subset of YAML either way.
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def bounded(kind: str) -> Any:
        construct = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{kind}"]

        def build(loader: Any, node: Any) -> Any:
            if len(node.value) > MAX_NUMBER_CHARS:
                mark = node.start_mark
                raise NumberTooLong(mark.line + 1, mark.column + 1, len(node.value))
            return construct(loader, node)

        return build

    loader: Any = type("FarmLoader", (base,), {})
    for kind in ("int", "float"):
        loader.add_constructor(f"tag:yaml.org,2002:{kind}", bounded(kind))
    return loader
