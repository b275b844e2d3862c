"""The farm configuration's error, in a module of its own so that a command catching it loads no farm model."""

from __future__ import annotations

from gpufarm.core.kernel.errors import GpufarmError


class FarmConfigError(GpufarmError):
    """The farm configuration is missing or invalid; the message says where."""
