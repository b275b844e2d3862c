"""Integration fixtures: the local function host and a ready farm driver on it (modules may define their own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufarm.handlers import runtime
from gpufarm_sandbox.demo.lifecycle_stage import LocalFarm
from gpufarm_sandbox.localhost import LocalEnv, start_local


@pytest.fixture(scope="module")
def local() -> Iterator[LocalEnv]:
    """The local host on a free port, one per test module (starting it is the slow part)."""
    with start_local(port=0) as env:
        yield env


@pytest.fixture
def farm(local: LocalEnv) -> Iterator[LocalFarm]:
    """A farm driver on the local host; its work settled and the runtime's collaborators reset after each test."""
    driver = LocalFarm.ready(local)
    yield driver
    driver.settle(timeout=10)
    driver.close()
    runtime.reset()
