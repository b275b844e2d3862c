"""Sandbox module: incidents (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class IncidentsModule(BaseModule):
    """incidents API of the sandbox."""

    name = "incidents"
