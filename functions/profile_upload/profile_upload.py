"""Lambda entry point; the logic lives in gpufarm.handlers.profile_upload (shipped in the layer)."""

from __future__ import annotations

from gpufarm.handlers.profile_upload import handle
from gpufarm.handlers.telemetry import instrument

# JSON logs with the Lambda context and correlation keys in Lambda; the handler itself everywhere else.
handler = instrument(handle)
