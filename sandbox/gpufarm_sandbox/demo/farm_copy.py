"""A stage's own farm file: the local functions read a changed copy of theirs while the stage runs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml


@contextmanager
def changed_farm(change: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """The local functions read a copy of the farm file `GPUFARM_FARM_CONFIG` names, `change`d (the original is
    read again afterwards); without a farm file, nothing changes."""
    path = os.environ.get("GPUFARM_FARM_CONFIG")
    if not path:
        yield
        return
    farm = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    change(farm)
    with tempfile.TemporaryDirectory(prefix="gpufarm-demo-") as folder:
        copy = Path(folder) / "farm.yaml"
        copy.write_text(yaml.safe_dump(farm, sort_keys=False), encoding="utf-8")
        os.environ["GPUFARM_FARM_CONFIG"] = str(copy)
        try:
            yield
        finally:
            os.environ["GPUFARM_FARM_CONFIG"] = path
