"""Common base of the sandbox's API modules."""

from __future__ import annotations

from typing import Any

from gpufarm_sandbox.emulator.context import SandboxContext
from gpufarm_sandbox.emulator.web import Route


class BaseModule:
    """Holds the shared context (clock, lock, faults, base URL); subclasses add routes and state."""

    name = "module"

    def __init__(self, context: SandboxContext) -> None:
        self.ctx = context

    def routes(self) -> list[Route]:
        """Endpoints this module serves."""
        return []

    def reset(self) -> None:
        """Forget everything."""

    def dump(self) -> dict[str, Any]:
        """State for `GET /_sandbox/state`."""
        return {}
