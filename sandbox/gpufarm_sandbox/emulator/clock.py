"""The sandbox clock: real time plus an offset that tests and demos advance at will."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

Listener = Callable[[float], None]


class Clock:
    """Virtual time; everything in the sandbox that reads time reads it here."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def now(self) -> float:
        """Virtual epoch seconds."""
        return time.time() + self._offset

    def now_ms(self) -> int:
        """Virtual epoch milliseconds."""
        return int(self.now() * 1000)

    def now_dt(self) -> datetime:
        """Virtual time as an aware datetime."""
        return datetime.fromtimestamp(self.now(), UTC)

    def advance(self, seconds: float) -> float:
        """Move virtual time forward and tell listeners (monitor evaluation, schedules); returns the new now."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        with self._lock:
            self._offset += seconds
        now = self.now()
        for listener in list(self._listeners):
            listener(now)
        return now

    def subscribe(self, listener: Listener) -> None:
        """Call listener(now) after every advance."""
        self._listeners.append(listener)

    def reset(self) -> None:
        """Back to real time."""
        with self._lock:
            self._offset = 0.0

    @property
    def offset(self) -> float:
        """Seconds virtual time runs ahead of real time."""
        return self._offset
