"""Lambda entry point; the logic lives in gpufarm.handlers.slack_ingress (shipped in the layer)."""

from __future__ import annotations

from typing import Any

from gpufarm.handlers.slack_ingress import handle


def handler(event: Any, context: Any) -> Any:
    """Lambda handler."""
    return handle(event, context)
