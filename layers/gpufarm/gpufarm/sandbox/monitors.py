"""Sandbox module: monitors (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class MonitorsModule(BaseModule):
    """monitors API of the sandbox."""

    name = "monitors"
