"""Integration fixtures: the local function host and a ready farm driver on it (modules may define their own)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from local_farm import driven

from gpufarm.config import Settings
from gpufarm_sandbox.demo.context import DemoContext
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
    with driven(local) as driver:
        yield driver


StageRun = Callable[[ModuleType], str]


@pytest.fixture
def run_stage(local: LocalEnv, farm: LocalFarm) -> StageRun:
    """run(stage_module): one demo stage on the local host (the ready farm under it); its printed output, once no
    step of it failed."""

    def run(stage: ModuleType) -> str:
        lines: list[str] = []
        ctx = DemoContext(sandbox=local.sandbox, base_url=local.url, settings=Settings(), out=lines.append, local=local)
        stage.run(ctx)
        output = "\n".join(lines)
        assert ctx.failures == [], output
        return output

    return run
