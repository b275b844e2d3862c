"""What each demo stage gets: the running local environment, settings, and step/check reporting."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufarm.config import Settings

if TYPE_CHECKING:
    from gpufarm_sandbox.emulator.app import Sandbox


@dataclass
class DemoContext:
    """Shared by the demo stages; a failed check is recorded and the demo exits non-zero at the end."""

    sandbox: Sandbox
    base_url: str
    settings: Settings
    out: Callable[[str], None] = print
    # Set by the runner when the local function host is running (stages that drive Slack need it).
    local: Any = None
    failures: list[str] = field(default_factory=list)
    checks: int = 0
    # Stages hand facts to later stages here (e.g. the IRs they allocated).
    shared: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        """Print a step heading; an exception inside fails the step instead of aborting the demo."""
        self.out(f"\n== {title}")
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - a demo step failing must not hide the steps after it
            self.check(False, f"{title} raised {type(exc).__name__}", str(exc))

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        """Record and print one verified fact."""
        self.checks += 1
        mark = "ok " if ok else "FAIL"
        self.out(f"   [{mark}] {what}" + (f": {detail}" if detail else ""))
        if not ok:
            self.failures.append(what + (f" ({detail})" if detail else ""))
        return ok

    def info(self, text: str) -> None:
        """Print a line of narration."""
        self.out(f"   {text}")
