"""Domain exceptions; the edges map them to Slack answers and HTTP statuses."""

from __future__ import annotations


class GpufarmError(Exception):
    """Base of every error the core raises on purpose."""


class ValidationFailed(GpufarmError):
    """Input broke a rule; `field` names what was wrong so a modal can show it in place."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class NotAllowed(GpufarmError):
    """The caller lacks the authority for this action."""


class NotFound(GpufarmError):
    """The thing asked for does not exist (an unknown IR, host or monitor)."""


class Conflict(GpufarmError):
    """The action does not fit the current state (e.g. extending a reclaimed allocation)."""


class InvalidTransition(Conflict):
    """The lifecycle forbids moving from one phase to another."""


class UpstreamError(GpufarmError):
    """Datadog, Slack or AWS failed after bounded retries; nothing was left half-done."""
