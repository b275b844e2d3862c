"""The hardening suite's local host: one `gpufarm local` with the workspace, hosts and `datadog apply` per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from attack import Target, ready_farm

from gpufarm.handlers import runtime
from gpufarm_sandbox.localhost import start_local


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    """A started local host and its ready farm, closed and the runtime forgotten after the module."""
    with start_local(port=0) as local:
        farm = ready_farm(local)
        try:
            yield Target(local, farm)
        finally:
            farm.close()
            runtime.reset()
