"""The names runs are stored and tagged by: the one given (with -2, -3... past the first trace), else the file's stem.

Shared by the uploading client (which proposes them) and the upload function (which accepts only valid ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpufarm.core.kernel.errors import ValidationFailed
from gpufarm.profiling import metrics

MAX_TRACES = 16
NAME_RULE = "a run name is 1-63 of a-z, 0-9, '_', '.', '-' (starting with a letter or digit)"


def run_names(paths: Sequence[Path], name: str | None) -> list[str]:
    """One run name per trace: the name given (with -2, -3... past the first), else the file's stem."""
    if not paths:
        raise ValidationFailed("trace", "name at least one trace file")
    if len(paths) > MAX_TRACES:
        raise ValidationFailed("trace", f"at most {MAX_TRACES} traces per upload")
    if name is not None and not metrics.valid_run_name(name):
        raise ValidationFailed("name", NAME_RULE)
    out = []
    for i, path in enumerate(paths):
        base = name if name is not None else stem(path)
        out.append(base if i == 0 or name is None else f"{base[:58]}-{i + 1}")
    return out


def stem(path: Path) -> str:
    """A run name from a file's name: lower case, tag-safe, without .json and .gz."""
    text = path.name.lower().removesuffix(".gz").removesuffix(".json")
    return metrics.tag_value(text).replace(":", "_").replace("/", "_")[:63].strip("_.-") or "run"
