"""What the parts of the local function host need of the host itself: the queues, the schedules and the in-process
hand-offs (`seams`) run functions through it, and read its clock, lock and template, without importing it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol

from gpufarm_sandbox.emulator.clock import Clock
from gpufarm_sandbox.localhost.env import Resolver, Urls
from gpufarm_sandbox.localhost.functions import LocalFunction
from gpufarm_sandbox.localhost.template import Template

# Event invokes (and schedules) run on the "async" pool, SQS deliveries on the "queue" pool (LocalHost).
Lane = Literal["async", "queue"]


class FunctionHost(Protocol):
    """The local host as its queues, schedules and seams see it (implemented by LocalHost)."""

    @property
    def lock(self) -> threading.RLock:
        """Guards the host's state and its queues'."""

    @property
    def closed(self) -> bool:
        """True once the host stopped accepting work."""

    @property
    def clock(self) -> Clock:
        """The sandbox clock the functions run on."""

    @property
    def urls(self) -> Urls:
        """The host's URLs (Function URLs, queues, invokes)."""

    @property
    def resolver(self) -> Resolver:
        """The template's names and ARNs as the local functions see them."""

    @property
    def template(self) -> Template:
        """The SAM template served."""

    @property
    def functions(self) -> dict[str, LocalFunction]:
        """The template's functions by logical id."""

    def start_task(self, target: Callable[..., None], *args: Any, lane: Lane = "async") -> None:
        """Run target(*args) on the lane's pool, counted until it ends; RuntimeError once closed."""

    def execute(self, fn: LocalFunction, event: Any, trigger: str) -> tuple[bool, Any]:
        """One invocation: (True, result) or (False, exception); always logged."""

    def run_async(self, fn: LocalFunction, event: Any, trigger: str) -> None:
        """An event invoke: retried MaximumRetryAttempts times (async only), then dead-lettered."""

    def dead_letter(self, source: str, target: str, error: str, payload: Any) -> None:
        """Record work that failed for good."""

    def accept_invoke(self, name: str, data: bytes) -> tuple[int, str, str] | None:
        """An async invoke as Lambda's Invoke API takes it: None once queued, else the refusal."""

    def accept_queue_message(self, queue_id: str, message: Any) -> tuple[int, dict[str, Any]]:
        """SendMessage of `{"body", "group", "dedup_id"}` to a queue: (200, answer) or (status, SQS's error)."""
