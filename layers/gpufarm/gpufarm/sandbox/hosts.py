"""Sandbox module: hosts (being built)."""

from __future__ import annotations

from gpufarm.sandbox.base import BaseModule


class HostsModule(BaseModule):
    """hosts API of the sandbox."""

    name = "hosts"
