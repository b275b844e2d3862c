"""Lambda entry point; the logic lives in gpufarm.handlers.daily_digest (shipped in the layer)."""

from __future__ import annotations

from gpufarm.handlers.daily_digest import handle
from gpufarm.handlers.telemetry import instrument

# JSON logs with the Lambda context and correlation keys in Lambda; the handler itself everywhere else.
handler = instrument(handle)
