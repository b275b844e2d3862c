"""datadog-api-client's models as the sandbox's validator: bodies are checked by deserializing them the way the
client itself would (docs/datadog.md, "Validating JSON with the client's own models")."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def offline_client() -> Any:
    """One offline ApiClient, used only to deserialize (it never sends a request)."""
    from datadog_api_client import ApiClient, Configuration

    # datadog-api-client's Configuration.__init__ carries no annotations.
    return ApiClient(Configuration())  # type: ignore[no-untyped-call]
