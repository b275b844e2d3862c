"""What an incident-driven step did, for logs, tests and the sync summary."""

from __future__ import annotations

from dataclasses import dataclass

from gpufarm.core.kernel.ir import format_ir


@dataclass(frozen=True)
class Outcome:
    """What an incident-driven step did: the IR, a short action (`allocated`, `waiting`, `nothing to do (...)`)."""

    ir: int
    action: str
    hosts: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{format_ir(self.ir)}: {self.action}" + (f" ({', '.join(self.hosts)})" if self.hosts else "")
