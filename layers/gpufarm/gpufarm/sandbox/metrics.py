"""Sandbox module: metrics (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class MetricsModule(BaseModule):
    """metrics API of the sandbox."""

    name = "metrics"
