"""The local function host: template.yaml's functions served in-process against the sandbox (`gpufarm local`).

Its names are imported on first use: the package also holds the seams every `gpufarm report` of a development
install loads (gpufarm_sandbox.localhost.seams), which need none of the host's server.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufarm_sandbox.localhost.host import LocalHost
    from gpufarm_sandbox.localhost.start import LocalEnv, start_local

__all__ = ["LocalEnv", "LocalHost", "start_local"]
_HOMES = {"LocalHost": "host", "LocalEnv": "start", "start_local": "start"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
