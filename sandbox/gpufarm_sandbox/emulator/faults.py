"""Fault injection: answer a share of matching requests with 429/5xx, or slow them down."""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

ALLOWED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class FaultSpec(BaseModel):
    """Body of `POST /_sandbox/faults`."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(default=0.0, ge=0.0, le=1.0)
    statuses: list[int] = Field(default_factory=lambda: [500])
    paths: str = ".*"
    seed: int | None = None
    latency_ms: int = Field(default=0, ge=0, le=60_000)
    # Stop after this many injected faults (None: no limit), so tests can ask for "fail the next N".
    max_faults: int | None = Field(default=None, ge=0)
    # Share of the injected 5xx answered after the request was served: the change is made, its answer lost (a 5xx
    # after the write), so a caller that retries the whole step must not apply it twice. A 429 never serves first.
    after: float = Field(default=0.0, ge=0.0, le=1.0)

    @field_validator("statuses")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        if not value or any(s not in ALLOWED_STATUSES for s in value):
            raise ValueError(f"statuses must be a non-empty subset of {sorted(ALLOWED_STATUSES)}")
        return value

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"paths is not a valid regular expression: {exc}") from None
        return value


@dataclass
class FaultInjector:
    """Decides, per request, whether to inject a fault; thread-safe and seeded for repeatable runs."""

    spec: FaultSpec = field(default_factory=FaultSpec)
    injected: int = 0
    _rng: random.Random = field(default_factory=random.Random)
    _pattern: re.Pattern[str] = field(default_factory=lambda: re.compile(".*"))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def configure(self, spec: FaultSpec) -> None:
        """Replace the fault plan."""
        with self._lock:
            self.spec = spec
            self.injected = 0
            self._rng = random.Random(spec.seed)
            self._pattern = re.compile(spec.paths)

    def clear(self) -> None:
        """No more faults."""
        self.configure(FaultSpec())

    def latency_s(self, path: str) -> float:
        """Delay to add to a matching request."""
        if self.spec.latency_ms and self._pattern.search(path):
            return self.spec.latency_ms / 1000
        return 0.0

    def pick(self, path: str) -> int | None:
        """The status to answer instead, or None to serve the request normally."""
        spec = self.spec
        if spec.rate <= 0 or not self._pattern.search(path):
            return None
        with self._lock:
            if spec.max_faults is not None and self.injected >= spec.max_faults:
                return None
            if self._rng.random() >= spec.rate:
                return None
            self.injected += 1
            return self._rng.choice(spec.statuses)

    def served_first(self, status: int) -> bool:
        """For a fault just picked: True when the request is to be served before the fault is answered."""
        spec = self.spec
        if spec.after <= 0 or status < 500:
            return False
        with self._lock:
            return self._rng.random() < spec.after

    def dump(self) -> dict[str, Any]:
        """Current plan and how many faults were injected."""
        return {**self.spec.model_dump(), "injected": self.injected}
