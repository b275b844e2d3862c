"""What every API module of the sandbox shares: the clock, the one lock, the fault plan, the Datadog quirks it plays
and where it is served."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpufarm_sandbox.emulator.clock import Clock
from gpufarm_sandbox.emulator.faults import FaultInjector


@dataclass
class SandboxContext:
    """Handed to each module by the Sandbox that composes them; modules reach their siblings only as passed in."""

    # Where the sandbox is served (links in messages, upload URLs); set again once a server's port is known.
    base_url: str
    # Signs the slash commands and clicks the sandbox sends to the app on a simulated user's behalf.
    slack_signing_secret: str
    clock: Clock = field(default_factory=Clock)
    faults: FaultInjector = field(default_factory=FaultInjector)
    # One lock for all state: the sandbox favours being obviously right over being fast under contention.
    lock: threading.RLock = field(default_factory=threading.RLock)
    # The Datadog quirk modes this sandbox plays (emulator.quirks): fixed when the sandbox is made.
    quirks: frozenset[str] = frozenset()
