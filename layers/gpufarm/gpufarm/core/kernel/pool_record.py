"""What every reader of a pool's incidents asks of one, whichever record it holds: the lifecycle's `Allocation`
(gpufarm.core.kernel.model) or a report's light `LeaseFacts` (gpufarm.core.kernel.lease_facts). The calendar, the
quota changes and the outlook extend it with the few fields they read besides."""

from __future__ import annotations

from typing import Protocol

from gpufarm.core.kernel.lifecycle import Phase, State


class PoolRecord(Protocol):
    """An incident of a pool: whose, where, which model, and where it stands."""

    @property
    def ir(self) -> int: ...
    @property
    def state(self) -> State: ...
    @property
    def phase(self) -> Phase: ...
    @property
    def team(self) -> str | None: ...
    @property
    def environment(self) -> str | None: ...
    @property
    def gpu_model(self) -> str | None: ...
