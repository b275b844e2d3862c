"""Sandbox module: dashboards (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class DashboardsModule(BaseModule):
    """dashboards API of the sandbox."""

    name = "dashboards"
