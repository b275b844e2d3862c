"""The scratch objects doctor makes (a probe incident, a tag on a host) and their removal, whatever happens.

Each is registered before it is made, with the function that removes it, and removed when the check that made it
ends: normally, on a failure, on Ctrl-C or SIGTERM (the command turns SIGTERM into KeyboardInterrupt). A removal
that fails does not hide the check's own outcome: it is kept as a `cleanup` line naming what was left behind, so
the operator can remove it by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpufarm.setup.doctor.report import Line, Status

log = logging.getLogger(__name__)

CLEANUP = "cleanup"


class Scratch:
    """Removes what doctor made; `left` holds a line for each object it could not remove."""

    def __init__(self) -> None:
        self.left: list[Line] = []
        self._pending: list[tuple[str, Callable[[], None]]] = []

    @contextmanager
    def kept(self, what: str, remove: Callable[[], None]) -> Iterator[None]:
        """Run a block that makes `what`; `remove` runs when the block ends, however it ends.

        `remove` must do nothing when the object was never made (the block may stop before making it).
        """
        entry = (what, remove)
        self._pending.append(entry)
        try:
            yield
        finally:
            self._pending.remove(entry)
            self._remove(what, remove)

    def clean(self) -> None:
        """Remove whatever is still registered (a check stopped without leaving its block)."""
        while self._pending:
            what, remove = self._pending.pop()
            self._remove(what, remove)

    def _remove(self, what: str, remove: Callable[[], None]) -> None:
        try:
            remove()
        except Exception as exc:  # noqa: BLE001 - any failure to remove is reported, never raised over the check's own
            log.warning("could not remove %s: %s", what, exc)
            self.left.append(Line(CLEANUP, Status.BROKEN, f"could not remove {what} ({exc}); remove it by hand"))
