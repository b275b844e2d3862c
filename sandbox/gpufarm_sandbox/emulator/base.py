"""Common base of the sandbox's API modules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufarm_sandbox.emulator.web import Route

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox


class BaseModule:
    """Holds the sandbox (clock, lock, sibling modules); subclasses add routes and state."""

    name = "module"

    def __init__(self, sandbox: Sandbox) -> None:
        self.sb = sandbox

    def routes(self) -> list[Route]:
        """Endpoints this module serves."""
        return []

    def reset(self) -> None:
        """Forget everything."""

    def dump(self) -> dict[str, Any]:
        """State for `GET /_sandbox/state`."""
        return {}
