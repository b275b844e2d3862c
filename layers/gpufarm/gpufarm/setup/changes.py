"""What `gpufarm datadog apply` does to one Datadog object: the action and the change that carries it (planned by
gpufarm.setup.plan and its monitor and dashboard parts, executed by gpufarm.setup.apply)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    """What apply does to one object."""

    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    DELETE = "delete"  # only with --prune: a gpufarm monitor or dashboard the farm no longer asks for
    BLOCKED = "blocked"  # cannot be applied as things stand; `detail` says what to do


@dataclass(frozen=True)
class Change:
    """One planned (or applied) change to one Datadog object. `body` never holds a secret value."""

    kind: str
    name: str
    action: Action
    detail: str = ""
    body: Mapping[str, Any] = field(default_factory=dict)
    target_id: str | None = None
    # What differs from what Datadog holds (updates): attribute names and choice changes, never values of secrets.
    differences: tuple[str, ...] = ()

    def line(self) -> str:
        """One line of the printed plan."""
        text = f"{self.action.value:<9} {self.kind} {self.name}"
        return f"{text}: {self.detail}" if self.detail else text

    def as_json(self) -> dict[str, Any]:
        """The change for `--json`: kind, name, action, differences and detail (never a body: no secret leaks)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "action": self.action.value,
            "differences": list(self.differences),
            "detail": self.detail,
            "id": self.target_id,
        }
