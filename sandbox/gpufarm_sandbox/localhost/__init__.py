"""The local function host: template.yaml's functions served in-process against the sandbox (`gpufarm local`)."""

from gpufarm_sandbox.localhost.host import LocalHost
from gpufarm_sandbox.localhost.start import LocalEnv, start_local

__all__ = ["LocalEnv", "LocalHost", "start_local"]
