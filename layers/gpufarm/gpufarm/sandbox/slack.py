"""Sandbox module: slack (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class SlackModule(BaseModule):
    """slack API of the sandbox."""

    name = "slack"
