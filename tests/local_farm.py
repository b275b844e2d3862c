"""A farm driver on the local function host, optionally running a farm file of the test's own (a modified copy of
config/farm.example.yaml): its work settled and the runtime's collaborators reset when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpufarm.handlers import runtime
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import LocalEnv

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_FARM = ROOT / "config" / "farm.example.yaml"


@contextmanager
def driven(local: LocalEnv, farm_file: Path | None = None) -> Iterator[LocalFarm]:
    """The ready driver; with `farm_file`, every function reads that farm file (GPUFARM_FARM_CONFIG) instead.

    The variable is set and put back here, inside the local host's lifetime: a caller's monkeypatch would put it
    back after the host had restored os.environ, and leave the host's farm path behind for later tests.
    """
    with pytest.MonkeyPatch.context() as patch:
        if farm_file is not None:
            patch.setenv("GPUFARM_FARM_CONFIG", str(farm_file))
            runtime.reset()
        driver = LocalFarm.ready(local)
        try:
            yield driver
        finally:
            driver.settle(timeout=10)
            driver.close()
            runtime.reset()


def without_inventory(text: str) -> str:
    """The farm file's text without its inventory sources (for tests about the metrics, not the clouds)."""
    start, end = text.index("\ninventory:"), text.index("\ndefaults:")
    return text[:start] + text[end:]
